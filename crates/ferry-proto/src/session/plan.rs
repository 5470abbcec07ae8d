//! How one operation's bytes will move: the one place that answers it, for
//! the side that starts the operation ([`route`], [`plan`]) and for the
//! side that serves it ([`can_lend`], [`LaneSet::lending`]): which lane, if
//! any, carries it ([`lane_for`]), from the lanes' declared caps, both
//! sides' memory kinds and what the connection proved.

use super::Caps;
use crate::lane::{LaneId, LaneSet, Mem};
use crate::runs::{run_count, Runs, MAX_RUNS};
use crate::wire::{Open, MAX_LEASE_SEGMENTS, MAX_PARTS};
use crate::OperationKind;

/// What every refusal of device memory in band says: the one way it moves
/// where the side that holds it cannot stage it.
pub const DEVICE_MEMORY_BY_IPC_ONLY: &str =
    "GPU memory that its holder cannot stage through host memory moves only by lending: \
     CUDA IPC between processes of one host, or UCX that moves CUDA memory on both sides";

/// The thresholds of a connector (from its builder and environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Transfers of at least this many bytes move by lending memory (cross
    /// memory attach) when the connection allows it.
    pub pull_from: u64,
    /// Transfers of at least this many bytes that move in band are split
    /// over several connections.
    pub stripe_from: u64,
    /// Over how many connections (1: never split).
    pub streams: u16,
}

/// How an active operation's bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The source lends its memory and the destination copies it (a READ
    /// asks for a lease; the passive side may still answer with data).
    Pull,
    /// `Data` frames on one connection.
    Stream,
    /// `Data` frames on `parts` connections, each a contiguous part (the
    /// driver may get fewer connections: then fewer parts, or `Stream`).
    Striped {
        /// 2 to [`MAX_PARTS`].
        parts: u16,
    },
}

/// How an operation of `kind` over descriptors of `sizes` moves on a
/// connection whose handshake found `caps`, given the connector's
/// `thresholds`.
pub fn plan(kind: OperationKind, sizes: &[u64], caps: Caps, thresholds: &Thresholds) -> Plan {
    let total = sizes.iter().fold(0u64, |a, s| a.saturating_add(*s));
    let lends = match kind {
        // This side copies from the peer.
        OperationKind::Read => caps.can_pull,
        // The peer copies from this side.
        OperationKind::Write => caps.peer_pulls,
    };
    if caps.attach && lends && total >= thresholds.pull_from && fits_lease(sizes) {
        return Plan::Pull;
    }
    if thresholds.streams <= 1 || total < thresholds.stripe_from {
        return Plan::Stream;
    }
    let parts = u64::from(thresholds.streams.min(MAX_PARTS)).min(total);
    Plan::Striped {
        parts: parts as u16,
    }
}

/// The lane that carries an operation of `kind` between this side's memory
/// (`local`) and the peer's (`remote`) on a connection whose lanes are
/// `lanes` and whose handshake found `caps`: the lane the source lends its
/// memory by, where it pulls into the destination's memory and the
/// destination proved it can copy from the source. `None`: the bytes
/// move in band.
pub fn lane_for(
    kind: OperationKind,
    local: Mem,
    remote: Mem,
    lanes: &LaneSet,
    caps: Caps,
) -> Option<LaneId> {
    let (pulls, source, dest) = match kind {
        // This side copies from the peer.
        OperationKind::Read => (caps.can_pull, remote, local),
        // The peer copies from this side.
        OperationKind::Write => (caps.peer_pulls, local, remote),
    };
    if !pulls {
        return None;
    }
    lanes.carrying(source, dest)
}

/// How an active operation moves ([`plan`]), where `lane` (from
/// [`lane_for`]) would carry it: never lent where no lane carries it (a
/// lane that cannot copy it now is none: the driver passes `None` where
/// this process has no copy slot free); host memory on both sides is lent
/// from the connector's threshold on (`thresholds.pull_from`); memory on a
/// device (either side) is lent whatever its size (else each side stages
/// its own through host memory).
pub fn route(
    kind: OperationKind,
    sizes: &[u64],
    memory: (Mem, Mem),
    lane: Option<LaneId>,
    caps: Caps,
    thresholds: &Thresholds,
) -> Plan {
    let device = memory.0 == Mem::Device || memory.1 == Mem::Device;
    let pull_from = match (device, lane) {
        (_, None) => u64::MAX,
        (false, Some(_)) => thresholds.pull_from,
        (true, Some(_)) => 0,
    };
    let t = Thresholds {
        pull_from,
        ..*thresholds
    };
    plan(kind, sizes, caps, &t)
}

/// The caps the passive side's exposure table checks device memory
/// against on a connection whose lanes are `lanes`: where a lane reaches
/// the network, nothing is lent by attach (that lane lends device memory
/// where [`Caps::device`] says so).
pub fn table_caps(caps: Caps, lanes: &LaneSet) -> Caps {
    Caps {
        attach: caps.attach && !lanes.reaches_network(),
        ..caps
    }
}

/// Whether the passive side lends its memory for a READ that asked for a
/// lease (else it streams the bytes: the fallback). Device memory
/// (`device`) is lent only where the connection lends it
/// ([`Caps::lends_device`]: CUDA IPC offered by both sides, or UCX that
/// moves CUDA memory on both).
pub fn can_lend(sizes: &[u64], device: bool, caps: Caps) -> bool {
    can_lend_shape(fits_lease(sizes), device, caps)
}

fn can_lend_shape(fits: bool, device: bool, caps: Caps) -> bool {
    caps.attach && caps.peer_pulls && fits && (caps.lends_device() || !device)
}

/// [`can_lend`] for sizes kept as runs (an `Open`'s), without expanding
/// them.
fn can_lend_runs(sizes: &Runs, device: bool, caps: Caps) -> bool {
    let fits = sizes.len() <= MAX_LEASE_SEGMENTS && sizes.run_count() <= MAX_RUNS;
    can_lend_shape(fits, device, caps)
}

/// Whether the passive side lends its memory (`device`: device memory)
/// for request `o`: a READ of its own (not a striped part) that asked for
/// a lease, which [`can_lend`] allows on a connection with `caps`. Else
/// a READ's bytes stream.
pub fn lends(o: &Open, device: bool, caps: Caps) -> bool {
    o.kind == OperationKind::Read && o.pull && o.parts <= 1 && can_lend_runs(&o.sizes, device, caps)
}

/// Why the passive side refuses request `o` over *device* memory (GPU) that
/// it cannot stage through host memory (see
/// [`Fence::moves_in_band`](super::Fence::moves_in_band)), on a connection
/// whose handshake found `caps`; `None` where the request
/// moves it by lending, the one way device memory moves: a READ that asked
/// for a lease and that this side can lend ([`can_lend`]: else it would
/// fall back to streaming), or a WRITE that will lend to this side (which
/// can copy from the peer). A striped part, or any request that asked for
/// in-band bytes, is refused. Host memory is never refused here.
pub fn device_refusal(o: &Open, caps: Caps) -> Option<String> {
    let why = if o.parts > 1 {
        "a striped transfer moves in band"
    } else if !o.pull {
        "the peer asked for in-band bytes (it cannot copy from this process: another host, \
         or cross-memory attach disabled or refused on this connection)"
    } else {
        match o.kind {
            _ if !caps.lends_device() => {
                "the two processes did not both offer CUDA IPC on this connection (no CUDA \
                 driver that sees a device on one of them), nor both run a UCX that moves \
                 CUDA memory"
            }
            OperationKind::Read if !can_lend_runs(&o.sizes, true, caps) => {
                "this connection cannot lend memory to the peer (no cross-memory attach both \
                 ways, or too many descriptors for one lease)"
            }
            OperationKind::Write if !(caps.attach && caps.can_pull) => {
                "this process cannot copy from the peer on this connection (no cross-memory \
                 attach, nor UCX)"
            }
            _ => return None,
        }
    };
    Some(format!("{DEVICE_MEMORY_BY_IPC_ONLY}: {why}"))
}

/// Whether one `Lease` can describe memory of these sizes: at most
/// [`MAX_LEASE_SEGMENTS`] segments whose lengths form at most
/// [`MAX_RUNS`] runs.
fn fits_lease(sizes: &[u64]) -> bool {
    sizes.len() <= MAX_LEASE_SEGMENTS && run_count(sizes) <= MAX_RUNS
}

/// Sizes that no lease can describe: more runs of lengths than one lease
/// carries (for tests).
#[cfg(test)]
pub(crate) fn unlendable() -> Vec<u64> {
    (0..=MAX_RUNS as u64).map(|i| 1 + (i & 1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        pull_from: 1024,
        stripe_from: 1 << 20,
        streams: 4,
    };

    fn caps(can_pull: bool, peer_pulls: bool) -> Caps {
        Caps {
            attach: true,
            can_pull,
            peer_pulls,
            secret: false,
            device: true,
        }
    }

    #[test]
    fn exactly_one_way_for_each_shape() {
        use OperationKind::{Read, Write};
        // Lending needs attach, the right direction, and enough bytes.
        assert_eq!(plan(Read, &[4096], caps(true, false), &T), Plan::Pull);
        assert_eq!(plan(Write, &[4096], caps(true, false), &T), Plan::Stream);
        assert_eq!(plan(Write, &[4096], caps(false, true), &T), Plan::Pull);
        assert_eq!(plan(Read, &[512], caps(true, true), &T), Plan::Stream);
        let off = Caps {
            attach: false,
            ..caps(true, true)
        };
        assert_eq!(plan(Read, &[4096], off, &T), Plan::Stream);
        // Too many runs of lengths for one lease.
        let many = unlendable();
        assert_eq!(plan(Read, &many, caps(true, true), &T), Plan::Stream);
        // Large, not lent: striped, never more parts than bytes or MAX_PARTS.
        let none = caps(false, false);
        assert_eq!(plan(Read, &[8 << 20], none, &T), Plan::Striped { parts: 4 });
        let wide = Thresholds {
            streams: 64,
            stripe_from: 1,
            ..T
        };
        assert_eq!(plan(Write, &[3], none, &wide), Plan::Striped { parts: 3 });
        assert_eq!(
            plan(Write, &[1 << 30], none, &wide),
            Plan::Striped { parts: MAX_PARTS }
        );
        let one = Thresholds { streams: 1, ..T };
        assert_eq!(plan(Write, &[1 << 30], none, &one), Plan::Stream);
    }

    fn open(kind: OperationKind, pull: bool, parts: u16) -> Open {
        Open {
            req: 1,
            op_id: 2,
            token: crate::Token::from_bytes([1; 16]),
            kind,
            sizes: vec![4096].into(),
            pull,
            part: 0,
            parts,
        }
    }

    #[test]
    fn device_memory_is_refused_unless_it_is_lent() {
        use OperationKind::{Read, Write};
        let both = caps(true, true);
        // Lent: a pulled READ this side can lend, a pulled WRITE it can copy.
        assert_eq!(device_refusal(&open(Read, true, 1), both), None);
        assert_eq!(device_refusal(&open(Write, true, 1), both), None);
        assert_eq!(
            device_refusal(&open(Write, true, 1), caps(true, false)),
            None
        );
        // In band, whatever the caps: not pulled, or striped.
        for kind in [Read, Write] {
            for c in [both, caps(false, false)] {
                let why = device_refusal(&open(kind, false, 1), c).unwrap();
                assert!(why.starts_with(DEVICE_MEMORY_BY_IPC_ONLY), "{why}");
                assert!(why.contains("in-band"), "{why}");
                let why = device_refusal(&open(kind, true, 4), c).unwrap();
                assert!(why.contains("striped"), "{why}");
            }
        }
        // The fallbacks to streaming: a READ this side cannot lend (the
        // peer cannot pull, or too many runs), a WRITE it cannot pull.
        let why = device_refusal(&open(Read, true, 1), caps(true, false)).unwrap();
        assert!(why.contains("cannot lend"), "{why}");
        let many = Open {
            sizes: unlendable().into(),
            ..open(Read, true, 1)
        };
        assert!(device_refusal(&many, both).unwrap().contains("cannot lend"));
        let why = device_refusal(&open(Write, true, 1), caps(false, true)).unwrap();
        assert!(why.contains("cannot copy"), "{why}");
        let off = Caps {
            attach: false,
            ..both
        };
        assert!(device_refusal(&open(Read, true, 1), off).is_some());
        assert!(device_refusal(&open(Write, true, 1), off).is_some());
        // Lent only where both processes offered CUDA IPC.
        let no_ipc = Caps {
            device: false,
            ..both
        };
        for kind in [Read, Write] {
            let why = device_refusal(&open(kind, true, 1), no_ipc).unwrap();
            assert!(why.contains("did not both offer CUDA IPC"), "{why}");
        }
    }

    /// The lanes of a connection where both sides offered the host lanes
    /// (`gpu`: device memory too), or set up a network lane.
    fn lanes(network: bool, gpu: bool) -> LaneSet {
        use crate::lane::{FailureScope, LaneCaps, MemKinds, Proven, Reach};
        let lane = |id, lends, pulls_into, reach, within_process| LaneCaps {
            id,
            lends,
            pulls_into,
            reach,
            within_process,
            failure: FailureScope::Connection,
            // CUDA IPC rides on cross-memory attach's proof.
            proven_by: if id == LaneId::UCX {
                LaneId::UCX
            } else {
                LaneId::CMA
            },
        };
        let offered = [
            lane(
                LaneId::CMA,
                MemKinds::HOST,
                MemKinds::HOST,
                Reach::Host,
                true,
            ),
            lane(
                LaneId::UCX,
                MemKinds::BOTH,
                MemKinds::BOTH,
                Reach::Network,
                true,
            ),
            lane(
                LaneId::CUDA_IPC,
                MemKinds::DEVICE,
                MemKinds::BOTH,
                Reach::Host,
                false,
            ),
        ];
        let proven = Proven {
            proved_by: Some(if network { LaneId::UCX } else { LaneId::CMA }),
            device: gpu,
            same_process: false,
        };
        LaneSet::agreed(&offered, &proven)
    }

    #[test]
    fn one_lane_or_none_for_each_pair_of_memories() {
        use Mem::{Device, Host};
        use OperationKind::{Read, Write};
        let both = caps(true, true);
        let attach = lanes(false, true);
        // Host memory by cross-memory attach, device memory lent by CUDA
        // IPC into either; host memory is never lent into a device.
        assert_eq!(lane_for(Read, Host, Host, &attach, both), Some(LaneId::CMA));
        assert_eq!(
            lane_for(Read, Host, Device, &attach, both),
            Some(LaneId::CUDA_IPC)
        );
        assert_eq!(
            lane_for(Write, Device, Host, &attach, both),
            Some(LaneId::CUDA_IPC)
        );
        assert_eq!(lane_for(Read, Device, Host, &attach, both), None);
        assert_eq!(lane_for(Write, Host, Device, &attach, both), None);
        // Only where the destination can copy from the source.
        assert_eq!(lane_for(Read, Host, Host, &attach, caps(false, true)), None);
        assert_eq!(
            lane_for(Write, Host, Host, &attach, caps(true, false)),
            None
        );
        // Without device memory on both sides: only host memory is lent.
        let host_only = lanes(false, false);
        assert_eq!(lane_for(Write, Device, Host, &host_only, both), None);
        // Over a network lane, it carries everything it moves on both sides.
        let net = lanes(true, true);
        assert_eq!(
            lane_for(Read, Device, Device, &net, both),
            Some(LaneId::UCX)
        );
        assert_eq!(lane_for(Write, Host, Host, &net, both), Some(LaneId::UCX));
        assert_eq!(
            lane_for(Write, Device, Host, &lanes(true, false), both),
            None
        );
        // And the plan follows: device memory lent whatever its size where
        // a lane carries it, never where none does; host memory from the
        // threshold on.
        let small = [16];
        let gpu = (Device, Host);
        let ipc = Some(LaneId::CUDA_IPC);
        assert_eq!(route(Write, &small, gpu, ipc, both, &T), Plan::Pull);
        assert_eq!(route(Write, &small, gpu, None, both, &T), Plan::Stream);
        assert_eq!(
            route(Write, &[1 << 30], gpu, None, both, &T),
            Plan::Striped { parts: 4 }
        );
        let host = (Host, Host);
        let cma = Some(LaneId::CMA);
        assert_eq!(route(Read, &small, host, cma, both, &T), Plan::Stream);
        assert_eq!(route(Read, &[4096], host, cma, both, &T), Plan::Pull);
        // No lane (none carries it, or none can copy it now): in band.
        assert_eq!(route(Read, &[4096], host, None, both, &T), Plan::Stream);
        // The exposure table sees no attach lending over a network lane.
        assert!(!table_caps(both, &net).attach);
        assert!(table_caps(both, &attach).attach);
    }

    /// Whatever the memories and the connection, the lane the active side
    /// plans by is the one the source lends by (`LaneSet::lending`), so
    /// that both sides decide the same way.
    #[test]
    fn both_sides_choose_the_same_lane() {
        use Mem::{Device, Host};
        for (network, gpu) in [(false, false), (false, true), (true, false), (true, true)] {
            let set = lanes(network, gpu);
            for kind in [OperationKind::Read, OperationKind::Write] {
                for (local, remote) in [
                    (Host, Host),
                    (Host, Device),
                    (Device, Host),
                    (Device, Device),
                ] {
                    let Some(l) = lane_for(kind, local, remote, &set, caps(true, true)) else {
                        continue;
                    };
                    let source = if kind == OperationKind::Read {
                        remote
                    } else {
                        local
                    };
                    assert_eq!(
                        set.lending(source),
                        Some(l),
                        "{kind:?} {local:?} {remote:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_passive_side_lends_only_to_a_peer_that_pulls() {
        for device in [false, true] {
            assert!(can_lend(&[1], device, caps(false, true)));
            assert!(!can_lend(&[1], device, caps(true, false)));
            assert!(!can_lend(&unlendable(), device, caps(true, true)));
            assert!(can_lend(
                &vec![1; MAX_LEASE_SEGMENTS],
                device,
                caps(true, true)
            ));
        }
        // Device memory needs CUDA IPC offered by both; host memory not.
        let no_ipc = Caps {
            device: false,
            ..caps(true, true)
        };
        assert!(can_lend(&[1], false, no_ipc));
        assert!(!can_lend(&[1], true, no_ipc));
    }
}
