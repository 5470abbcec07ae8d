//! The owner's side of grants served over TCP: the table of this
//! connector's live grants, and the serving of one holder request in the
//! owner's runtime (its application does nothing per request).
//!
//! Each request is checked in full by the owner
//! ([`ferry_proto::grant::serve::check`]: token, holder binding against
//! the connection's peer, expiry, rights, range), then enters the grant's
//! fence like a cross-memory attach holder's operation does, where the
//! revocation and the generations are checked and the bytes copied; a
//! WRITE's notification is pushed into the grant's ring before it leaves.
//! So `revoke` and `retire` wait for a TCP request exactly as for a cma
//! holder, and nothing of it is cooperative: the holder never touches the
//! memory.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ferry_proto::grant::serve::{self, Served, Spans};
use ferry_proto::grant::{check, GrantError};
use ferry_proto::wire::{GrantAnswer, GrantReply, GrantRequest};
use ferry_proto::{OperationKind, Token};

use std::net::SocketAddr;

use super::owner::{Grant, Owned};
use super::GrantOptions;
use super::{fence, ring, sys, Notification, NotificationKind};
use crate::{Pool, Result};

/// How long a TCP WRITE's notification waits for room in the owner's ring
/// (the owner not reading its notifications), in the owner's runtime.
const RING_PATIENCE: Duration = Duration::from_millis(100);

/// Past this many entries, the table forgets the grants that are gone.
const PRUNE_AT: usize = 1024;

/// This connector's grants, by id, for the requests of holders over TCP.
#[derive(Default)]
pub(crate) struct GrantTable {
    map: Mutex<HashMap<u64, Entry>>,
}

struct Entry {
    token: Token,
    grant: Weak<Owned>,
}

/// Makes a grant over `pool` (see [`Connector::grant`](crate::Connector::grant));
/// `serving`: the connector's table and the addresses the grant's TCP
/// lane is served at (`None`: no TCP lane).
pub(crate) fn create(
    owner: &str,
    host_id: &str,
    pool: &Pool,
    opts: GrantOptions,
    serving: Option<(&GrantTable, Vec<SocketAddr>)>,
) -> Result<Grant> {
    let (table, addrs) = match serving {
        Some((t, a)) => (Some(t), Some(a)),
        None => (None, None),
    };
    let g = super::owner::create(owner, host_id, pool, opts, addrs)?;
    if let (Some(table), true) = (table, g.metadata().tcp.is_some()) {
        table.insert(g.id().0, g.metadata().token, g.owned());
    }
    Ok(g)
}

impl GrantTable {
    fn insert(&self, id: u64, token: Token, grant: &Arc<Owned>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= PRUNE_AT {
            map.retain(|_, e| e.grant.strong_count() > 0);
        }
        map.insert(
            id,
            Entry {
                token,
                grant: Arc::downgrade(grant),
            },
        );
    }

    /// Serves request `req` of worker `peer` (the connection's peer, as
    /// its handshake authenticated it): the reply to send. Blocking for
    /// as long as the copy takes (at most [`MAX_TCP_CHUNK`](ferry_proto::grant::MAX_TCP_CHUNK)
    /// bytes) and a full notification ring waits.
    pub(crate) fn serve(&self, peer: &str, req: GrantRequest) -> GrantReply {
        let id = req.req;
        let answer = match self.find(&req) {
            Ok(g) => g.serve(peer, req).unwrap_or_else(GrantAnswer::Refused),
            Err(e) => GrantAnswer::Refused(e),
        };
        GrantReply { req: id, answer }
    }

    /// The grant the request names, if its token is that grant's. A grant
    /// whose token matches but that is gone: revoked. An id unknown, or a
    /// wrong token: forged (the reply tells nothing of other grants).
    fn find(&self, req: &GrantRequest) -> Result<Arc<Owned>, GrantError> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&req.grant) {
            Some(e) if e.token == req.token => e.grant.upgrade().ok_or(GrantError::Revoked),
            _ => Err(GrantError::Forged { what: "token" }),
        }
    }
}

impl Owned {
    fn serve(&self, peer: &str, req: GrantRequest) -> Result<GrantAnswer, GrantError> {
        let meta = &self.meta;
        let g = Served {
            token: &meta.token,
            holder: meta.holder.as_deref(),
            rights: meta.rights,
            expires_at_ms: meta.expires_at_ms,
            block_size: meta.block_size,
            block_count: meta.block_count,
        };
        let spans = serve::check(&g, peer, &req, super::now_ms())?;
        self.claim_for_tcp()?;
        let _in = fence::enter(&self.page)?;
        if spans.is_empty() {
            // A bare notification (the only request that moves nothing).
            let payload = req.notify.unwrap_or_default();
            self.notify(NotificationKind::Message, &[], payload)?;
            return Ok(GrantAnswer::Done);
        }
        check::generations(&req.blocks, |i| {
            self.page.generation(i).map_or(u32::MAX, |g| g.load(SeqCst))
        })?;
        match req.kind {
            OperationKind::Read => {
                let bytes = self.copy_out(&spans, req.len);
                if let (true, Some(payload)) = (req.last, req.notify) {
                    self.notify(NotificationKind::Read, &req.blocks, payload)?;
                }
                Ok(GrantAnswer::Bytes(bytes))
            }
            OperationKind::Write => {
                self.copy_in(&spans, &req.bytes);
                if let (true, Some(payload)) = (req.last, req.notify) {
                    self.notify(NotificationKind::Write, &req.blocks, payload)?;
                }
                Ok(GrantAnswer::Done)
            }
        }
    }

    /// A grant has one notifying holder: the first TCP request makes this
    /// process its holder (a cma holder opening it later is refused, and
    /// a TCP request while a cma holder holds it is).
    fn claim_for_tcp(&self) -> Result<(), GrantError> {
        let me = std::process::id();
        match self
            .page
            .holder_pid()
            .compare_exchange(0, me, SeqCst, SeqCst)
        {
            Ok(_) => {
                self.page
                    .holder_start()
                    .store(sys::process_start(me).unwrap_or(0), SeqCst);
                Ok(())
            }
            Err(pid) if pid == me => Ok(()),
            Err(pid) => Err(GrantError::Claimed { pid }),
        }
    }

    fn copy_out(&self, spans: &Spans, len: u32) -> Vec<u8> {
        let mut out: Vec<u8> = Vec::with_capacity(len as usize);
        let base = self.pool.base();
        for &(at, n) in spans {
            let start = out.len();
            // SAFETY: `check` kept every span within the granted blocks,
            // which are the pool's (block size and count from the pool),
            // and the grant keeps the pool's memory alive; `out` has the
            // capacity for `len` bytes, the spans' total. The bytes are
            // read through raw pointers only (no reference to the pool's
            // memory is formed): the owner's concurrent writes to the same
            // blocks are the race a grant hands to its user, as the
            // kernel's copy of a cma holder is.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.add(at as usize),
                    out.as_mut_ptr().add(start),
                    n as usize,
                );
                out.set_len(start + n as usize);
            }
        }
        out
    }

    fn copy_in(&self, spans: &Spans, bytes: &[u8]) {
        let base = self.pool.base();
        let mut from = 0usize;
        for &(at, n) in spans {
            let n = n as usize;
            let Some(src) = bytes.get(from..from + n) else {
                return;
            };
            // SAFETY: as in `copy_out`: each span lies within the pool's
            // memory, alive while the grant lives; the grant has WRITE, so
            // the pool is writable (`create` refused otherwise); `src` is
            // `n` bytes of the request.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(at as usize), n);
            }
            from += n;
        }
    }

    fn notify(
        &self,
        kind: NotificationKind,
        blocks: &[ferry_proto::grant::BlockRef],
        payload: Vec<u8>,
    ) -> Result<(), GrantError> {
        let mut seq = self.tcp_seq.lock().unwrap_or_else(|e| e.into_inner());
        *seq += 1;
        let n = Notification {
            seq: *seq,
            kind,
            first_block: blocks.first().map_or(0, |r| r.index),
            block_count: blocks.len() as u32,
            payload,
            holder: None,
        };
        ring::push(&self.page, &n, RING_PATIENCE).inspect_err(|_| *seq -= 1)
    }
}
