//! The suite every [`Lane`] must pass: lend then pull, a region closed
//! before the pull, a cancel while a copy is stuck mid-chunk, a close while
//! a long pull runs, a source that goes away, a lease of memory the source
//! does not have. A backend supplies its sources ([`Backend`]) and runs the
//! whole suite with [`conformance_tests!`](conformance_tests).
//!
//! The destination is only ever read by the test when no copy can touch it:
//! after the pull returned, or once its region is closed and quiet
//! ([`Region::wait_quiet`]): from then on the fence guarantees that no copy
//! starts, so reading it races with nothing.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::OperationStatus;

use super::{lend_kept, register_kept, Lane, LeaseBlob, PullEnd};
use crate::outcome::OpShared;
use crate::region::Region;
use crate::Descriptor;

/// What a destination holds before any byte lands; a stalled source's
/// bytes must differ from it.
pub(super) const FILL: u8 = 0xAA;

/// Generous bound for what must be prompt; speed is not what is tested.
const PROMPT: Duration = Duration::from_secs(10);

/// The peer type of a backend's puller.
pub(super) type PeerOf<B> = <<B as Backend>::P as Lane>::Peer;

/// What the suite needs of a backend besides its [`Lane`]: sources to
/// pull from, in this process (or a copy of it).
pub(super) trait Backend {
    type P: Lane;

    fn puller(&self) -> &Self::P;

    /// The most bytes one copy of the puller moves (its chunk).
    fn chunk(&self) -> usize;

    /// The most copies one pull of `len` bytes runs at once (threads that
    /// share its chunks): so many chunks may be in flight when a close
    /// comes.
    fn copiers(&self, len: usize) -> usize {
        let _ = len;
        1
    }

    /// The peer of a live source that lent `src` (memory of this process).
    ///
    /// # Safety
    ///
    /// Every segment of `src` must stay valid for reads, and be written by
    /// nobody, for as long as the returned peer exists (what a source's
    /// lend promises).
    unsafe fn source(&self, src: &Arc<Region>) -> PeerOf<Self>;

    /// The peer of a source that lent `src` and goes away (its process
    /// exits, the connection is lost) when the returned closure is called.
    ///
    /// # Safety
    ///
    /// As for [`source`](Self::source).
    unsafe fn mortal_source(&self, src: &Arc<Region>) -> (PeerOf<Self>, Box<dyn FnOnce()>);

    /// `len` bytes of source memory (one segment, none of them [`FILL`])
    /// whose first copy gets stuck until released; `None` where the backend
    /// cannot stall a copy here (the test is then skipped, and says so).
    fn stalled_source(&self, len: usize) -> Option<Stalled<PeerOf<Self>>>;
}

/// A source whose copies get stuck (see [`Backend::stalled_source`]).
pub(super) struct Stalled<Peer> {
    /// The source's region, over the stalling memory (one segment).
    pub(super) region: Arc<Region>,
    pub(super) peer: Peer,
    /// Returns once a copy is in flight and stuck in that memory.
    pub(super) stuck: Box<dyn FnOnce()>,
    /// Lets stuck copies go on (and later ones through).
    pub(super) release: Box<dyn FnOnce()>,
    /// Whatever keeps the memory alive; dropped after the region.
    pub(super) keep: Box<dyn Any>,
}

/// Owned buffers and a region over them, closed (and waited for) on drop.
pub(super) struct Mem {
    pub(super) region: Arc<Region>,
    descs: Vec<Descriptor<'static>>,
}

impl Mem {
    pub(super) fn new(bufs: Vec<Vec<u8>>, writable: bool) -> Mem {
        let descs: Vec<_> = bufs.into_iter().map(Descriptor::from_vec).collect();
        // SAFETY: the descriptors own their memory and live in `Mem` next
        // to the region; `Drop` closes the region and waits for copies in
        // flight before they are freed (or leaks them); the test reads them
        // only while no copy can touch them (see the module).
        let region = Arc::new(unsafe { Region::new(&descs, writable) });
        Mem { region, descs }
    }

    /// The bytes of segment `i`: only while no copy can write them.
    pub(super) fn bytes(&self, i: usize) -> &[u8] {
        self.descs[i].as_slice().expect("host memory")
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        self.region.close();
        if !self.region.wait_quiet(PROMPT) {
            // A copy is still stuck in it: the memory must outlive it.
            std::mem::forget(std::mem::take(&mut self.descs));
        }
    }
}

/// `n` bytes that tell segment `i`'s position `j` apart.
pub(super) fn pattern(i: usize, n: usize) -> Vec<u8> {
    (0..n).map(|j| ((i * 31 + j) % 251) as u8).collect()
}

/// A digest of `bytes`, to compare large buffers without a copy.
fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

fn op() -> Arc<OpShared> {
    OpShared::new(OperationStatus::InProgress)
}

/// (a) Lend, then pull: every byte of several segments lands (small ones,
/// an empty one, more in a row than one vectored call takes, some larger
/// than a chunk: more bytes than a copy by several threads needs), and the
/// operation is sealed, the region left open.
pub(super) fn lend_then_pull_moves_every_byte_and_seals<B: Backend>(b: &B) {
    let p = b.puller();
    let mut sizes = vec![1, 100, 0, 4096, 3, 2 * b.chunk() + 17, 5];
    sizes.extend(std::iter::repeat_n(1, 1100));
    sizes.extend([4 * b.chunk() + 9, 7]);
    sizes.extend(std::iter::repeat_n(3000, 900));
    let src = Mem::new(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(i, n))
            .collect(),
        false,
    );
    let dst = Mem::new(sizes.iter().map(|&n| vec![FILL; n]).collect(), true);
    register_kept(p, &src.region).expect("register the source");
    let kept = p.register(&dst.region).expect("register the destination");
    let lease = lend_kept(p, &src.region);
    assert_eq!(lease.lane(), p.id(), "a lease names its lane");
    assert!(lease.fits(&src.region), "a lease describes what was lent");
    assert!(lease.fits(&dst.region));
    src.region.lend();
    // SAFETY: `src` outlives the peer (declared before it) and nothing
    // writes it.
    let peer = unsafe { b.source(&src.region) };
    let shared = op();
    assert_eq!(p.pull(&peer, &lease, &dst.region, &shared), PullEnd::Done);
    assert!(shared.is_sealed(), "Done means sealed");
    assert!(dst.region.is_open(), "the puller leaves the region open");
    assert!(dst.region.is_quiet());
    for i in 0..sizes.len() {
        assert!(dst.bytes(i) == src.bytes(i), "segment {i} differs");
    }
    src.region.give_back();
    assert!(!src.region.is_lent());
    // The source's registration ended with its last lease; the
    // destination's with the pull.
    assert!(src.region.lease_state(|s| s.is_none()));
    drop(kept);
}

/// (b) A region closed before the pull: `Closed`, not sealed, no byte
/// written (whether the lease starts with small segments or a large one;
/// with nothing to copy, the seal alone must see the close).
pub(super) fn a_region_closed_before_the_pull_gets_no_byte<B: Backend>(b: &B) {
    let p = b.puller();
    for sizes in [vec![3, 5, 2 * b.chunk()], vec![2 * b.chunk()], vec![0]] {
        let src = Mem::new(
            sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| pattern(i, n))
                .collect(),
            false,
        );
        let dst = Mem::new(sizes.iter().map(|&n| vec![FILL; n]).collect(), true);
        let lease = lend_kept(p, &src.region);
        // SAFETY: `src` outlives the peer and nothing writes it.
        let peer = unsafe { b.source(&src.region) };
        dst.region.close();
        let shared = op();
        assert_eq!(p.pull(&peer, &lease, &dst.region, &shared), PullEnd::Closed);
        assert!(!shared.is_sealed());
        assert!(dst.region.is_quiet());
        for i in 0..sizes.len() {
            assert!(
                dst.bytes(i).iter().all(|&x| x == FILL),
                "segment {i} written"
            );
        }
    }
}

/// (c) A cancel while a copy is stuck mid-chunk: `close` returns without
/// waiting for it (the region counts it), the pull ends `Closed`, never
/// `Done`, not sealed, and once the stuck copies returned nothing but their
/// own chunks was written (the first, or the first few where the pull's
/// chunks are shared among threads): no copy started after the close.
pub(super) fn a_cancel_mid_chunk_lands_nothing_after_the_close<B: Backend>(b: &B) {
    let p = b.puller();
    let len = 4 * b.chunk();
    let Some(s) = b.stalled_source(len) else {
        return;
    };
    let Stalled {
        region: src,
        peer,
        stuck,
        release,
        keep,
    } = s;
    let dst = Mem::new(vec![vec![FILL; len]], true);
    let lease = lend_kept(p, &src);
    src.lend();
    let shared = op();
    let end = std::thread::scope(|scope| {
        let pull = scope.spawn(|| p.pull(&peer, &lease, &dst.region, &shared));
        stuck();
        assert!(!dst.region.is_quiet(), "a copy is in flight");
        let t = Instant::now();
        dst.region.close();
        assert!(t.elapsed() < PROMPT, "close waited for a stuck copy");
        assert!(!dst.region.is_quiet(), "the stuck copy is still counted");
        assert!(!shared.is_sealed());
        release();
        pull.join().expect("the pull panicked")
    });
    assert_eq!(end, PullEnd::Closed);
    assert!(!shared.is_sealed());
    assert!(dst.region.wait_quiet(PROMPT));
    let d = dst.bytes(0);
    let in_flight = b.copiers(len).min(4);
    assert!(
        d[in_flight * b.chunk()..].iter().all(|&x| x == FILL),
        "bytes past the stuck chunks landed after the close"
    );
    src.give_back();
    src.close();
    drop((peer, src, keep));
}

/// (c') A close while a long pull runs (as soon as a copy is seen in
/// flight): the pull ends `Closed` unsealed or, had it sealed first,
/// `Done` sealed; once the close returned and the copy in flight ended,
/// the destination never changes again.
pub(super) fn a_close_during_a_long_pull_freezes_the_destination<B: Backend>(b: &B) {
    let p = b.puller();
    // Long enough (many chunks, several of a scheduler's time slices) that
    // this thread runs while the pull does, even on a busy machine.
    let len = (16 * b.chunk()).max(128 << 20);
    let src = Mem::new(vec![pattern(0, len)], false);
    let lease = lend_kept(p, &src.region);
    // SAFETY: `src` outlives the peer and nothing writes it.
    let peer = unsafe { b.source(&src.region) };
    // A close that comes too late (the pull ended first: a busy machine
    // may not run this thread meanwhile) proves little: try again.
    let mut closed = false;
    for _ in 0..10 {
        let dst = Mem::new(vec![vec![FILL; len]], true);
        let shared = op();
        let running = AtomicBool::new(true);
        let (end, frozen) = std::thread::scope(|scope| {
            let pull = scope.spawn(|| {
                let end = p.pull(&peer, &lease, &dst.region, &shared);
                running.store(false, Ordering::Release);
                end
            });
            while running.load(Ordering::Acquire) && dst.region.is_quiet() {
                std::hint::spin_loop();
            }
            dst.region.close();
            assert!(dst.region.wait_quiet(PROMPT), "a copy did not return");
            // Closed and quiet: no copy touches the memory any more.
            let frozen = digest(dst.bytes(0));
            (pull.join().expect("the pull panicked"), frozen)
        });
        assert_eq!(
            digest(dst.bytes(0)),
            frozen,
            "a byte landed after the close"
        );
        match end {
            PullEnd::Done => assert!(shared.is_sealed()),
            PullEnd::Closed => assert!(!shared.is_sealed()),
            PullEnd::Failed { cause, .. } => panic!("the pull failed: {cause}"),
        }
        if end == PullEnd::Closed {
            closed = true;
            break;
        }
    }
    assert!(closed, "every pull finished before its close");
}

/// (d) The source goes away (its process exits, the connection is lost):
/// a pull from it fails and never seals, after one before the loss moved
/// every byte.
pub(super) fn a_lost_source_fails_the_pull_unsealed<B: Backend>(b: &B) {
    let p = b.puller();
    let sizes = [4096, 3, b.chunk() + 1];
    let src = Mem::new(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(i, n))
            .collect(),
        false,
    );
    let lease = lend_kept(p, &src.region);
    src.region.lend();
    // SAFETY: `src` outlives the peer and nothing writes it.
    let (peer, lose) = unsafe { b.mortal_source(&src.region) };
    let dst = Mem::new(sizes.iter().map(|&n| vec![FILL; n]).collect(), true);
    let shared = op();
    assert_eq!(p.pull(&peer, &lease, &dst.region, &shared), PullEnd::Done);
    for i in 0..sizes.len() {
        assert!(dst.bytes(i) == src.bytes(i), "segment {i} differs");
    }
    lose();
    let dst = Mem::new(sizes.iter().map(|&n| vec![FILL; n]).collect(), true);
    let shared = op();
    match p.pull(&peer, &lease, &dst.region, &shared) {
        PullEnd::Failed { cause, .. } => assert!(!cause.to_string().is_empty()),
        other => panic!("a pull from a source that went away ended {other:?}"),
    }
    assert!(!shared.is_sealed(), "a failed pull sealed");
    assert!(dst.region.is_open(), "the puller leaves the region open");
    assert!(dst.region.is_quiet());
    // The connection's end gives the lease back.
    src.region.give_back();
}

/// (d') A lease of memory the source does not have (an address that is
/// mapped nowhere) fails the pull: no crash, no seal.
pub(super) fn a_lease_of_memory_the_source_lacks_fails<B: Backend>(b: &B) {
    let p = b.puller();
    let src = Mem::new(vec![pattern(0, 64)], false);
    // SAFETY: `src` outlives the peer and nothing writes it.
    let peer = unsafe { b.source(&src.region) };
    for sizes in [vec![4096], vec![16, 16]] {
        let dst = Mem::new(sizes.iter().map(|&n| vec![FILL; n]).collect(), true);
        // Page 0 is never mapped (`vm.mmap_min_addr`).
        let bogus = LeaseBlob::addresses(p.id(), sizes.iter().map(|&n| (8, n as u64)).collect());
        assert!(bogus.fits(&dst.region));
        let shared = op();
        match p.pull(&peer, &bogus, &dst.region, &shared) {
            PullEnd::Failed { .. } => {}
            other => panic!("a pull of memory nobody lent ended {other:?}"),
        }
        assert!(!shared.is_sealed());
    }
}

/// The whole suite as `#[test]`s, for the backend that `$backend` builds.
macro_rules! conformance_tests {
    ($backend:expr) => {
        #[test]
        fn lend_then_pull_moves_every_byte_and_seals() {
            $crate::transport::pull::conformance::lend_then_pull_moves_every_byte_and_seals(
                &$backend,
            );
        }

        #[test]
        fn a_region_closed_before_the_pull_gets_no_byte() {
            $crate::transport::pull::conformance::a_region_closed_before_the_pull_gets_no_byte(
                &$backend,
            );
        }

        #[test]
        fn a_cancel_mid_chunk_lands_nothing_after_the_close() {
            $crate::transport::pull::conformance::a_cancel_mid_chunk_lands_nothing_after_the_close(
                &$backend,
            );
        }

        #[test]
        fn a_close_during_a_long_pull_freezes_the_destination() {
            $crate::transport::pull::conformance::a_close_during_a_long_pull_freezes_the_destination(
                &$backend,
            );
        }

        #[test]
        fn a_lost_source_fails_the_pull_unsealed() {
            $crate::transport::pull::conformance::a_lost_source_fails_the_pull_unsealed(&$backend);
        }

        #[test]
        fn a_lease_of_memory_the_source_lacks_fails() {
            $crate::transport::pull::conformance::a_lease_of_memory_the_source_lacks_fails(
                &$backend,
            );
        }
    };
}
pub(super) use conformance_tests;
