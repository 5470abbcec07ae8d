//! The destination's owner copies from memory the source lends: the plug
//! point for cross-memory attach, RDMA READ (UCX) and CUDA IPC, each a
//! [`Lane`].
//!
//! The source *lends* its memory: it describes it in a [`LeaseBlob`]
//! ([`Lane::lend`]) that travels to the destination over the control
//! connection, and keeps the memory alive until the lease ends (the
//! destination's `Finish`, `Abort` or `Release`, or the loss of the
//! connection). The destination's owner *pulls*: it copies the lent bytes
//! into its own memory, chunk by chunk, through its [`Region`]
//! ([`Lane::pull`]). No process ever writes into another's Ferry buffer,
//! so the fence that makes a cancel safe everywhere else holds here
//! unchanged: once [`Region::close`] has returned, no new copy starts, and
//! a copy already in flight is counted by the region, which keeps the
//! memory out of its user's hands until that copy returns.
//!
//! Whether a peer may be pulled from at all is proven when the lane sets
//! itself up on the connection: each lane encodes and checks its own
//! offers ([`offer::LaneOffers`]: cross-memory attach's pid and cookie,
//! probed by `transport::probe`; UCX's worker address), the session keeps
//! the turns; what the proof yields is the lane's [`Lane::Peer`].
//!
//! Which lane carries an operation is the planner's answer
//! (`ferry_proto::session::lane_for`, from every lane's [`Lane::caps`]);
//! the connector's lanes and the one place that turns a lane's id into the
//! lane are the registry ([`lanes`]). The TCP driver executes the session's
//! `Pull` and `Lend` actions through it ([`cma::CmaPuller`],
//! [`ucx::UcxPuller`], [`cuda_ipc::CudaIpcPuller`]).

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId};

use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::Region;

pub(crate) mod cma;
#[cfg(test)]
mod conformance;
pub(crate) mod cuda_ipc;
mod error;
pub(crate) mod exchange;
pub(crate) mod lanes;
pub(crate) mod offer;
pub(crate) mod process;
pub(crate) mod procmem;
pub(crate) mod registration;
pub(crate) mod share;
#[cfg(test)]
mod testing;
#[cfg(all(test, target_os = "linux"))]
mod twin;
pub(crate) mod ucx;
#[cfg(all(test, target_os = "linux"))]
#[path = "../../../tests/support/uffd.rs"]
mod uffd;

pub(crate) use error::LaneError;
use registration::Kept;

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
    /// The copy failed (`cause`): the source went away, or lent memory it
    /// does not have, or this side cannot copy it. Not sealed; the
    /// operation must fail on both sides: the caller ends what `scope`
    /// says (the lane's [`LaneCaps::failure`]: the one request, or the
    /// connection and every operation on it).
    Failed {
        scope: FailureScope,
        cause: LaneError,
    },
}

impl PullEnd {
    /// A failure that ends what `scope` says.
    pub(crate) fn failed(scope: FailureScope, cause: LaneError) -> PullEnd {
        PullEnd::Failed { scope, cause }
    }
}

/// What a source lends: enough for the destination's lane to copy the
/// memory of one operation.
///
/// `lane` names the lane that lent it (the destination copies with that
/// lane, never guessing from the bytes). `segments` holds one `(address,
/// length)` per descriptor of the source, in order, as the source's lane
/// names its memory (for cross-memory attach: virtual addresses in the
/// source process). `opaque` is whatever else that lane needs and only it
/// reads: empty for cross-memory attach; remote keys of registered memory
/// for RDMA, or IPC handles (with offsets in `segments`) for CUDA. Its
/// encoding is the lane's business, so a new lane adds no field here nor
/// to the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseBlob {
    lane: LaneId,
    segments: Vec<(u64, u64)>,
    opaque: Vec<u8>,
}

impl LeaseBlob {
    /// A lease by `lane` of `segments`, with the lane's `opaque` bytes.
    pub(crate) fn new(lane: LaneId, segments: Vec<(u64, u64)>, opaque: Vec<u8>) -> Self {
        LeaseBlob {
            lane,
            segments,
            opaque,
        }
    }

    /// A lease by `lane` by address alone (cross-memory attach).
    pub(crate) fn addresses(lane: LaneId, segments: Vec<(u64, u64)>) -> Self {
        Self::new(lane, segments, Vec::new())
    }

    /// The lane that lent it.
    pub(crate) fn lane(&self) -> LaneId {
        self.lane
    }

    /// `(address, length)` per descriptor of the source.
    pub(crate) fn segments(&self) -> &[(u64, u64)] {
        &self.segments
    }

    /// The lane, the segments and the lane's bytes, moved out (for the
    /// wire).
    pub(crate) fn into_parts(self) -> (LaneId, Vec<(u64, u64)>, Vec<u8>) {
        (self.lane, self.segments, self.opaque)
    }

    /// The lane's own bytes.
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

/// A lane: one way for the destination's owner to copy memory that the
/// source lends (cross-memory attach, RDMA READ through UCX, CUDA IPC),
/// with what it declares it can move ([`caps`](Self::caps)), the state it
/// keeps for lent memory ([`Self::Registration`]), how it lends and how
/// it pulls.
///
/// One value serves every connection of a connector; what it knows of one
/// peer (after the connection proved it may be pulled from) is a
/// [`Self::Peer`]. Which lane carries an operation is not the lane's to
/// decide: the planner (`ferry_proto::session::lane_for`) decides from
/// every lane's [`caps`](Self::caps).
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
///    seal. A lane whose copy in flight the peer may hold for ever but
///    that can recall it (UCX: a get from a stopped source) does so within
///    a bound once the region is closed, by tearing down its link to the
///    peer (the endpoint), so that the copy returns and the memory goes
///    back to its owner; the link being gone, the pull then ends
///    [`PullEnd::Failed`] with [`LaneError::Recalled`] in connection
///    scope instead.
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
pub(crate) trait Lane: Send + Sync + 'static {
    /// What this side holds of one peer once the connection proved the
    /// peer may be pulled from (for cross-memory attach: a handle on the
    /// very process that passed the probe). Shared by the copies of every
    /// operation on that connection.
    type Peer: Send + Sync + 'static;

    /// What the lane keeps for memory it lends, from
    /// [`register`](Self::register) until the last lease of the region
    /// ends (UCX: its registrations and their keys; CUDA IPC: the exported
    /// handles). The region keeps it, typed ([`registration::Registration`]).
    type Registration: Kept;

    /// The lane's name, on the wire (leases name their lane) and here.
    fn id(&self) -> LaneId;

    /// The transport this lane is, as operations report it.
    fn kind(&self) -> TransportKind;

    /// What it can move (NIXL's `getSupportedMems`, and more): the memory
    /// it lends and pulls into, its reach, what a failure ends.
    fn caps(&self) -> LaneCaps;

    /// Prepares `region` for this lane (pins it, registers it with a
    /// NIC, exports an IPC handle), on either side, before its first
    /// [`lend`](Self::lend) or [`pull`](Self::pull): what to keep while it
    /// is lent, `None` where the lane needs nothing kept (a destination,
    /// cross-memory attach). An error means the lane cannot carry this
    /// operation.
    fn register(&self, region: &Region) -> Result<Option<Self::Registration>, LaneError>;

    /// Describes `region` (the source's memory) for a peer to pull from,
    /// with what [`register`](Self::register) kept for it (`None`: nothing
    /// was, or registering failed: the lease then carries no keys and the
    /// destination refuses it). It only describes: the caller counts the
    /// lease with [`Region::lend`] before the blob leaves, and ends it with
    /// [`Region::give_back`] when the destination says it stopped or the
    /// connection ends, so the memory stays alive for as long as the peer
    /// may read it.
    fn lend(&self, region: &Region, kept: Option<&Self::Registration>) -> LeaseBlob;

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

/// Registers `region` with `lane` unless the region already keeps that
/// lane's registration, and keeps what it returns with the region until
/// its last lease ends ([`Region::give_back`]).
pub(crate) fn register_kept<L: Lane>(lane: &L, region: &Region) -> Result<(), LaneError> {
    region.lease_state(|state| {
        if state.as_ref().and_then(L::Registration::find).is_some() {
            return Ok(());
        }
        if let Some(r) = lane.register(region)? {
            *state = Some(r.keep());
        }
        Ok(())
    })
}

/// `lane`'s lease of `region`, with the registration the region keeps.
pub(crate) fn lend_kept<L: Lane>(lane: &L, region: &Region) -> LeaseBlob {
    region.lease_state(|state| lane.lend(region, state.as_ref().and_then(L::Registration::find)))
}

/// Registers the destination `region` with `lane` (kept for the pull
/// alone), pulls, and drops the registration.
pub(crate) fn pull_registered<L: Lane>(
    lane: &L,
    peer: &L::Peer,
    lease: &LeaseBlob,
    region: &Region,
    shared: &OpShared,
) -> PullEnd {
    debug_assert_eq!(lease.lane(), lane.id(), "pulled by the lane that lent it");
    let scope = lane.caps().failure;
    let kept = match lane.register(region) {
        Ok(k) => k,
        Err(e) => return PullEnd::failed(scope, LaneError::Registration(e.to_string())),
    };
    let end = lane.pull(peer, lease, region, shared);
    drop(kept);
    end
}
