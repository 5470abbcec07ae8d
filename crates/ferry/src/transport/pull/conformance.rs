//! The suite every [`Lane`] must pass: lend then pull, a region closed
//! before the pull, a cancel while a copy is stuck mid-chunk, a close while
//! a long pull runs, a source that goes away, a lease of memory the source
//! does not have. A backend supplies its sources ([`Backend`]) and runs the
//! whole suite with [`conformance_tests!`](conformance_tests).
//!
//! Every case runs twice, into host memory and into device memory, for
//! every lane, or says why it does not apply and passes (a line `<case>
//! into <memory>: not applicable to <lane> (<backend>): <why>` on
//! standard output, which `--nocapture` shows): the lane cannot start here
//! (no `libucp`, no CUDA driver), it does not declare the destination's
//! memory ([`Lane::caps`]) or cannot move it here
//! ([`Backend::pulls_into`]), or the backend cannot bring about what the
//! case needs with this lane (a source whose copy can be held mid-chunk, a
//! source that goes away). Nothing is skipped in silence.
//!
//! The lanes that run it: cross-memory attach (`cma.rs`), UCX
//! (`ucx/conformance.rs`), CUDA IPC (`cuda_ipc/conformance.rs`), the
//! same-process lane of `local` (`process.rs`), and the test puller
//! (`testing.rs`). A source lives in this process (cross-memory attach to
//! itself, UCX between two workers of it, the same-process lane, the test
//! puller) or in another (CUDA IPC,
//! whose handles open only in another process): the suite sees it only
//! through its lease and its peer ([`Source`]), and knows what it holds
//! ([`pattern`]).
//!
//! The destination is only ever read by the test when no copy can touch it:
//! after the pull returned, or once its region is closed and quiet
//! ([`Region::wait_quiet`]): from then on the fence guarantees that no copy
//! starts, so reading it races with nothing.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::lane::{self, FailureScope};
use ferry_proto::{DeviceKind, OperationStatus};

use super::{lend_kept, register_kept, Lane, LaneError, LeaseBlob, PullEnd};
use crate::cuda::CudaBuffer;
use crate::outcome::OpShared;
use crate::region::Region;
use crate::Descriptor;

/// What a destination holds before any byte lands; a stalled source's
/// bytes must differ from it.
pub(super) const FILL: u8 = 0xAA;

/// Generous bound for what must be prompt; speed is not what is tested.
const PROMPT: Duration = Duration::from_secs(10);

/// The most bytes the cases count as a lane's chunk when they size
/// segments: a lane whose chunk is larger (CUDA IPC on one GPU: 1 GiB)
/// would make them move gigabytes; its large segments are then one copy.
const MAX_UNIT: usize = 16 << 20;

/// The peer type of a backend's puller.
pub(super) type PeerOf<B> = <<B as Backend>::P as Lane>::Peer;

/// What a backend can bring about for a case, or why it cannot (with this
/// lane, or here).
pub(super) type Applies<T> = Result<T, String>;

/// A source and what makes it go away (see [`Backend::mortal_source`]).
pub(super) type Mortal<Peer> = (Source<Peer>, Box<dyn FnOnce()>);

/// What the suite needs of a backend besides its [`Lane`]: sources to
/// pull from.
pub(super) trait Backend {
    type P: Lane;

    fn puller(&self) -> &Self::P;

    /// Why the lane cannot run here at all (its library does not load);
    /// `None` where it can. Where a run requires the lane, this panics
    /// instead (a skip would pass without testing anything).
    fn absent(&self) -> Option<String> {
        None
    }

    /// The most bytes one copy of the puller moves (its chunk) into memory
    /// of kind `into`.
    fn chunk(&self, into: DeviceKind) -> usize;

    /// Why the lane cannot pull into memory of kind `into` here although
    /// it declares that kind ([`Lane::caps`]); `Ok` where it can.
    fn pulls_into(&self, into: DeviceKind) -> Applies<()> {
        let _ = into;
        Ok(())
    }

    /// The most copies one pull of `len` bytes runs at once (threads that
    /// share its chunks): so many chunks may be in flight when a close
    /// comes.
    fn copiers(&self, len: usize) -> usize {
        let _ = len;
        1
    }

    /// A live source that lent one segment per entry of `sizes`, segment
    /// `i` holding [`pattern`]`(i, sizes[i])`: registered, lent and counted
    /// as the lane's source side does it, until the [`Source`] is dropped.
    fn source(&self, sizes: &[usize]) -> Source<PeerOf<Self>>;

    /// A source as [`source`](Self::source) makes, which goes away (its
    /// process exits, the connection is lost) when the closure is called;
    /// or why this lane's source cannot be lost here.
    fn mortal_source(&self, sizes: &[usize]) -> Applies<Mortal<PeerOf<Self>>>;

    /// A source of one segment of `len` bytes (none of them [`FILL`])
    /// whose first copy gets stuck until released; or why this lane's
    /// copies cannot be held mid-chunk here.
    fn stalled_source(&self, len: usize) -> Applies<Stalled<PeerOf<Self>>>;
}

/// A source as the destination sees it: the lease it sent and the peer it
/// is. Dropped: the peer first, then whatever the source side does when
/// the lease ends (give the memory back, deregister it, free it, end its
/// process).
pub(super) struct Source<Peer> {
    pub(super) lease: LeaseBlob,
    peer: Option<Peer>,
    end: Option<Box<dyn FnOnce()>>,
}

impl<Peer> Source<Peer> {
    /// A source that lent `lease`, reached through `peer`; `end` runs once
    /// the peer is dropped.
    pub(super) fn new(lease: LeaseBlob, peer: Peer, end: Box<dyn FnOnce()>) -> Self {
        Source {
            lease,
            peer: Some(peer),
            end: Some(end),
        }
    }

    pub(super) fn peer(&self) -> &Peer {
        self.peer
            .as_ref()
            .expect("a source has its peer until dropped")
    }

    /// This source, with `after` run once its own end has.
    pub(super) fn then(mut self, after: Box<dyn FnOnce()>) -> Self {
        let end = self.end.take();
        self.end = Some(Box::new(move || {
            if let Some(end) = end {
                end();
            }
            after();
        }));
        self
    }
}

impl<Peer> Drop for Source<Peer> {
    fn drop(&mut self) {
        drop(self.peer.take());
        if let Some(end) = self.end.take() {
            end();
        }
    }
}

/// A source whose copies get stuck (see [`Backend::stalled_source`]).
pub(super) struct Stalled<Peer> {
    /// One segment, over the stalling memory.
    pub(super) source: Source<Peer>,
    /// Returns once a copy into the destination region it is given is in
    /// flight and stuck in that memory.
    pub(super) stuck: Box<dyn FnOnce(&Region)>,
    /// Lets stuck copies go on (and later ones through).
    pub(super) release: Box<dyn FnOnce()>,
}

impl<Peer> Stalled<Peer> {
    /// A stalled source over the userfaultfd memory of `stall` (`len`
    /// bytes), lent as `lease` from `region` (already counted as lent) and
    /// copied from through `peer`: stuck once a copy faults on that memory,
    /// released by serving its pages. Its end gives the lease back and
    /// closes the region before the memory goes with `stall`.
    pub(super) fn over_uffd(
        lease: LeaseBlob,
        peer: Peer,
        region: Arc<Region>,
        stall: super::uffd::Stall,
        len: usize,
    ) -> Self {
        let (fd, base) = (stall.fd, stall.base as u64);
        Stalled {
            source: Source::new(
                lease,
                peer,
                Box::new(move || {
                    region.give_back();
                    region.close();
                    drop(region);
                    drop(stall);
                }),
            ),
            stuck: Box::new(move |_| {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid `pollfd` for the call.
                let n = unsafe { libc::poll(&mut p, 1, 30_000) };
                assert_eq!(n, 1, "no copy touched the stalled memory");
                super::uffd::Stall::next_fault(fd).expect("a page fault");
            }),
            release: Box::new(move || super::uffd::Stall::serve(fd, base, len as u64)),
        }
    }
}

/// A source of this process's host memory for an in-process lane: the
/// [`pattern`]s of `sizes`, registered with `p`, lent and counted
/// ([`Region::lend`]), reached through the peer that `make` returns for
/// the region. When the [`Source`] is dropped, the peer goes first, then
/// the lease is given back (which ends its registration), and the region
/// closed and freed.
pub(super) fn host_source<P: Lane + Clone>(
    p: &P,
    sizes: &[usize],
    make: impl FnOnce(&Arc<Region>) -> P::Peer,
) -> Source<P::Peer> {
    let mem = Mem::new(patterns(sizes), false);
    register_kept(p, &mem.region).expect("register the source");
    let lease = lend_kept(p, &mem.region);
    assert!(lease.fits(&mem.region), "a lease describes what was lent");
    assert_eq!(lease.lane(), p.id(), "a lease names its lane");
    mem.region.lend();
    let peer = make(&mem.region);
    Source::new(
        lease,
        peer,
        Box::new(move || {
            mem.region.give_back();
            drop(mem);
        }),
    )
}

/// Says that `case` does not apply to `b`'s lane, and why.
pub(super) fn not_applicable<B: Backend>(b: &B, case: &str, why: &str) {
    let backend = std::any::type_name::<B>()
        .rsplit("::")
        .next()
        .unwrap_or("?");
    println!(
        "{case}: not applicable to {} ({backend}): {why}",
        b.puller().kind()
    );
}

/// Whether `b`'s lane runs here and pulls into memory of kind `into`;
/// says why not.
fn here<B: Backend>(b: &B, case: &str, into: DeviceKind) -> bool {
    let why = if let Some(why) = b.absent() {
        why
    } else if !b
        .puller()
        .caps()
        .pulls_into
        .has(lane::Mem::of(into != DeviceKind::Cpu))
    {
        format!(
            "it pulls into {:?} memory only (caps)",
            b.puller().caps().pulls_into
        )
    } else if let Err(why) = device_memory_here(into) {
        why
    } else if let Err(why) = b.pulls_into(into) {
        why
    } else {
        return true;
    };
    not_applicable(b, &named(case, into), &why);
    false
}

/// Whether this process can make destinations of kind `into`.
fn device_memory_here(into: DeviceKind) -> Applies<()> {
    match into {
        DeviceKind::Cpu => Ok(()),
        DeviceKind::Cuda if crate::cuda::available() => Ok(()),
        DeviceKind::Cuda => Err(format!(
            "no device memory here to pull into ({})",
            crate::cuda::status().err().unwrap_or_default()
        )),
    }
}

/// `case`, with the kind of memory it pulls into.
fn named(case: &str, into: DeviceKind) -> String {
    let memory = match into {
        DeviceKind::Cpu => "host",
        DeviceKind::Cuda => "device",
    };
    format!("{case} into {memory} memory")
}

/// The lane's chunk into `into`, at most [`MAX_UNIT`]: what the cases size
/// segments by.
fn unit<B: Backend>(b: &B, into: DeviceKind) -> usize {
    b.chunk(into).min(MAX_UNIT)
}

/// Owned buffers and a region over them, closed (and waited for) on drop:
/// host memory, or one allocation of device memory carved into the
/// segments.
pub(super) struct Mem {
    pub(super) region: Arc<Region>,
    descs: Vec<Descriptor<'static>>,
    /// Device memory: the allocation, and where each segment starts in it.
    device: Option<(CudaBuffer, Vec<usize>)>,
}

impl Mem {
    pub(super) fn new(bufs: Vec<Vec<u8>>, writable: bool) -> Mem {
        let descs: Vec<_> = bufs.into_iter().map(Descriptor::from_vec).collect();
        // SAFETY: the descriptors own their memory and live in `Mem` next
        // to the region; `Drop` closes the region and waits for copies in
        // flight before they are freed (or leaks them); the test reads them
        // only while no copy can touch them (see the module).
        let region = Arc::new(unsafe { Region::new(&descs, writable) });
        Mem {
            region,
            descs,
            device: None,
        }
    }

    /// `bufs`, end to end in one allocation on `cuda:0`.
    pub(super) fn on_device(bufs: Vec<Vec<u8>>, writable: bool) -> Mem {
        let image = bufs.concat();
        let mut arena = CudaBuffer::new(0, image.len().max(1)).expect("device memory");
        arena
            .copy_from_host(&image)
            .expect("fill the device memory");
        let base = arena.device_ptr();
        let mut at = Vec::with_capacity(bufs.len());
        let mut off = 0;
        let descs = bufs
            .iter()
            .map(|b| {
                at.push(off);
                // SAFETY: `b.len()` bytes at `off` of `arena`, which `Mem`
                // keeps until after the region is closed and quiet (or
                // leaks); no two descriptors overlap.
                let d =
                    unsafe { Descriptor::from_cuda_ptr(base + off as u64, b.len(), 0, writable) };
                off += b.len();
                d
            })
            .collect::<Vec<_>>();
        // SAFETY: as for `new`, the allocation standing for the buffers.
        let region = Arc::new(unsafe { Region::new(&descs, writable) });
        Mem {
            region,
            descs,
            device: Some((arena, at)),
        }
    }

    /// The bytes of every segment: only while no copy can write them.
    pub(super) fn read(&self) -> Vec<Cow<'_, [u8]>> {
        let Some((arena, at)) = &self.device else {
            return (0..self.descs.len())
                .map(|i| Cow::Borrowed(self.descs[i].as_slice().expect("host memory")))
                .collect();
        };
        let mut all = vec![0; arena.len()];
        arena
            .copy_to_host(&mut all)
            .expect("read the device memory");
        at.iter()
            .zip(&self.descs)
            .map(|(&off, d)| Cow::Owned(all[off..off + d.size()].to_vec()))
            .collect()
    }

    /// The bytes of segment `i`: only while no copy can write them.
    pub(super) fn bytes(&self, i: usize) -> Cow<'_, [u8]> {
        match &self.device {
            None => Cow::Borrowed(self.descs[i].as_slice().expect("host memory")),
            Some(_) => self.read().swap_remove(i),
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        self.region.close();
        if !self.region.wait_quiet(PROMPT) {
            // A copy is still stuck in it: the memory must outlive it.
            std::mem::forget(std::mem::take(&mut self.descs));
            std::mem::forget(self.device.take());
        }
    }
}

/// `n` bytes that tell segment `i`'s position `j` apart.
pub(super) fn pattern(i: usize, n: usize) -> Vec<u8> {
    (0..n).map(|j| ((i * 31 + j) % 251) as u8).collect()
}

/// The [`pattern`] of each segment of `sizes`: what a source holds.
pub(super) fn patterns(sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(i, n))
        .collect()
}

/// A destination in memory of kind `into`, of `sizes` bytes per segment,
/// every byte [`FILL`].
pub(super) fn destination(sizes: &[usize], into: DeviceKind) -> Mem {
    let bufs = sizes.iter().map(|&n| vec![FILL; n]).collect();
    match into {
        DeviceKind::Cpu => Mem::new(bufs, true),
        DeviceKind::Cuda => Mem::on_device(bufs, true),
    }
}

/// A digest of `bytes`, to compare large buffers without a copy.
fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

pub(super) fn op() -> Arc<OpShared> {
    OpShared::new(OperationStatus::InProgress)
}

/// (a) Lend, then pull: every byte of several segments lands (small ones,
/// an empty one, more in a row than one vectored call takes, some larger
/// than a chunk: more bytes than a copy by several threads needs), and the
/// operation is sealed, the region left open.
pub(super) fn lend_then_pull_moves_every_byte_and_seals<B: Backend>(b: &B, into: DeviceKind) {
    if !here(b, "lend_then_pull_moves_every_byte_and_seals", into) {
        return;
    }
    let p = b.puller();
    let chunk = unit(b, into);
    let mut sizes = vec![1, 100, 0, 4096, 3, 2 * chunk + 17, 5];
    sizes.extend(std::iter::repeat_n(1, 1100));
    sizes.extend([4 * chunk + 9, 7]);
    sizes.extend(std::iter::repeat_n(3000, 900));
    let src = b.source(&sizes);
    let dst = destination(&sizes, into);
    let kept = p.register(&dst.region).expect("register the destination");
    assert!(src.lease.fits(&dst.region));
    let shared = op();
    assert_eq!(
        p.pull(src.peer(), &src.lease, &dst.region, &shared),
        PullEnd::Done
    );
    assert!(shared.is_sealed(), "Done means sealed");
    assert!(dst.region.is_open(), "the puller leaves the region open");
    assert!(dst.region.is_quiet());
    for (i, (got, &n)) in dst.read().iter().zip(&sizes).enumerate() {
        assert!(**got == pattern(i, n), "segment {i} differs");
    }
    drop(kept);
}

/// (b) A region closed before the pull: `Closed`, not sealed, no byte
/// written (whether the lease starts with small segments or a large one;
/// with nothing to copy, the seal alone must see the close).
pub(super) fn a_region_closed_before_the_pull_gets_no_byte<B: Backend>(b: &B, into: DeviceKind) {
    if !here(b, "a_region_closed_before_the_pull_gets_no_byte", into) {
        return;
    }
    let p = b.puller();
    let chunk = unit(b, into);
    for sizes in [vec![3, 5, 2 * chunk], vec![2 * chunk], vec![0]] {
        let src = b.source(&sizes);
        let dst = destination(&sizes, into);
        dst.region.close();
        let shared = op();
        assert_eq!(
            p.pull(src.peer(), &src.lease, &dst.region, &shared),
            PullEnd::Closed
        );
        assert!(!shared.is_sealed());
        assert!(dst.region.is_quiet());
        for (i, got) in dst.read().iter().enumerate() {
            assert!(got.iter().all(|&x| x == FILL), "segment {i} written");
        }
    }
}

/// (c) A cancel while a copy is stuck mid-chunk: `close` returns without
/// waiting for it (the region counts it), the pull ends `Closed`, never
/// `Done`, not sealed, and once the stuck copies returned nothing but their
/// own chunks was written (the first, or the first few where the pull's
/// chunks are shared among threads): no copy started after the close.
pub(super) fn a_cancel_mid_chunk_lands_nothing_after_the_close<B: Backend>(
    b: &B,
    into: DeviceKind,
) {
    const CASE: &str = "a_cancel_mid_chunk_lands_nothing_after_the_close";
    if !here(b, CASE, into) {
        return;
    }
    let p = b.puller();
    let (chunk, len) = (b.chunk(into), 4 * unit(b, into));
    let Stalled {
        source,
        stuck,
        release,
    } = match b.stalled_source(len) {
        Ok(s) => s,
        Err(why) => return not_applicable(b, &named(CASE, into), &why),
    };
    let dst = destination(&[len], into);
    let shared = op();
    let (peer, lease) = (source.peer(), &source.lease);
    let end = std::thread::scope(|scope| {
        let pull = scope.spawn(|| p.pull(peer, lease, &dst.region, &shared));
        stuck(&dst.region);
        assert!(!dst.region.is_quiet(), "a copy is in flight");
        let t = Instant::now();
        dst.region.close();
        assert!(t.elapsed() < PROMPT, "close waited for a stuck copy");
        assert!(!dst.region.is_quiet(), "the stuck copy is still counted");
        assert!(!shared.is_sealed());
        release();
        pull.join().expect("the pull panicked")
    });
    // `Closed`; or, where the stuck copy outlived the lane's grace before
    // the release reached it (a busy machine), recalled (rule 3).
    assert!(
        end == PullEnd::Closed || recalled(&end),
        "the pull ended {end:?}"
    );
    assert!(!shared.is_sealed());
    assert!(dst.region.wait_quiet(PROMPT));
    let d = dst.bytes(0);
    let in_flight = b.copiers(len).min(4);
    assert!(
        d[(in_flight * chunk).min(len)..].iter().all(|&x| x == FILL),
        "bytes past the stuck chunks landed after the close"
    );
    drop(source);
}

/// Whether `end` is a pull that recalled its copies after a close, by
/// tearing down its link to the peer (rule 3 of the contract).
pub(super) fn recalled(end: &PullEnd) -> bool {
    matches!(
        end,
        PullEnd::Failed {
            scope: FailureScope::Connection,
            cause: LaneError::Recalled { .. },
        }
    )
}

/// (c') A close while a long pull runs (as soon as a copy is seen in
/// flight): the pull ends `Closed` unsealed or, had it sealed first,
/// `Done` sealed; once the close returned and the copy in flight ended,
/// the destination never changes again.
pub(super) fn a_close_during_a_long_pull_freezes_the_destination<B: Backend>(
    b: &B,
    into: DeviceKind,
) {
    if !here(
        b,
        "a_close_during_a_long_pull_freezes_the_destination",
        into,
    ) {
        return;
    }
    let p = b.puller();
    let chunk = b.chunk(into);
    if chunk > MAX_UNIT {
        let why = format!(
            "its chunk into this memory is {chunk} bytes: a pull of the many chunks that a \
             close must meet mid-way is more than this suite moves"
        );
        return not_applicable(
            b,
            &named("a_close_during_a_long_pull_freezes_the_destination", into),
            &why,
        );
    }
    // Long enough (many chunks, several of a scheduler's time slices) that
    // this thread runs while the pull does, even on a busy machine.
    let len = (16 * chunk).max(128 << 20);
    let src = b.source(&[len]);
    let (peer, lease) = (src.peer(), &src.lease);
    // A close that comes too late (the pull ended first: a busy machine
    // may not run this thread meanwhile) proves little: try again.
    let mut closed = false;
    for _ in 0..10 {
        let dst = destination(&[len], into);
        let shared = op();
        let running = AtomicBool::new(true);
        let (end, frozen) = std::thread::scope(|scope| {
            let pull = scope.spawn(|| {
                let end = p.pull(peer, lease, &dst.region, &shared);
                running.store(false, Ordering::Release);
                end
            });
            while running.load(Ordering::Acquire) && dst.region.is_quiet() {
                std::hint::spin_loop();
            }
            dst.region.close();
            assert!(dst.region.wait_quiet(PROMPT), "a copy did not return");
            // Closed and quiet: no copy touches the memory any more.
            let frozen = digest(&dst.bytes(0));
            (pull.join().expect("the pull panicked"), frozen)
        });
        assert_eq!(
            digest(&dst.bytes(0)),
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
pub(super) fn a_lost_source_fails_the_pull_unsealed<B: Backend>(b: &B, into: DeviceKind) {
    const CASE: &str = "a_lost_source_fails_the_pull_unsealed";
    if !here(b, CASE, into) {
        return;
    }
    let p = b.puller();
    let sizes = [4096, 3, unit(b, into) + 1];
    let (src, lose) = match b.mortal_source(&sizes) {
        Ok(s) => s,
        Err(why) => return not_applicable(b, &named(CASE, into), &why),
    };
    let dst = destination(&sizes, into);
    let shared = op();
    assert_eq!(
        p.pull(src.peer(), &src.lease, &dst.region, &shared),
        PullEnd::Done
    );
    for (i, (got, &n)) in dst.read().iter().zip(&sizes).enumerate() {
        assert!(**got == pattern(i, n), "segment {i} differs");
    }
    lose();
    let dst = destination(&sizes, into);
    let shared = op();
    match p.pull(src.peer(), &src.lease, &dst.region, &shared) {
        PullEnd::Failed { cause, .. } => assert!(!cause.to_string().is_empty()),
        other => panic!("a pull from a source that went away ended {other:?}"),
    }
    assert!(!shared.is_sealed(), "a failed pull sealed");
    assert!(dst.region.is_open(), "the puller leaves the region open");
    assert!(dst.region.is_quiet());
    // The connection's end gives the lease back (dropping `src`).
}

/// (d') A lease of memory the source does not have (an address that is
/// mapped nowhere, with the backend's own bytes of a real lease) fails
/// the pull: no crash, no seal.
pub(super) fn a_lease_of_memory_the_source_lacks_fails<B: Backend>(b: &B, into: DeviceKind) {
    if !here(b, "a_lease_of_memory_the_source_lacks_fails", into) {
        return;
    }
    let p = b.puller();
    let src = b.source(&[64]);
    for sizes in [vec![4096], vec![16, 16]] {
        let dst = destination(&sizes, into);
        // Page 0 is never mapped (`vm.mmap_min_addr`).
        let bogus = LeaseBlob::new(
            p.id(),
            sizes.iter().map(|&n| (8, n as u64)).collect(),
            src.lease.opaque().to_vec(),
        );
        assert!(bogus.fits(&dst.region));
        let shared = op();
        match p.pull(src.peer(), &bogus, &dst.region, &shared) {
            PullEnd::Failed { .. } => {}
            other => panic!("a pull of memory nobody lent ended {other:?}"),
        }
        assert!(!shared.is_sealed());
        assert!(dst.bytes(0).iter().all(|&x| x == FILL), "bytes landed");
    }
}

/// The whole suite as `#[test]`s, for the backend that `$backend` builds:
/// into host memory here, into device memory in a module `into_device`.
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::transport::pull::conformance::conformance_tests!(
            @cases $backend, ::ferry_proto::DeviceKind::Cpu
        );

        mod into_device {
            #[allow(unused_imports)]
            use super::*;

            $crate::transport::pull::conformance::conformance_tests!(
                @cases $backend, ::ferry_proto::DeviceKind::Cuda
            );
        }
    };
    (@cases $backend:expr, $into:expr) => {
        #[test]
        fn lend_then_pull_moves_every_byte_and_seals() {
            $crate::transport::pull::conformance::lend_then_pull_moves_every_byte_and_seals(&$backend, $into);
        }

        #[test]
        fn a_region_closed_before_the_pull_gets_no_byte() {
            $crate::transport::pull::conformance::a_region_closed_before_the_pull_gets_no_byte(&$backend, $into);
        }

        #[test]
        fn a_cancel_mid_chunk_lands_nothing_after_the_close() {
            $crate::transport::pull::conformance::a_cancel_mid_chunk_lands_nothing_after_the_close(&$backend, $into);
        }

        #[test]
        fn a_close_during_a_long_pull_freezes_the_destination() {
            $crate::transport::pull::conformance::a_close_during_a_long_pull_freezes_the_destination(&$backend, $into);
        }

        #[test]
        fn a_lost_source_fails_the_pull_unsealed() {
            $crate::transport::pull::conformance::a_lost_source_fails_the_pull_unsealed(&$backend, $into);
        }

        #[test]
        fn a_lease_of_memory_the_source_lacks_fails() {
            $crate::transport::pull::conformance::a_lease_of_memory_the_source_lacks_fails(&$backend, $into);
        }
    };
}
pub(super) use conformance_tests;
