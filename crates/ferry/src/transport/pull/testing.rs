//! An in-process [`Lane`] for tests: it copies from memory of this
//! process by address, under the same rules as a real backend (through the
//! destination's region, chunk by chunk, sealed last under its lock), and
//! can hold a copy mid-chunk until told to go on ([`Gate`]). It runs the
//! conformance suite without any system facility, and shows the least a
//! backend has to do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, MemKinds, Reach};

use super::registration::Nothing;
use super::{Lane, LaneError, LeaseBlob, PullEnd};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::{Denied, Region};

/// Copies lent memory of this process, `chunk` bytes per copy.
#[derive(Clone)]
pub(super) struct TestPuller {
    pub(super) chunk: usize,
}

/// The source, as a [`TestPuller`] knows it: the memory it lent, whether it
/// is still there, and an optional gate that holds every copy.
pub(super) struct TestPeer {
    /// `(address, length)` of every segment the source lent.
    lent: Vec<(u64, u64)>,
    alive: Arc<AtomicBool>,
    gate: Option<Arc<Gate>>,
}

impl TestPeer {
    /// A source that lent the segments of `regions`; `alive` false: it went
    /// away (later copies fail); `gate`: copies wait there.
    ///
    /// # Safety
    ///
    /// For as long as the peer exists, every segment of every region in
    /// `regions` must be valid for reads and written by nobody (what a
    /// source's lend promises).
    pub(super) unsafe fn new(
        regions: &[&Region],
        alive: Arc<AtomicBool>,
        gate: Option<Arc<Gate>>,
    ) -> TestPeer {
        TestPeer {
            lent: regions.iter().flat_map(|r| r.segments()).collect(),
            alive,
            gate,
        }
    }

    /// Whether `addr..addr + len` lies inside one lent segment.
    fn lent(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.lent
            .iter()
            .any(|&(a, l)| a <= addr && end <= a.saturating_add(l))
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

/// Holds copies mid-chunk: each copy says it is in flight and waits until
/// the gate opens.
#[derive(Default)]
pub(super) struct Gate {
    /// (a copy is waiting, the gate is open)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, bool)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy arrives: it waits until the gate opens.
    fn pass(&self) {
        let mut s = self.lock();
        s.0 = true;
        self.changed.notify_all();
        while !s.1 {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Returns once a copy waits at the gate.
    pub(super) fn wait_stuck(&self) {
        let mut s = self.lock();
        while !s.0 {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Lets every copy through, now and later.
    pub(super) fn open(&self) {
        self.lock().1 = true;
        self.changed.notify_all();
    }
}

/// The test lane's id (no real lane has it).
pub(super) const TEST_LANE: LaneId = LaneId(200);

/// A failed test pull, with `cause`.
fn failure(cause: LaneError) -> PullEnd {
    PullEnd::failed(FailureScope::Connection, cause)
}

impl Lane for TestPuller {
    type Peer = TestPeer;
    type Registration = Nothing;

    fn id(&self) -> LaneId {
        TEST_LANE
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Local
    }

    fn caps(&self) -> LaneCaps {
        LaneCaps {
            id: TEST_LANE,
            lends: MemKinds::HOST,
            pulls_into: MemKinds::HOST,
            reach: Reach::Process,
            within_process: true,
            failure: FailureScope::Connection,
            proven_by: TEST_LANE,
        }
    }

    fn register(&self, _region: &Region) -> Result<Option<Nothing>, LaneError> {
        Ok(None)
    }

    fn lend(&self, region: &Region, _kept: Option<&Nothing>) -> LeaseBlob {
        LeaseBlob::addresses(TEST_LANE, region.segments())
    }

    fn pull(
        &self,
        peer: &TestPeer,
        lease: &LeaseBlob,
        region: &Region,
        shared: &OpShared,
    ) -> PullEnd {
        for (i, &(addr, len)) in lease.segments().iter().enumerate() {
            if !peer.lent(addr, len) {
                return failure(LaneError::NotLent {
                    detail: format!("nothing at {addr:#x}+{len}"),
                });
            }
            let mut off = 0u64;
            while off < len {
                if !peer.alive() {
                    return failure(LaneError::SourceGone {
                        detail: "gone".into(),
                    });
                }
                let n = (len - off).min(self.chunk as u64) as usize;
                let from = (addr + off) as usize as *const u8;
                let r = region.copy_into(i, 1, Some((off, n)), |local| {
                    if let Some(g) = &peer.gate {
                        g.pass();
                    }
                    let (to, m) = local[0];
                    debug_assert_eq!(m, n);
                    // SAFETY: `from..from + n` lies inside one segment the
                    // source lent (checked above: `addr..addr + len` does,
                    // and `off + n <= len`), valid for reads and written by
                    // nobody while `peer` exists (`TestPeer::new`); `to` is
                    // `n` bytes of the destination that `copy_into` reserves
                    // for this copy until we return, valid for writes and
                    // touched by nothing else. The two do not overlap: the
                    // lent memory is written by nobody, this memory is
                    // being written.
                    unsafe { std::ptr::copy_nonoverlapping(from, to, n) }
                });
                match r {
                    Ok(()) => off += n as u64,
                    Err(Denied::Closed) => return PullEnd::Closed,
                    Err(Denied::NotHostMemory) => return failure(LaneError::NotHostMemory),
                    Err(Denied::OutOfBounds) => return failure(LaneError::LeaseTooLarge),
                }
            }
        }
        // The last word from the source before the seal.
        if !peer.alive() {
            return failure(LaneError::SourceGone {
                detail: "gone".into(),
            });
        }
        if region.seal_if_open(|| shared.seal()) {
            PullEnd::Done
        } else {
            PullEnd::Closed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::pull::conformance::{
        host_source, Applies, Backend, Mem, Mortal, Source, Stalled,
    };
    use ferry_proto::DeviceKind;

    /// The test puller, with a small chunk so that every test crosses many
    /// chunks.
    pub(super) struct TestBackend(TestPuller);

    impl Default for TestBackend {
        fn default() -> Self {
            TestBackend(TestPuller { chunk: 64 * 1024 })
        }
    }

    impl Backend for TestBackend {
        type P = TestPuller;

        fn puller(&self) -> &TestPuller {
            &self.0
        }

        fn chunk(&self, _into: DeviceKind) -> usize {
            self.0.chunk
        }

        fn source(&self, sizes: &[usize]) -> Source<TestPeer> {
            host_source(&self.0, sizes, |src| {
                // SAFETY: the source's memory stays, unwritten, until after
                // the peer is dropped (`host_source`).
                unsafe { TestPeer::new(&[&**src], Arc::new(AtomicBool::new(true)), None) }
            })
        }

        fn mortal_source(&self, sizes: &[usize]) -> Applies<Mortal<TestPeer>> {
            let alive = Arc::new(AtomicBool::new(true));
            let source = host_source(&self.0, sizes, |src| {
                // SAFETY: as in `source`.
                unsafe { TestPeer::new(&[&**src], alive.clone(), None) }
            });
            Ok((
                source,
                Box::new(move || alive.store(false, Ordering::Release)),
            ))
        }

        fn stalled_source(&self, len: usize) -> Applies<Stalled<TestPeer>> {
            let mem = Mem::new(vec![vec![0x55; len]], false);
            let gate = Arc::new(Gate::default());
            let alive = Arc::new(AtomicBool::new(true));
            // SAFETY: `mem` goes into the source's end, which runs after its
            // peer is dropped; nothing writes it.
            let peer = unsafe { TestPeer::new(&[&mem.region], alive, Some(gate.clone())) };
            let lease = self.0.lend(&mem.region, None);
            mem.region.lend();
            let stuck = gate.clone();
            Ok(Stalled {
                source: Source::new(
                    lease,
                    peer,
                    Box::new(move || {
                        mem.region.give_back();
                        drop(mem);
                    }),
                ),
                stuck: Box::new(move |_| stuck.wait_stuck()),
                release: Box::new(move || gate.open()),
            })
        }
    }

    mod conformance {
        use super::TestBackend;
        use crate::transport::pull::conformance::conformance_tests;

        conformance_tests!(TestBackend::default());
    }

    #[test]
    fn the_test_puller_reads_only_what_was_lent() {
        let p = TestPuller { chunk: 4 };
        assert_eq!(p.kind(), TransportKind::Local);
        assert_eq!(p.caps().lends, MemKinds::HOST);
        let src = Mem::new(vec![vec![9; 10]], false);
        let dst = Mem::new(vec![vec![0; 12]], true);
        // SAFETY: `src` outlives the peer and nothing writes it.
        let peer = unsafe { TestPeer::new(&[&src.region], Arc::new(AtomicBool::new(true)), None) };
        let (addr, _) = src.region.segments()[0];
        // Two bytes past the lent segment: refused before any copy.
        let past = LeaseBlob::addresses(TEST_LANE, vec![(addr, 12)]);
        let shared = OpShared::new(ferry_proto::OperationStatus::InProgress);
        assert!(matches!(
            p.pull(&peer, &past, &dst.region, &shared),
            PullEnd::Failed {
                cause: LaneError::NotLent { .. },
                ..
            }
        ));
        assert!(dst.bytes(0).iter().all(|&b| b == 0) && !shared.is_sealed());
    }
}
