//! The four operations: the handles a caller holds.

use std::sync::Arc;
use std::time::Duration;

use ferry_proto::{OperationStatus, RdmaMetadata};
use tokio::time::Instant;

use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::exposure::{Exposure, Exposures};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::Region;
use crate::transport::ActiveLink;

/// What a handle must undo when it is cancelled or dropped.
pub(crate) enum Link {
    Passive {
        exposures: Arc<Exposures>,
        exposure: Arc<Exposure>,
        /// The connector's runtime (where an expiry's timer runs).
        handle: tokio::runtime::Handle,
    },
    Active(Arc<dyn ActiveLink>),
}

/// The part of an operation that a [`Scope`](crate::Scope) also holds.
pub(crate) struct OpCore {
    pub(crate) shared: Arc<OpShared>,
    pub(crate) region: Arc<Region>,
    pub(crate) link: Link,
}

impl OpCore {
    /// Ends the operation from this side. When this returns, no transport
    /// touches the operation's memory any more.
    pub(crate) fn cancel(&self) {
        self.region.close();
        if self.shared.is_sealed() {
            // Too late to cancel: the remote has (or will have) every byte
            // and decides the outcome, or this side decided it and its
            // confirmation is on its way; both sides will agree on it.
            return;
        }
        if let Link::Passive {
            exposures,
            exposure,
            ..
        } = &self.link
        {
            // The capability ends before anyone can observe the cancel.
            exposures.forget(exposure);
        }
        let changed = self
            .shared
            .end(OperationStatus::Cancelled, Some(Error::Cancelled));
        match &self.link {
            Link::Passive {
                exposures,
                exposure,
                ..
            } => exposures.withdraw(exposure),
            Link::Active(link) => link.cancel(changed),
        }
    }

    /// A passive operation's expiry lapsed: ends it as a cancel does
    /// (fenced first, the remote told), with the cause
    /// [`Error::Expired`], unless it has ended or its last byte is on its
    /// way (then it completes or fails as the remote decides).
    fn expire(&self, after: Duration) {
        let Link::Passive {
            exposures,
            exposure,
            ..
        } = &self.link
        else {
            return;
        };
        if self.shared.status().is_terminal() {
            return;
        }
        self.region.close();
        if self.shared.is_sealed() {
            return;
        }
        // A request that comes from now on is told it expired.
        exposures.expired(exposure);
        self.shared
            .end(OperationStatus::Cancelled, Some(Error::Expired { after }));
        exposures.withdraw(exposure);
    }

    /// Arms the expiry of a passive operation (see
    /// [`ReadableOperation::expires_after`]): its timer ends with the
    /// operation.
    fn expire_after(self: &Arc<Self>, after: Duration) {
        let Link::Passive { handle, .. } = &self.link else {
            return;
        };
        let core = Arc::downgrade(self);
        let shared = self.shared.clone();
        handle.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(after) => {
                    if let Some(core) = core.upgrade() {
                        core.expire(after);
                    }
                }
                _ = shared.ended() => {}
            }
        });
    }
}

macro_rules! common_methods {
    () => {
        /// The current state.
        pub fn status(&self) -> OperationStatus {
            self.core.shared.status()
        }

        /// Waits until the operation ends: `Ok(())` when complete; the
        /// cause when it was cancelled (by either side) or failed. Woken by
        /// this operation's own notification, never by polling.
        pub async fn wait_for_completion(&self) -> Result<()> {
            self.core.shared.wait().await
        }

        /// Like [`wait_for_completion`](Self::wait_for_completion), but gives
        /// up with [`Error::Timeout`] after `timeout`. The operation itself
        /// goes on; cancel or drop it to stop it.
        pub async fn wait_for_completion_timeout(&self, timeout: Duration) -> Result<()> {
            self.core
                .shared
                .wait_until(Instant::now() + timeout, timeout)
                .await
        }

        /// Cancels the operation unless it has already ended; the remote is
        /// told. When this returns, Ferry starts no further access to the
        /// memory. A copy into it already in flight may still run a while,
        /// and the operation keeps the memory until it has returned
        /// ([`descriptors`](Self::descriptors) is `None` and
        /// [`is_released`](Self::is_released) `false` meanwhile): an
        /// ordinary chunk returns within milliseconds; UCX gets that the
        /// source does not answer (a stopped process, a cut link) are
        /// recalled a quarter of a second after the cancel, by closing the
        /// connection's UCX endpoint, which ends that connection (its other
        /// operations fail; the next operation to the peer connects again);
        /// only a same-host cross-memory copy that the peer stalls (pages
        /// that never arrive) cannot be interrupted, and returns when its
        /// pages arrive or the peer exits.
        ///
        /// Once the last byte is on its way to the remote, or, for a READ
        /// this side copies from the source's lent memory (cross-memory
        /// attach, UCX, CUDA IPC), once every byte has landed here and only
        /// the source's confirmation is awaited, the outcome is the
        /// remote's to decide, so a cancel then changes nothing: the
        /// operation stays in progress until the remote confirms (or the
        /// connection is lost), completes (or fails) as it does on the
        /// other side, and both sides report the same outcome. Ferry no
        /// longer writes the memory of such a READ, but it is given back
        /// only at that end.
        pub fn cancel(&self) {
            if !self.status().is_terminal() {
                self.core.cancel();
            }
        }

        /// The transport that carried (or is carrying) the bytes, once known.
        pub fn transport(&self) -> Option<TransportKind> {
            self.core.shared.transport()
        }

        /// Takes the descriptors back, cancelling the operation if it has not
        /// ended. After a completed read they hold the data.
        ///
        /// Nothing writes into them any more. One case to know: if this side
        /// is the *source* of a cross-memory-attach transfer (a readable, or
        /// a write) that is cancelled half-way, the peer process may go on
        /// copying *from* them until it has processed the cancel (normally
        /// microseconds); it then reports the operation cancelled. Drop the
        /// operation instead if its memory must hold something else at once:
        /// dropped storage is kept alive until the peer confirms.
        ///
        /// A second case: a copy *into* this memory that the peer stalled
        /// (a same-host peer whose pages never arrive) cannot be
        /// interrupted. The cancel returns at once, but this call then
        /// blocks until that copy has returned, so that no byte lands in
        /// memory you hold; drop the operation instead to never wait (its
        /// storage is then kept alive until the copy returns).
        pub fn into_descriptors(mut self) -> Vec<Descriptor<'a>> {
            self.core.cancel_if_open();
            self.core.wait_quiet();
            std::mem::take(&mut self.descs)
        }

        /// Whether the operation has ended and is done with its memory: no
        /// copy into it is still in flight, and no peer still holds a lease
        /// of it. Only a stalled copy (a same-host peer whose pages never
        /// arrive), or a peer that has not yet confirmed the end of a lease,
        /// keeps this `false` after the end. Never blocks: for whoever
        /// reuses the memory as soon as it may (see also
        /// [`descriptors`](Self::descriptors), which waits a while).
        pub fn is_released(&self) -> bool {
            self.status().is_terminal() && !self.core.region.is_in_use()
        }

        /// The descriptors, once the operation has ended (`None` before: the
        /// memory may still be touched by the remote). A copy into the
        /// memory still in flight at the end (a cancel mid-copy) is waited
        /// for; one that the peer stalled, for at most a second, after
        /// which this is `None` until it returns.
        pub fn descriptors(&self) -> Option<&[Descriptor<'a>]> {
            if self.status().is_terminal() && self.core.region.wait_quiet(Duration::from_secs(1)) {
                // The region is closed before any terminal state is published.
                debug_assert!(!self.core.region.is_open());
                Some(&self.descs)
            } else {
                None
            }
        }
    };
}

impl OpCore {
    fn cancel_if_open(&self) {
        if !self.shared.status().is_terminal() {
            self.cancel();
        }
        self.region.close();
    }

    /// Blocks until no copy into the memory is in flight (a copy that the
    /// peer stalled cannot be interrupted; it ends when its pages arrive or
    /// the peer exits), logging while it waits.
    pub(crate) fn wait_quiet(&self) {
        while !self.region.wait_quiet(Duration::from_secs(5)) {
            tracing::warn!(
                "waiting for a stalled cross-memory copy into an ended operation's memory to return"
            );
        }
    }
}

macro_rules! operation {
    ($(#[$doc:meta])* $name:ident, passive) => {
        $(#[$doc])*
        pub struct $name<'a> {
            pub(crate) core: Arc<OpCore>,
            pub(crate) descs: Vec<Descriptor<'a>>,
            pub(crate) metadata: RdmaMetadata,
        }

        impl<'a> $name<'a> {
            /// The metadata to hand to the remote worker. It grants access to
            /// this operation's bytes only, until the operation ends.
            pub fn metadata(&self) -> &RdmaMetadata {
                &self.metadata
            }

            /// Gives the operation an expiry: if it has not ended `after`
            /// from now, it ends as on [`cancel`](Self::cancel), with the
            /// cause [`Error::Expired`] (status `CANCELLED`). Its memory is
            /// fenced first, then given back; a transfer in progress at
            /// that moment is aborted on both sides (its remote hears
            /// [`AbortReason::Expired`](crate::AbortReason::Expired)), as
            /// is any remote that comes later. Once the last byte is on
            /// its way, the transfer completes (or fails) as the remote
            /// decides, as with a cancel. Default: no expiry. Call it
            /// before handing out the metadata (see `docs/transports.md`,
            /// "Expiry", for how a prefill worker sets it).
            pub fn expires_after(self, after: Duration) -> Self {
                self.core.expire_after(after);
                self
            }

            common_methods!();
        }

        operation!(@drop $name);
    };
    ($(#[$doc:meta])* $name:ident, active) => {
        $(#[$doc])*
        pub struct $name<'a> {
            pub(crate) core: Arc<OpCore>,
            pub(crate) descs: Vec<Descriptor<'a>>,
        }

        impl<'a> $name<'a> {
            common_methods!();
        }

        operation!(@drop $name);
    };
    (@drop $name:ident) => {
        impl Drop for $name<'_> {
            fn drop(&mut self) {
                // Fence first: the descriptors (dropped right after this) must
                // not be touched by a transport any more.
                self.core.cancel_if_open();
                // A peer on this host may still be copying *from* this memory
                // by cross-memory attach (it stops at its next chunk, once it
                // has our cancel), or a copy *into* it that the peer stalled
                // may still be in flight: owned storage stays alive until
                // both are over.
                if self.core.region.is_in_use() {
                    let mut borrowed = false;
                    for d in &mut self.descs {
                        match d.take_owner() {
                            Some(owner) => drop(self.core.region.keep_while_used(owner)),
                            None => borrowed = true,
                        }
                    }
                    // Memory this operation does not own (raw, or borrowed
                    // for 'static) cannot be kept alive: wait for the copy.
                    if borrowed {
                        self.core.wait_quiet();
                    }
                }
            }
        }

        impl std::fmt::Debug for $name<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("status", &self.status())
                    .field("descriptors", &self.descs.len())
                    .finish()
            }
        }
    };
}

operation!(
    /// Passive: local memory that one remote worker may read, once.
    ///
    /// Created by [`Connector::create_readable`](crate::Connector::create_readable).
    /// Completes when the remote's [`ReadOperation`] has received every byte.
    ReadableOperation,
    passive
);
operation!(
    /// Passive: local memory that one remote worker may write, once.
    ///
    /// Created by [`Connector::create_writable`](crate::Connector::create_writable).
    /// Completes when every byte of the remote's [`WriteOperation`] has landed.
    WritableOperation,
    passive
);
operation!(
    /// Active: reads a remote [`ReadableOperation`] into local descriptors.
    ///
    /// Started by [`Connector::begin_read`](crate::Connector::begin_read).
    /// After completion, [`into_descriptors`](Self::into_descriptors) gives
    /// the filled buffers back.
    ReadOperation,
    active
);
operation!(
    /// Active: writes local descriptors into a remote [`WritableOperation`].
    ///
    /// Started by [`Connector::begin_write`](crate::Connector::begin_write).
    WriteOperation,
    active
);
