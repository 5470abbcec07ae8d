//! Which backend lends and pulls on a connection: cross-memory attach
//! (same host, probed), or UCX (set up by the `Rdma` exchange). A
//! connection sets up at most one of them; the session decides *whether*
//! bytes move by lending, this decides *how*. On a connection with cross
//! memory attach, device memory is lent by CUDA IPC instead, and a
//! destination copies a lease with the puller its opaque bytes name.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::kind::TransportKind;
use crate::region::Region;
use crate::transport::cma;
use crate::transport::pull::cuda_ipc::{CudaIpcPuller, IpcPeer};
use crate::transport::pull::{
    cma::CmaPuller, lend_kept, register_kept, ucx::UcxPuller, Lane, LaneError, LeaseBlob,
};
use crate::transport::stall::{CopySlot, NoSlot, PeerKey};

use super::conn::Conn;

impl Conn {
    /// Whether this connection lends and pulls through UCX.
    pub(super) fn by_ucx(&self) -> bool {
        self.via_ucx.load(Ordering::Acquire)
    }

    /// The transport that lent bytes of `region` travel by on this
    /// connection (a host destination of GPU memory learns it from the
    /// lease: `OpShared::moved_by`).
    pub(super) fn lending_kind(&self, region: &Region) -> TransportKind {
        if self.by_ucx() {
            UcxPuller::default().kind()
        } else if !region.is_host() {
            CudaIpcPuller.kind()
        } else {
            CmaPuller.kind()
        }
    }

    /// Who this connection's copies read from, for the copy shares
    /// (`stall.rs`): the process that passed the attach probe, or over UCX
    /// the two hosts' addresses; `None` where this side copies nothing.
    fn copy_peer(&self) -> Option<PeerKey> {
        if self.by_ucx() {
            let (a, p) = self.tuple.get()?;
            let (a, p) = (a.ip().to_canonical(), p.ip().to_canonical());
            return Some(PeerKey::Hosts(a.min(p), a.max(p)));
        }
        let (pid, image) = self.peer_pid.get()?.identity();
        Some(PeerKey::Process(pid, image))
    }

    /// A slot for one copy from the peer, at once, or why there is none
    /// (see `stall.rs`): taken when the copy is planned (an active READ
    /// that will ask for a lease, a passive WRITE whose source lends), kept
    /// with its request until the copy ends. Never waits.
    pub(super) fn copy_slot(&self) -> Result<CopySlot, NoSlot> {
        self.copy_slots.try_acquire(self.copy_key())
    }

    /// [`copy_peer`](Self::copy_peer), or a key shared by every connection
    /// without a verified peer (which copies nothing: the session refuses
    /// a lease on it).
    pub(super) fn copy_key(&self) -> PeerKey {
        self.copy_peer().unwrap_or(PeerKey::Process(0, [0; 16]))
    }

    /// The CUDA IPC view of the attach-probed peer `process`: one per
    /// connection, holding the peer's allocations it opened until the
    /// connection (and every copy from it) is gone.
    pub(super) fn ipc_peer(&self, process: Arc<cma::Peer>) -> Arc<IpcPeer> {
        self.ipc_peer
            .get_or_init(|| Arc::new(IpcPeer::new(process)))
            .clone()
    }

    /// Prepares `region` to be lent (UCX: registers it, see
    /// [`UcxPuller::register_source`]).
    pub(super) fn register_lent(&self, region: &Region) -> Result<(), LaneError> {
        if self.by_ucx() {
            register_kept(&self.ucx_lane(), region)
        } else if !region.is_host() {
            register_kept(&CudaIpcPuller, region)
        } else {
            register_kept(&CmaPuller, region)
        }
    }

    /// The UCX lane as this connection's worker registers.
    fn ucx_lane(&self) -> UcxPuller {
        let strict = self
            .ucx_ep
            .get()
            .map_or(true, |ep| ep.worker.strict_registration);
        UcxPuller::new(strict)
    }

    /// What the peer needs to copy `region`.
    pub(super) fn lease_of(&self, region: &Region) -> LeaseBlob {
        if self.by_ucx() {
            lend_kept(&self.ucx_lane(), region)
        } else if !region.is_host() {
            lend_kept(&CudaIpcPuller, region)
        } else {
            lend_kept(&CmaPuller, region)
        }
    }
}
