//! The registry: the lanes a connector offers ([`Lanes`], built once from
//! its configuration), what one connection holds of its peer for them
//! ([`Peers`]), and the one place that turns a lane's id into the lane
//! itself. Which lane carries what is not decided here: the planner
//! (`ferry_proto::session::lane_for`) decides from the lanes' caps
//! ([`Lanes::agreed`]); the driver then registers, lends and pulls through
//! the lane it named.
//!
//! A new lane is a file of its own in this folder, a line in
//! [`Lanes::offered`] and an arm in each `match` on a lane's id here (and,
//! where it proves its peer with offers of its own, an arm in
//! `exchange.rs`).

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, LaneSet, Proven, Reach};
use ferry_proto::session::Caps;

use super::cma::CmaPuller;
use super::cuda_ipc::{CudaIpcPuller, IpcPeer};
use super::procmem::{self, ProcMem};
use super::ucx::UcxPuller;
use super::{lend_kept, pull_registered, register_kept, Lane, LaneError, LeaseBlob, PullEnd};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::Region;
use crate::transport::cma;
use crate::transport::stall::PeerKey;
use crate::transport::ucx::Endpoint;

/// The lanes a connector offers, best first (built once, from its
/// configuration).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lanes {
    /// Cross-memory attach, and CUDA IPC with it (where both processes
    /// offer it: the attach exchange says).
    attach: bool,
    /// UCX, registering as it says.
    ucx: Option<UcxPuller>,
}

impl Lanes {
    /// The lanes of a connector with cross-memory attach enabled (`attach`)
    /// and, where `ucx` is `Some(strict)`, a UCX worker that registers
    /// strictly or not.
    pub(crate) fn new(attach: bool, ucx: Option<bool>) -> Lanes {
        Lanes {
            attach,
            ucx: ucx.map(UcxPuller::new),
        }
    }

    /// What each lane offered here declares, best first.
    pub(crate) fn offered(&self) -> Vec<LaneCaps> {
        let mut all = Vec::with_capacity(3);
        if self.attach {
            all.push(CmaPuller.caps());
            all.push(CudaIpcPuller.caps());
            if ProcMem::on() {
                all.push(ProcMem.caps());
            }
        }
        if let Some(u) = &self.ucx {
            all.push(u.caps());
        }
        all
    }

    /// The lanes a connection whose peer proved `proven` shares with it.
    pub(crate) fn agreed(&self, proven: &Proven) -> LaneSet {
        LaneSet::agreed(&self.offered(), proven)
    }

    /// The transport lane `id` is, as operations report it.
    pub(crate) fn kind(id: LaneId) -> TransportKind {
        match id {
            LaneId::CMA => CmaPuller.kind(),
            LaneId::UCX => UcxPuller::default().kind(),
            LaneId::CUDA_IPC => CudaIpcPuller.kind(),
            LaneId::PROCMEM => ProcMem.kind(),
            // No lane of this build: nothing was lent by it.
            _ => TransportKind::Tcp,
        }
    }

    /// What a failed pull by lane `id` ends (the connection, for a lane
    /// this build does not have).
    pub(crate) fn scope(id: LaneId) -> FailureScope {
        match id {
            LaneId::CMA => CmaPuller.caps().failure,
            LaneId::UCX => UcxPuller::default().caps().failure,
            LaneId::CUDA_IPC => CudaIpcPuller.caps().failure,
            LaneId::PROCMEM => ProcMem.caps().failure,
            _ => FailureScope::Connection,
        }
    }

    /// How far lane `id` reaches (a lane this build does not have: the
    /// network, the farthest).
    pub(crate) fn reach(id: LaneId) -> Reach {
        match id {
            LaneId::CMA => CmaPuller.caps().reach,
            LaneId::UCX => UcxPuller::default().caps().reach,
            LaneId::CUDA_IPC => CudaIpcPuller.caps().reach,
            LaneId::PROCMEM => ProcMem.caps().reach,
            _ => Reach::Network,
        }
    }

    /// Registers `region` with lane `id` (kept with the region until its
    /// last lease ends), to be lent.
    pub(crate) fn register(&self, id: LaneId, region: &Region) -> Result<(), LaneError> {
        match (id, &self.ucx) {
            (LaneId::CMA, _) if self.attach => register_kept(&CmaPuller, region),
            (LaneId::CUDA_IPC, _) if self.attach => register_kept(&CudaIpcPuller, region),
            (LaneId::UCX, Some(u)) => register_kept(u, region),
            (LaneId::PROCMEM, _) if self.attach => register_kept(&ProcMem, region),
            _ => Err(not_offered(id)),
        }
    }

    /// Lane `id`'s lease of `region` (registered first).
    pub(crate) fn lend(&self, id: LaneId, region: &Region) -> LeaseBlob {
        match (id, &self.ucx) {
            (LaneId::UCX, Some(u)) => lend_kept(u, region),
            (LaneId::CUDA_IPC, _) => lend_kept(&CudaIpcPuller, region),
            (LaneId::PROCMEM, _) => lend_kept(&ProcMem, region),
            // What nothing registers: addresses alone.
            _ => lend_kept(&CmaPuller, region),
        }
    }

    /// Memory that lane `id` was to lend moves in band instead (it could
    /// not be registered, `why`): counted where the lane's fallbacks are.
    pub(crate) fn fell_back(id: LaneId, shared: &OpShared, why: &str) {
        if id == LaneId::CUDA_IPC {
            shared.ipc_fell_back(why);
        } else {
            tracing::debug!(lane = %id, "memory moves in band, not lent: {why}");
        }
    }

    /// Copies `lease` into `region` from `peer`, by the lane it is a peer
    /// of ([`Peers::for_lane`]: the lane the lease names). Blocking: on a
    /// copy thread.
    pub(crate) fn pull(
        &self,
        peer: &LanePeer,
        lease: &LeaseBlob,
        region: &Region,
        shared: &OpShared,
    ) -> PullEnd {
        match (peer, &self.ucx) {
            (LanePeer::Cma(p), _) => pull_registered(&CmaPuller, p, lease, region, shared),
            (LanePeer::CudaIpc(p), _) => pull_registered(&CudaIpcPuller, p, lease, region, shared),
            (LanePeer::ProcMem(p), _) => pull_registered(&ProcMem, p, lease, region, shared),
            (LanePeer::Ucx(ep), Some(u)) => pull_registered(u, ep, lease, region, shared),
            (LanePeer::Ucx(ep), None) => {
                pull_registered(&UcxPuller::default(), ep, lease, region, shared)
            }
        }
    }
}

/// Why the peer's lease by `id` is refused: this side did not set that
/// lane up with it.
fn not_offered(id: LaneId) -> LaneError {
    let detail = match id {
        LaneId::CUDA_IPC => "the peer lent GPU memory by CUDA IPC, which this process did not \
                             offer (no CUDA driver that sees a device)"
            .to_string(),
        _ => format!("the peer lent memory by {id}, which this connection did not set up"),
    };
    LaneError::NotOffered { lane: id, detail }
}

/// Whom a pull copies from: the peer as one lane knows it.
pub(crate) enum LanePeer {
    Cma(Arc<cma::Peer>),
    Ucx(Arc<Endpoint>),
    CudaIpc(Arc<IpcPeer>),
    ProcMem(Arc<procmem::Peer>),
}

/// What one connection proved about its peer and holds of it for its
/// lanes, set as the connection's exchanges prove it.
#[derive(Default)]
pub(crate) struct Peers {
    /// The peer's process (its pid, and the program it runs), once this
    /// process has proven it can copy from it (the attach probe).
    pub(crate) process: OnceLock<Arc<cma::Peer>>,
    /// The peer's allocations this side opened by CUDA IPC, once a lease
    /// of GPU memory came.
    ipc: OnceLock<Arc<IpcPeer>>,
    /// An endpoint to the peer's UCX worker, once this side reached it.
    pub(crate) ucx: OnceLock<Arc<Endpoint>>,
    /// The peer's `/proc/<pid>/mem`, once this side read its cookie there.
    pub(crate) procmem: OnceLock<Arc<procmem::Peer>>,
    /// The lane whose offers proved a way on this connection (its lanes,
    /// [`LaneCaps::proven_by`], lend and pull on it).
    proved: OnceLock<LaneId>,
}

impl Peers {
    /// Lane `id`'s offers proved that a side can copy from the other.
    pub(crate) fn set_proved(&self, id: LaneId) {
        let _ = self.proved.set(id);
    }

    /// What the connection proved, with the session's `caps` (whether
    /// both sides move device memory by the lane they set up).
    pub(crate) fn proven(&self, caps: &Caps) -> Proven {
        Proven {
            proved_by: self.proved.get().copied(),
            device: caps.device,
            same_process: self.process.get().is_some_and(|p| p.pid() == cma::pid()),
        }
    }

    /// Who this connection's copies read from, for the copy shares
    /// (`stall.rs`): where the lane that proved the connection reaches the
    /// network, the two hosts (`hosts`: this side's address and the
    /// peer's); else the peer's process, as the attach probe proved it.
    /// `None` where nothing was proved: this side copies nothing.
    pub(crate) fn copy_peer(&self, hosts: Option<(IpAddr, IpAddr)>) -> Option<PeerKey> {
        let proved = *self.proved.get()?;
        if Lanes::reach(proved) == Reach::Network {
            let (a, p) = hosts?;
            let (a, p) = (a.to_canonical(), p.to_canonical());
            return Some(PeerKey::Hosts(a.min(p), a.max(p)));
        }
        let (pid, image) = self.process.get()?.identity();
        Some(PeerKey::Process(pid, image))
    }

    /// The peer that lane `id` copies a lease from, where the connection
    /// agreed on that lane (`agreed`), or the failure that ends what its
    /// scope says: a peer this side cannot copy from at all ends the
    /// connection; a lane that the connection did not set up, what that
    /// lane's failures end.
    pub(crate) fn for_lane(&self, id: LaneId, agreed: &LaneSet) -> Result<LanePeer, PullEnd> {
        let gone = |why: &str| {
            PullEnd::failed(
                FailureScope::Connection,
                LaneError::SourceGone { detail: why.into() },
            )
        };
        let process = || {
            self.process
                .get()
                .cloned()
                .ok_or_else(|| gone("the peer lent memory to a process that cannot attach to it"))
        };
        // The lane's peer first: without one, nothing can be copied.
        let peer = match id {
            LaneId::UCX => self.ucx.get().cloned().map(LanePeer::Ucx).ok_or_else(|| {
                gone("the peer lent memory over UCX to a worker that cannot reach it")
            })?,
            LaneId::CMA => LanePeer::Cma(process()?),
            LaneId::PROCMEM => self
                .procmem
                .get()
                .cloned()
                .map(LanePeer::ProcMem)
                .ok_or_else(|| {
                    gone("the peer lent memory by /proc/<pid>/mem to a process that cannot read it")
                })?,
            LaneId::CUDA_IPC => {
                let p = process()?;
                if agreed.get(id).is_none() {
                    return Err(PullEnd::failed(Lanes::scope(id), not_offered(id)));
                }
                LanePeer::CudaIpc(self.ipc.get_or_init(|| Arc::new(IpcPeer::new(p))).clone())
            }
            _ => return Err(PullEnd::failed(Lanes::scope(id), not_offered(id))),
        };
        if agreed.get(id).is_none() {
            return Err(PullEnd::failed(Lanes::scope(id), not_offered(id)));
        }
        Ok(peer)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn scope_of(r: Result<LanePeer, PullEnd>) -> Option<FailureScope> {
        match r {
            Ok(_) => None,
            Err(PullEnd::Failed { scope, .. }) => Some(scope),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lease_is_copied_only_by_a_lane_the_connection_agreed_on() {
        let lanes = Lanes::new(true, None);
        let ids: Vec<_> = lanes.offered().iter().map(|c| c.id).collect();
        assert_eq!(ids, [LaneId::CMA, LaneId::CUDA_IPC, LaneId::PROCMEM]);
        let peers = Peers::default();
        let caps = Caps {
            device: true,
            ..Caps::default()
        };
        // No process proven: nothing is copied, the connection ends.
        let agreed = lanes.agreed(&peers.proven(&caps));
        for id in [LaneId::CMA, LaneId::CUDA_IPC, LaneId::UCX] {
            let end = scope_of(peers.for_lane(id, &agreed));
            assert_eq!(end, Some(FailureScope::Connection), "{id}");
        }
        // A process of this host (this very one): cross-memory attach;
        // CUDA IPC never to itself, and only where both offered it (its
        // failure ends the request alone); an unknown lane ends the
        // connection.
        let me = cma::Peer::open(cma::pid()).expect("attach to this process");
        let _ = peers.process.set(Arc::new(me));
        peers.set_proved(LaneId::CMA);
        let agreed = lanes.agreed(&peers.proven(&caps));
        assert!(matches!(
            peers.for_lane(LaneId::CMA, &agreed),
            Ok(LanePeer::Cma(_))
        ));
        let ipc = scope_of(peers.for_lane(LaneId::CUDA_IPC, &agreed));
        assert_eq!(ipc, Some(FailureScope::Request));
        let unknown = scope_of(peers.for_lane(LaneId(77), &agreed));
        assert_eq!(unknown, Some(FailureScope::Connection));
        // Not offered, whatever the peer: the request alone.
        let Err(PullEnd::Failed { cause, .. }) =
            peers.for_lane(LaneId::CUDA_IPC, &LaneSet::default())
        else {
            panic!("a lane not agreed on copies nothing")
        };
        assert!(cause
            .to_string()
            .contains("CUDA IPC, which this process did not offer"));
        assert_eq!(Lanes::kind(LaneId::CUDA_IPC), TransportKind::CudaIpc);
        assert_eq!(Lanes::kind(LaneId(77)), TransportKind::Tcp);
    }
}
