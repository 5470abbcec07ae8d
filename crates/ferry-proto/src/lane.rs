//! Lanes: the ways a connection moves lent memory (cross-memory attach,
//! UCX, CUDA IPC, ...), as the protocol sees them. A lane declares what it
//! can carry ([`LaneCaps`]); what a connection proved about its peer
//! ([`Proven`]) narrows the lanes a process offers to those the two sides
//! share ([`LaneSet`]); [`session::lane_for`](crate::session::lane_for)
//! then answers which lane, if any, carries an operation. Both sides
//! decide from the same values, so they decide the same way.
//!
//! Nothing here names a lane's mechanism: a lane is an id and its caps.

use std::fmt;

/// A lane's name, on the wire (a [`Lease`](crate::wire::Lease) names the
/// lane that lent it) and in reports. Unknown ids decode: a lane this
/// process does not have is refused where a lease names it, not on the
/// wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub u8);

impl LaneId {
    /// Cross-memory attach (`process_vm_readv`), between processes of one
    /// host.
    pub const CMA: LaneId = LaneId(1);
    /// UCX (RDMA READ, or UCX's CUDA transports).
    pub const UCX: LaneId = LaneId(2);
    /// CUDA IPC: GPU memory between processes of one host.
    pub const CUDA_IPC: LaneId = LaneId(3);
    /// `/proc/<pid>/mem`, between processes of one host (where
    /// `process_vm_readv` is refused).
    pub const PROCMEM: LaneId = LaneId(4);

    /// The lane's name in reports (`lane-N` for one without a name here).
    pub fn name(self) -> String {
        match self {
            LaneId::CMA => "cma".into(),
            LaneId::UCX => "ucx".into(),
            LaneId::CUDA_IPC => "cuda-ipc".into(),
            LaneId::PROCMEM => "procmem".into(),
            LaneId(n) => format!("lane-{n}"),
        }
    }
}

impl fmt::Display for LaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Which kinds of memory: host memory, device (GPU) memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemKinds {
    /// Host memory.
    pub host: bool,
    /// Device (GPU) memory.
    pub device: bool,
}

impl MemKinds {
    /// Host memory only.
    pub const HOST: MemKinds = MemKinds {
        host: true,
        device: false,
    };
    /// Device memory only.
    pub const DEVICE: MemKinds = MemKinds {
        host: false,
        device: true,
    };
    /// Both.
    pub const BOTH: MemKinds = MemKinds {
        host: true,
        device: true,
    };

    /// Whether memory of kind `m` is among these.
    pub fn has(self, m: Mem) -> bool {
        match m {
            Mem::Host => self.host,
            Mem::Device => self.device,
        }
    }
}

/// The kind of one side's memory in an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mem {
    /// Host memory.
    Host,
    /// Device (GPU) memory.
    Device,
}

impl Mem {
    /// `Device` where `device`, else `Host`.
    pub fn of(device: bool) -> Mem {
        if device {
            Mem::Device
        } else {
            Mem::Host
        }
    }
}

/// How far a lane reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Within one process.
    Process,
    /// Between processes of one host.
    Host,
    /// Between hosts.
    Network,
}

/// What a failed copy ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureScope {
    /// The one request: the connection goes on (a copy that fails for
    /// reasons of its own memory).
    Request,
    /// The connection, and with it every request on it (the source went
    /// away, or lent memory it does not have).
    Connection,
}

/// What a lane declares it can do (smoltcp's `DeviceCapabilities`: the
/// planner consults it, never the lane's identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneCaps {
    /// The lane.
    pub id: LaneId,
    /// The memory a source lends through it.
    pub lends: MemKinds,
    /// The memory a destination pulls into through it.
    pub pulls_into: MemKinds,
    /// How far it reaches.
    pub reach: Reach,
    /// Whether it moves memory between two connections of one process (a
    /// connection to itself).
    pub within_process: bool,
    /// What a failed pull ends.
    pub failure: FailureScope,
    /// The lane whose offers prove a peer for it: itself, or the lane it
    /// rides on (CUDA IPC on cross-memory attach's proof).
    pub proven_by: LaneId,
}

impl LaneCaps {
    /// Whether it carries memory of kind `source` into memory of kind
    /// `dest`.
    pub fn carries(&self, source: Mem, dest: Mem) -> bool {
        self.lends.has(source) && self.pulls_into.has(dest)
    }
}

/// What a connection proved about its peer, as the planner needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Proven {
    /// The lane whose offers proved that a side can copy from the other
    /// (a connection proves one: the session sets up no lane after one
    /// proved a way); `None`: none did.
    pub proved_by: Option<LaneId>,
    /// Both sides move device memory by the lanes that proof serves.
    pub device: bool,
    /// The peer is this very process.
    pub same_process: bool,
}

/// The lanes two sides share on one connection, in order of preference,
/// narrowed to what both sides move.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaneSet {
    lanes: Vec<LaneCaps>,
}

impl LaneSet {
    /// The lanes of `offered` (this process's, in order of preference) that
    /// the connection proved (`proven`): those whose peer the proving
    /// lane's offers prove ([`LaneCaps::proven_by`]); device memory only
    /// where both sides move it; no lane that cannot move memory within
    /// one process on a connection to itself.
    pub fn agreed(offered: &[LaneCaps], proven: &Proven) -> LaneSet {
        let lanes = offered
            .iter()
            .filter(|c| proven.proved_by == Some(c.proven_by))
            .filter(|c| c.within_process || !proven.same_process)
            .filter_map(|c| {
                let mut c = *c;
                if !proven.device {
                    c.lends.device = false;
                    c.pulls_into.device = false;
                }
                (c.lends.host || c.lends.device).then_some(c)
            })
            .collect();
        LaneSet { lanes }
    }

    /// The lanes, best first.
    pub fn lanes(&self) -> &[LaneCaps] {
        &self.lanes
    }

    /// The caps of lane `id`, where the connection has it.
    pub fn get(&self, id: LaneId) -> Option<&LaneCaps> {
        self.lanes.iter().find(|c| c.id == id)
    }

    /// The lane through which this side lends memory of kind `source`
    /// (the first that lends it): what a source decides alone.
    pub fn lending(&self, source: Mem) -> Option<LaneId> {
        self.lanes
            .iter()
            .find(|c| c.lends.has(source))
            .map(|c| c.id)
    }

    /// The lane that carries memory of kind `source` into memory of kind
    /// `dest`: the source's lending lane, where it pulls into `dest`. Both
    /// sides agree: a source lends through [`lending`](Self::lending).
    pub fn carrying(&self, source: Mem, dest: Mem) -> Option<LaneId> {
        let id = self.lending(source)?;
        self.get(id)
            .filter(|c| c.pulls_into.has(dest))
            .map(|c| c.id)
    }

    /// Whether the copies of this connection reach another host.
    pub fn reaches_network(&self) -> bool {
        self.lanes.iter().any(|c| c.reach == Reach::Network)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_lane() -> LaneCaps {
        LaneCaps {
            id: LaneId::CMA,
            lends: MemKinds::HOST,
            pulls_into: MemKinds::HOST,
            reach: Reach::Host,
            within_process: true,
            failure: FailureScope::Connection,
            proven_by: LaneId::CMA,
        }
    }

    fn gpu_lane() -> LaneCaps {
        LaneCaps {
            id: LaneId::CUDA_IPC,
            lends: MemKinds::DEVICE,
            pulls_into: MemKinds::BOTH,
            reach: Reach::Host,
            within_process: false,
            failure: FailureScope::Request,
            proven_by: LaneId::CMA,
        }
    }

    fn net_lane() -> LaneCaps {
        LaneCaps {
            id: LaneId::UCX,
            lends: MemKinds::BOTH,
            pulls_into: MemKinds::BOTH,
            reach: Reach::Network,
            within_process: true,
            failure: FailureScope::Connection,
            proven_by: LaneId::UCX,
        }
    }

    #[test]
    fn a_connection_agrees_on_the_lanes_it_proved() {
        use Mem::{Device, Host};
        let offered = [host_lane(), net_lane(), gpu_lane()];
        let attach = Proven {
            proved_by: Some(LaneId::CMA),
            device: true,
            ..Proven::default()
        };
        let s = LaneSet::agreed(&offered, &attach);
        assert_eq!(s.lending(Host), Some(LaneId::CMA));
        assert_eq!(s.lending(Device), Some(LaneId::CUDA_IPC));
        assert_eq!(s.carrying(Device, Host), Some(LaneId::CUDA_IPC));
        assert_eq!(s.carrying(Host, Device), None);
        assert!(!s.reaches_network());
        // Device memory only where both offered it.
        let host_only = Proven {
            device: false,
            ..attach
        };
        let s = LaneSet::agreed(&offered, &host_only);
        assert_eq!(s.lending(Device), None);
        assert_eq!(s.lending(Host), Some(LaneId::CMA));
        // Nothing proved, no lane.
        assert_eq!(
            LaneSet::agreed(&offered, &Proven::default()),
            LaneSet::default()
        );
        // Not to itself by a lane that cannot.
        let itself = Proven {
            same_process: true,
            ..attach
        };
        let s = LaneSet::agreed(&offered, &itself);
        assert_eq!(s.lending(Device), None);
        assert_eq!(s.carrying(Host, Host), Some(LaneId::CMA));
        // A network lane replaces the host lanes; device memory where both
        // sides' lane moves it.
        let net = Proven {
            proved_by: Some(LaneId::UCX),
            device: false,
            ..Proven::default()
        };
        let s = LaneSet::agreed(&offered, &net);
        assert_eq!(s.lanes().len(), 1);
        assert_eq!(s.carrying(Host, Host), Some(LaneId::UCX));
        assert_eq!(s.lending(Device), None);
        assert!(s.reaches_network());
        let s = LaneSet::agreed(
            &offered,
            &Proven {
                device: true,
                ..net
            },
        );
        assert_eq!(s.carrying(Device, Host), Some(LaneId::UCX));
        assert_eq!(s.carrying(Host, Device), Some(LaneId::UCX));
        // Nothing offered, nothing agreed.
        assert_eq!(LaneSet::agreed(&[], &attach), LaneSet::default());
        assert_eq!(LaneId(9).to_string(), "lane-9");
        assert_eq!(LaneId::CUDA_IPC.to_string(), "cuda-ipc");
    }
}
