//! Standing grants: the owner of a [`Pool`](crate::Pool) lets one remote
//! worker read or write its blocks by index, one-sidedly (no round trip
//! through the owner per transfer), until it revokes: [`Grant`] on the
//! owner's side ([`Connector::grant`](crate::Connector::grant)),
//! [`RemoteGrant`] on the holder's
//! ([`Connector::open_grant`](crate::Connector::open_grant)).
//!
//! This slice has the same-host lane: cross-memory attach, the holder
//! copying with `process_vm_readv`/`process_vm_writev` at the addresses
//! the grant carries, fenced through a shared control page (see
//! `docs/grants.md` and `docs/security.md`); and for device memory, CUDA
//! IPC (`ipc`): the allocation's handle opened once, device-to-device
//! copies inside the same fence.

use std::time::Duration;

pub use ferry_proto::grant::{
    BlockRange, BlockRef, CmaGrant, CudaIpcGrant, GrantError, GrantId, GrantMetadata, Rights,
    TcpGrant, UcxGrant, MAX_NOTIFICATION, MAX_TCP_CHUNK,
};
pub use ferry_proto::grant::{OfferId, OfferMetadata};

mod control;
mod copy;
mod fence;
mod holder;
mod ipc;
mod offer;
mod owner;
mod remote_tcp;
mod ring;
mod served;
mod sys;
mod ucx;

pub(crate) use holder::open as open_grant;
pub use holder::{RemoteGrant, INLINE_MAX};
pub(crate) use offer::{create as create_offer, OfferTable};
pub use offer::{Offer, OfferOptions, DEFAULT_MAX_HOLDERS};
pub use owner::Grant;
pub(crate) use served::create as create_grant;
pub(crate) use served::GrantTable;

/// Which lane a holder opens a grant by
/// ([`Connector::open_grant_via`](crate::Connector::open_grant_via)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GrantLane {
    /// Cross-memory attach where it reaches the owner (same host, the
    /// control page opens), else UCX where the grant offers it, else TCP.
    #[default]
    Any,
    /// Cross-memory attach only.
    Cma,
    /// TCP only: each operation is one request served in the owner's
    /// runtime (tests, benches, or a holder that must not attach).
    Tcp,
    /// UCX only: gets and puts with the grant's remote keys (the grant
    /// must offer it, `GrantOptions::ucx`).
    Ucx,
}

/// How a grant is made: what it allows, to whom, for how long, and how its
/// owner learns of notifications.
///
/// ```
/// use std::time::Duration;
/// use ferry::grant::{GrantOptions, Rights};
/// let opts = GrantOptions::new(Rights::READ_WRITE)
///     .holder("decode-0")
///     .expires_after(Duration::from_secs(600))
///     .spin(Duration::from_micros(50));
/// assert_eq!(opts.rights(), Rights::READ_WRITE);
/// ```
#[derive(Debug, Clone)]
pub struct GrantOptions {
    pub(crate) rights: Rights,
    pub(crate) holder: Option<String>,
    pub(crate) bearer: bool,
    pub(crate) expires_after: Option<Duration>,
    pub(crate) spin: Option<Duration>,
    pub(crate) revoke_deadline: Duration,
    pub(crate) tcp: bool,
    pub(crate) ucx: Option<bool>,
    pub(crate) cma: bool,
}

impl GrantOptions {
    /// A grant of `rights`; name its holder ([`holder`](Self::holder)) or
    /// make it a bearer grant ([`bearer`](Self::bearer)).
    pub fn new(rights: Rights) -> GrantOptions {
        GrantOptions {
            rights,
            holder: None,
            bearer: false,
            expires_after: None,
            spin: None,
            revoke_deadline: crate::DEFAULT_LIVENESS,
            tcp: true,
            ucx: None,
            cma: true,
        }
    }

    /// A READ grant ([`new`](Self::new)).
    pub fn read() -> GrantOptions {
        Self::new(Rights::READ)
    }

    /// A WRITE grant.
    pub fn write() -> GrantOptions {
        Self::new(Rights::WRITE)
    }

    /// A READ and WRITE grant.
    pub fn read_write() -> GrantOptions {
        Self::new(Rights::READ_WRITE)
    }

    /// Binds the grant to the worker with this id: only a connector with
    /// that worker id opens it.
    pub fn holder(mut self, worker_id: impl Into<String>) -> GrantOptions {
        self.holder = Some(worker_id.into());
        self.bearer = false;
        self
    }

    /// Makes the grant a bearer grant: whoever holds its metadata opens it
    /// (one holder process at a time).
    pub fn bearer(mut self) -> GrantOptions {
        self.holder = None;
        self.bearer = true;
        self
    }

    /// Ends the grant by itself after `d` (the holder refuses to use it
    /// past its expiry, and the owner revokes it then).
    pub fn expires_after(mut self, d: Duration) -> GrantOptions {
        self.expires_after = Some(d);
        self
    }

    /// Low-latency notifications: a caller of
    /// [`Grant::next_notification`] that finds none queued spins on the
    /// notification ring for `d` before it parks (it burns a core for up to
    /// `d` per wait, and takes a notification that comes meanwhile with no
    /// thread between it and the holder). Default: parks at once (no CPU
    /// while idle).
    pub fn spin(mut self, d: Duration) -> GrantOptions {
        self.spin = Some(d);
        self
    }

    /// How long [`Grant::revoke`] and [`Grant::retire`] wait for an
    /// operation in flight of a live holder before they give up
    /// ([`GrantError::Stalled`]). Default
    /// [`DEFAULT_LIVENESS`](crate::DEFAULT_LIVENESS) (1.5 s).
    pub fn revoke_deadline(mut self, d: Duration) -> GrantOptions {
        self.revoke_deadline = d;
        self
    }

    /// Whether the grant offers its TCP lane (default: yes): a holder on
    /// another host, or one that cannot attach to this process, sends
    /// each operation to this connector, which checks and serves it in
    /// its runtime. Without it, only same-host holders that may attach
    /// reach the grant.
    pub fn tcp(mut self, offered: bool) -> GrantOptions {
        self.tcp = offered;
        self
    }

    /// Offers the UCX lane too (`true`), on a UCX worker and registrations
    /// of the grant's own (`docs/grants.md`, "UCX"), also where UCX has no
    /// RDMA transport and emulates gets and puts by messages this process
    /// answers (UCX over TCP); the grant is refused if UCX cannot start.
    /// Default: no UCX lane.
    pub fn ucx(mut self, on: bool) -> GrantOptions {
        self.ucx = Some(on);
        self
    }

    /// Offers the cross-memory attach lane (default `true`); `false` with
    /// [`ucx`](Self::ucx)`(true)` makes a same-host holder use UCX.
    pub fn cma(mut self, on: bool) -> GrantOptions {
        self.cma = on;
        self
    }

    /// The rights it grants.
    pub fn rights(&self) -> Rights {
        self.rights
    }
}

/// What the holder did: read or wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationKind {
    /// The holder read blocks.
    Read,
    /// The holder wrote blocks (they hold its bytes now).
    Write,
    /// A notification with no bytes moved
    /// ([`RemoteGrant::notify`]: NIXL's `send_notif`); its first block
    /// and block count are 0.
    Message,
}

/// What a grant's owner learns of a holder's operation that asked for a
/// notification ([`RemoteGrant::write_blocks`] with a payload), in the
/// order the holder's operations completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The holder's sequence number for it (1, 2, 3...).
    pub seq: u64,
    /// What the holder did.
    pub kind: NotificationKind,
    /// The first block the operation named.
    pub first_block: u32,
    /// How many blocks it named.
    pub block_count: u32,
    /// The holder's payload (at most [`MAX_NOTIFICATION`] bytes).
    pub payload: Vec<u8>,
    /// The worker whose operation it is: the grant's bound holder (for a
    /// grant made from an [`Offer`], the worker that claimed it); `None`
    /// for a bearer grant.
    pub holder: Option<String>,
}

/// Unix time in milliseconds.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The hash of a grant's token that its control page keeps.
pub(crate) fn token_hash(t: &ferry_proto::Token) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"ferry-grant-token-v1\0");
    h.update(t.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests;

/// `docs/grants.md`'s example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/grants.md")]
struct GrantsDoctests;
