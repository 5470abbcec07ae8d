//! Copies from a peer's lent memory: a lease received on a connection is
//! copied into the destination by this side (cross-memory attach, UCX or
//! CUDA IPC), under a copy slot (`stall.rs`), on a copy thread, and the
//! source is told when every byte is copied.

use std::sync::Arc;

use ferry_proto::lane::FailureScope;
use ferry_proto::wire::AbortReason;
use ferry_proto::OperationStatus;

use crate::transport::pull::lanes::Lanes;
use crate::transport::pull::{LaneError, LeaseBlob, PullEnd};
use crate::transport::stall::{self, CopySlot, NoSlot};
use crate::Error;

use super::conn::Conn;
use super::request::Target;
use super::util::lock;

impl Conn {
    /// Copies a lease into `region` from a blocking thread (never the
    /// reader task: the peer's pages may fault slowly, or never arrive),
    /// under the copy slot its request took (see `stall.rs`: without one, it
    /// waits only for its own peer's copies, and is refused at once where
    /// the process has none: `refuse_copy`), then tells the
    /// source that every byte is copied (`Finish`). A closed region ends it silently:
    /// whoever closed it tells the peer. A failed copy by cross-memory
    /// attach or UCX means the peer died (its memory went away) or lent
    /// memory it does not have: either way the connection is closed, which
    /// fails every operation on it, on both sides, with
    /// [`Error::ConnectionLost`] and the cause. A CUDA IPC lease that fails
    /// (not offered here, a handle the driver will not open, a bad lease)
    /// ends its one request (`fail_request`).
    pub(super) fn spawn_pull(self: &Arc<Self>, req: u64, target: Target, lease: LeaseBlob) {
        tracing::debug!(req, "lease received");
        let (region, shared) = (target.region.clone(), target.shared.clone());
        // The lane the lease names, where this connection agreed on it;
        // else the failure ends what that lane's scope says.
        let peer = match self.peers.for_lane(lease.lane(), &self.agreed_lanes()) {
            Ok(peer) => peer,
            Err(end) => return self.pull_failed(req, &target, end),
        };
        shared.moved_by(Lanes::kind(lease.lane()));
        // The slot was taken when the copy was planned; a lease on a
        // request that took none finds one now, or waits for one of its own
        // peer's copies to end (see `stall.rs`), or, where the process has
        // none free, is refused at once: never does a copy wait for a slot
        // that another peer holds.
        let slot = match target.take_slot().map_or_else(|| self.copy_slot(), Ok) {
            Ok(slot) => Some(slot),
            Err(NoSlot::Process) => return self.refuse_copy(req, &target, NoSlot::Process),
            Err(NoSlot::Connection | NoSlot::Peer) => None,
        };
        let ended = shared.clone();
        let refused = target.clone();
        // The copy thread answers the peer itself (no hop back to the
        // runtime) and holds the connection only weakly: a copy that the
        // peer stalls must not keep its socket alive.
        let conn = Arc::downgrade(self);
        let (lanes, scope) = (self.lanes, Lanes::scope(lease.lane()));
        let copy = move |slot: CopySlot| {
            // The session checked the lease's shape; the copy checks again.
            let end = if !lease.fits(&region) {
                PullEnd::failed(scope, LaneError::LeaseMismatch)
            } else {
                lanes.pull(&peer, &lease, &region, &shared)
            };
            drop(slot);
            let Some(conn) = conn.upgrade() else {
                return;
            };
            match end {
                PullEnd::Failed { .. } => conn.pull_failed(req, &target, end),
                PullEnd::Done | PullEnd::Closed => {
                    let done = end == PullEnd::Done;
                    #[cfg(test)]
                    if done {
                        crate::transport::digest::corrupt_for_tests(&region);
                    }
                    // With the integrity check on, a second pass over what
                    // landed, on this copy thread (`None` for device memory:
                    // not checked).
                    let digest = (done && conn.digest)
                        .then(|| crate::transport::digest::of_range(&region, (0, u64::MAX)))
                        .flatten();
                    // `Finish` (after its `Digest`, where the check is on);
                    // or, with RDMA leases, `Release` once the gets of a
                    // stopped copy have drained.
                    let frames = lock(&conn.session).pull_ended_digest(req, done, digest);
                    let mut out = Vec::new();
                    for m in frames {
                        m.encode(&mut out);
                    }
                    if !out.is_empty() {
                        conn.send_soon(out, None, false);
                    }
                }
            }
        };
        if let Some(slot) = slot {
            return stall::run(move || copy(slot));
        }
        let (slots, key, me) = (
            self.copy_slots.clone(),
            self.copy_key(),
            Arc::downgrade(self),
        );
        self.handle.spawn(async move {
            let slot = tokio::select! {
                slot = slots.acquire_own(key) => slot,
                // Ended while waiting: whoever ended it tells the peer;
                // with RDMA leases, the lease ends here (no get was posted).
                _ = ended.ended() => {
                    if let Some(conn) = me.upgrade() {
                        let m = lock(&conn.session).pull_ended(req, false);
                        if let Some(m) = m {
                            conn.send_soon(m.to_vec(), None, false);
                        }
                    }
                    return;
                }
            };
            match slot {
                Ok(slot) => stall::run(move || copy(slot)),
                Err(why) => {
                    if let Some(conn) = me.upgrade() {
                        conn.refuse_copy(req, &refused, why);
                    }
                }
            }
        });
    }

    /// Ends what a failed pull's scope says: the request alone, both sides
    /// told (a CUDA IPC copy: no GPU here, no peer access between the two
    /// devices, memory the driver would not map; a source that went away
    /// ends the connection on its own), or the connection, which fails
    /// every operation on it.
    fn pull_failed(self: &Arc<Self>, req: u64, target: &Target, end: PullEnd) {
        match end {
            PullEnd::Failed {
                scope: FailureScope::Request,
                cause,
            } => self.fail_request(req, target, cause.to_string()),
            PullEnd::Failed {
                scope: FailureScope::Connection,
                cause,
            } => self.kill(cause.to_string()),
            PullEnd::Done | PullEnd::Closed => {}
        }
    }

    /// Ends request `req`, whose lease this side cannot copy now for want
    /// of a copy slot (`why`), with a typed error on both sides
    /// (`AbortReason::CopySlots`), at once.
    fn refuse_copy(self: &Arc<Self>, req: u64, target: &Target, why: NoSlot) {
        let detail = why.to_string();
        tracing::debug!(peer = self.peer, req, "{detail}");
        let release = {
            let mut s = lock(&self.session);
            s.forget(req);
            // With RDMA leases, the source waits for this side to say it
            // stopped (no get was posted).
            s.pull_ended(req, false)
        };
        if let Some(m) = release {
            self.send_soon(m.to_vec(), None, false);
        }
        let error = Error::Rejected {
            reason: AbortReason::CopySlots,
            detail: detail.clone(),
        };
        if target.end(OperationStatus::Errored, Some(error)) && target.stripe.is_none() {
            self.abort_detached(req, AbortReason::CopySlots, detail);
        }
    }
}
