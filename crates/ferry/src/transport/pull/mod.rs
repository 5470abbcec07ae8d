//! The destination's owner copies from memory the source lends: the plug
//! point for cross-memory attach, RDMA READ (UCX) and CUDA IPC.
//!
//! The source *lends* its memory: it describes it in a [`LeaseBlob`]
//! ([`Puller::lend`]) that travels to the destination over the control
//! connection, and keeps the memory alive until the lease ends (the
//! destination's `Finish`, `Abort` or `Release`, or the loss of the
//! connection). The destination's owner *pulls*: it copies the lent bytes
//! into its own memory, chunk by chunk, through its [`Region`]
//! ([`Puller::pull`]). No process ever writes into another's Ferry buffer,
//! so the fence that makes a cancel safe everywhere else holds here
//! unchanged: once [`Region::close`] has returned, no new copy starts, and
//! a copy already in flight is counted by the region, which keeps the
//! memory out of its user's hands until that copy returns.
//!
//! Whether a peer may be pulled from at all is probed elsewhere, during the
//! connection's attach exchange (`transport::probe` for cross-memory
//! attach); what the probe yields is the backend's [`Puller::Peer`].
//!
//! The TCP driver executes the session's `Pull` and `Lend` actions through
//! a puller ([`cma::CmaPuller`], [`ucx::UcxPuller`],
//! [`cuda_ipc::CudaIpcPuller`]).

use std::io;

use ferry_proto::DeviceKind;

use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::Region;

pub(crate) mod cma;
#[cfg(test)]
mod conformance;
pub(crate) mod cuda_ipc;
pub(crate) mod process;
pub(crate) mod share;
#[cfg(test)]
mod testing;
pub(crate) mod ucx;

/// How a pull ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PullEnd {
    /// Every byte landed and the operation is sealed (under the region's
    /// lock, before any close): the caller tells the source (`Finish`).
    Done,
    /// The destination's region was closed (a cancel, or the end of the
    /// operation) before the seal. Not sealed; whoever closed the region
    /// tells the peer.
    Closed,
    /// The copy failed: the source went away, or lent memory it does not
    /// have. Not sealed; the operation must fail on both sides (today the
    /// caller closes the connection, which fails every operation on it).
    Failed(String),
}

/// The end of a pull whose destination refused an access as device memory
/// (`Denied::NotHostMemory`): a backend that copies with the host (cross
/// memory attach, UCX here) never writes GPU memory.
pub(crate) fn not_host_memory() -> PullEnd {
    PullEnd::Failed(
        "the destination is device memory, which this backend does not write: GPU memory \
         is lent only by CUDA IPC between processes of one host, or through a UCX that moves \
         CUDA memory on both sides"
            .into(),
    )
}

/// What a source lends: enough for the destination's backend to copy the
/// memory of one operation.
///
/// `segments` holds one `(address, length)` per descriptor of the source,
/// in order, as the source's backend names its memory (for cross-memory
/// attach: virtual addresses in the source process). `opaque` is whatever
/// else that backend needs and only it reads: empty for cross-memory
/// attach; remote keys of registered memory for RDMA, or IPC handles (with
/// offsets in `segments`) for CUDA. Its encoding is the backend's business,
/// so a new backend adds no field here nor, later, to the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseBlob {
    segments: Vec<(u64, u64)>,
    opaque: Vec<u8>,
}

impl LeaseBlob {
    /// A lease of `segments`, with backend-specific `opaque` bytes.
    pub(crate) fn new(segments: Vec<(u64, u64)>, opaque: Vec<u8>) -> Self {
        LeaseBlob { segments, opaque }
    }

    /// A lease by address alone (cross-memory attach; today's wire `Lease`).
    pub(crate) fn addresses(segments: Vec<(u64, u64)>) -> Self {
        Self::new(segments, Vec::new())
    }

    /// `(address, length)` per descriptor of the source.
    pub(crate) fn segments(&self) -> &[(u64, u64)] {
        &self.segments
    }

    /// The segments and the backend's bytes, moved out (for the wire).
    pub(crate) fn into_parts(self) -> (Vec<(u64, u64)>, Vec<u8>) {
        (self.segments, self.opaque)
    }

    /// The backend's own bytes.
    // Read by the backends that carry more than addresses (RDMA keys, CUDA
    // IPC handles); cross-memory attach lends addresses alone.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn opaque(&self) -> &[u8] {
        &self.opaque
    }

    /// Whether the lease matches `region`'s segments one for one, in length:
    /// what a destination must check before it pulls (today the session's
    /// `LeaseShapeMismatch` and `tcp::pull::take_lease` do).
    pub(crate) fn fits(&self, region: &Region) -> bool {
        self.segments.len() == region.sizes().count()
            && self.segments.iter().map(|s| s.1).eq(region.sizes())
    }
}

/// A way for the destination's owner to copy memory that the source lends
/// (cross-memory attach; later RDMA READ, CUDA IPC).
///
/// One value serves every connection of a connector; what it knows of one
/// peer (after the attach exchange proved it may be pulled from) is a
/// [`Self::Peer`].
///
/// # The contract
///
/// Every implementation keeps this invariant, which is what makes a cancel
/// safe on the pulled path: **the destination's owner copies into its own
/// memory, chunk by chunk, through its [`Region`]; after
/// [`Region::close`] has returned no copy starts, and the operation is
/// sealed only under the region's lock while it is open.** In detail,
/// [`pull`](Self::pull) must:
///
/// 1. **Write only through the fence.** Every byte lands inside a
///    [`Region::copy_into`] (or [`Region::copy_into_each`]) callback, into
///    the pointers it hands out, and
///    only while the callback runs (no pointer is kept past it): the
///    region then refuses every copy once a close has begun, counts the one
///    in flight, and keeps the memory reserved for it until it returns.
/// 2. **Bound each copy.** One callback moves at most one chunk (the
///    backend's bound, e.g. [`cma::CHUNK`](crate::transport::cma::CHUNK)
///    bytes, or a run of small segments totalling no more), so a cancel
///    that meets an ordinary copy waits for that one chunk at most, and at
///    most that one chunk lands after the close began (one per thread, where
///    a pull shares its chunks among threads: see `share.rs`).
/// 3. **Stop at the first refusal.** `Err(Denied::Closed)` from the region
///    ends the pull at once with [`PullEnd::Closed`]: no further copy, no
///    seal.
/// 4. **Seal last, under the lock.** Only after every byte of the lease has
///    landed and the source has been verified for the last time, and
///    exactly as `region.seal_if_open(|| shared.seal())`: [`PullEnd::Done`]
///    if that ran the seal, [`PullEnd::Closed`] if not. Nothing else in
///    the pull touches `shared`: it neither ends nor fails the operation,
///    and never unseals.
/// 5. **Never seal on failure.** A source that went away (its process
///    exited, the connection or the peer's registration is gone) or that
///    lent memory it does not have is [`PullEnd::Failed`], with the cause;
///    never undefined behaviour nor a crash, whatever the lease says.
/// 6. **Leave the rest to the caller.** The pull reads the source only
///    through `peer` and only the lease's segments, never writes the
///    source, never closes `region`, never lends nor gives back.
///
/// The caller, in turn: has checked that the lease [fits](LeaseBlob::fits)
/// the region (lengths one for one); passes the destination's writable
/// region; registers regions the backend needs registered; and runs
/// [`pull`](Self::pull) on a copy thread of its own (`stall::run`, under a
/// `CopySlot`), never on the runtime, since a peer may stall a copy for
/// ever and the thread cannot be interrupted.
pub(crate) trait Puller: Send + Sync + 'static {
    /// What this side holds of one peer once the attach exchange proved the
    /// peer may be pulled from (for cross-memory attach: a handle on the
    /// very process that passed the probe). Shared by the copies of every
    /// operation on that connection.
    type Peer: Send + Sync + 'static;

    /// The transport this backend is, as operations report it.
    fn kind(&self) -> TransportKind;

    /// The kinds of memory it can pull into and lend (NIXL's
    /// `getSupportedMems`).
    // Which puller carries device memory is decided per connection
    // (`tcp/lending.rs`); this is what each declares, checked by its tests.
    #[cfg_attr(not(test), allow(dead_code))]
    fn memory_kinds(&self) -> &'static [DeviceKind];

    /// Whether it can move memory of kind `kind`.
    #[cfg_attr(not(test), allow(dead_code))]
    fn supports(&self, kind: DeviceKind) -> bool {
        self.memory_kinds().contains(&kind)
    }

    /// Prepares `region` for this backend (pins it, registers it with a
    /// NIC, exports an IPC handle), on either side, before its first
    /// [`lend`](Self::lend) or [`pull`](Self::pull). Nothing to do by
    /// default; an error means the backend cannot carry this operation.
    fn register(&self, region: &Region) -> io::Result<()> {
        let _ = region;
        Ok(())
    }

    /// Undoes [`register`](Self::register), once the region is closed and
    /// quiet (destination) or given back (source). Nothing by default.
    fn deregister(&self, region: &Region) -> io::Result<()> {
        let _ = region;
        Ok(())
    }

    /// Describes `region` (the source's memory) for a peer to pull from.
    /// It only describes: the caller counts the lease with
    /// [`Region::lend`] before the blob leaves, and ends it with
    /// [`Region::give_back`] when the destination says it stopped or the
    /// connection ends, so the memory stays alive for as long as the peer
    /// may read it.
    fn lend(&self, region: &Region) -> LeaseBlob;

    /// Copies every segment of `lease` from `peer` into `region`, chunk by
    /// chunk, then seals `shared`, as the trait's contract says. Blocking.
    fn pull(
        &self,
        peer: &Self::Peer,
        lease: &LeaseBlob,
        region: &Region,
        shared: &OpShared,
    ) -> PullEnd;
}
