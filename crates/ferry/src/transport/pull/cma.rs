//! Cross-memory attach as a [`Lane`]: the destination copies what the
//! source lent with `process_vm_readv`, chunk by chunk, through its region
//! (the system calls and the peer handle are in `transport::cma`).

use std::io;

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, MemKinds, Reach};

use super::registration::Nothing;
use super::{share, Lane, LaneError, LeaseBlob, PullEnd};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::{Denied, Region};
use crate::transport::cma::{Peer, CHUNK};

/// The most iovecs of one system call: one fewer than Linux's `IOV_MAX`,
/// since `Peer::pull_many` adds the range that checks the program image.
pub(crate) const MAX_IOV: usize = 1023;

/// How many bytes one copy moves at most (and so how long a cancel waits
/// for an ordinary one): a chunk of a large segment, or a run of small ones.
const PULL_CHUNK: u64 = CHUNK as u64;

/// Cross-memory attach (`process_vm_readv`) between two processes of one
/// host. A lease is the `(address, length)` of each source segment in the
/// source process; the peer is that process, held by a handle that notices
/// a new program image (see [`Peer`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CmaPuller;

/// What a failed copy by cross-memory attach ends: the connection (the
/// source died, or lent memory it does not have).
const SCOPE: FailureScope = FailureScope::Connection;

/// A failed pull, with `cause`.
fn failure(cause: LaneError) -> PullEnd {
    PullEnd::failed(SCOPE, cause)
}

impl Lane for CmaPuller {
    type Peer = Peer;
    type Registration = Nothing;

    fn id(&self) -> LaneId {
        LaneId::CMA
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Cma
    }

    fn caps(&self) -> LaneCaps {
        LaneCaps {
            id: LaneId::CMA,
            lends: MemKinds::HOST,
            pulls_into: MemKinds::HOST,
            reach: Reach::Host,
            within_process: true,
            failure: SCOPE,
            proven_by: LaneId::CMA,
        }
    }

    /// Nothing to register: the kernel reads the source's pages as they are.
    fn register(&self, _region: &Region) -> Result<Option<Nothing>, LaneError> {
        Ok(None)
    }

    fn lend(&self, region: &Region, _kept: Option<&Nothing>) -> LeaseBlob {
        LeaseBlob::addresses(LaneId::CMA, region.segments())
    }

    /// Copies every segment of a lease from process `peer` into `region`,
    /// one unit (a chunk of a large segment, or a run of small ones) per
    /// system call, each outside the region's lock (the peer may stall it:
    /// see `Region::copy_into`), then seals the operation under that lock.
    /// A lease of [`PARALLEL_FROM`] bytes or more shares its units among
    /// helper threads (see `share.rs`). Every copy, a check before the first
    /// and a confirmation before the seal make sure that `peer` still runs
    /// the program that passed the attach probe.
    fn pull(&self, peer: &Peer, lease: &LeaseBlob, region: &Region, shared: &OpShared) -> PullEnd {
        let segs = lease.segments();
        let pid = peer.pid();
        let failed = |e: io::Error| {
            failure(LaneError::Copy {
                detail: format!("cross-memory copy from process {pid} failed: {e}"),
            })
        };
        let gone = |e: io::Error| {
            failure(LaneError::SourceGone {
                detail: format!("process {pid}: {e}"),
            })
        };
        // The kernel would write device addresses as host memory.
        if !region.is_host() {
            return failure(LaneError::NotHostMemory);
        }
        if let Err(e) = peer.check() {
            return gone(e);
        }
        let Plan { order, units } = match plan(segs, region) {
            Ok(p) => p,
            Err(end) => return end,
        };
        let bytes = segs.iter().fold(0u64, |t, s| t.saturating_add(s.1));
        let helpers = if bytes >= PARALLEL_FROM {
            share::max_threads() - 1
        } else {
            0
        };
        let copy = |u: &Unit| {
            let r = match *u {
                Unit::Run { at, count } => {
                    let which = &order[at..at + count];
                    region.copy_into_each(which, |local| {
                        let lent = which.iter().map(|&i| segs[i]);
                        if local
                            .iter()
                            .zip(lent.clone())
                            .any(|(l, r)| l.1 as u64 != r.1)
                        {
                            return Err(io::Error::other("lease larger than the destination"));
                        }
                        let local = merged_local(local);
                        let remote = merged(lent);
                        // SAFETY: `copy_into_each` hands out whole, distinct
                        // segments of the region, counted as in flight until
                        // we return: valid for writes and touched by nothing
                        // else meanwhile (units are disjoint, so no other
                        // thread of this pull writes them either; merging
                        // ranges that follow each other changes nothing of
                        // that); the lengths match the lease pairwise
                        // (checked above), so the merged totals are equal;
                        // `batch` kept both merged lists to at most MAX_IOV
                        // ranges.
                        unsafe { peer.pull_many(&local, &remote) }
                    })
                }
                Unit::Part { seg, off, len, at } => {
                    // SAFETY: `copy_into` hands out `len` bytes at `off` of
                    // segment `seg` (bounds checked), counted as in flight
                    // until we return: valid for writes and touched by
                    // nothing else meanwhile (units are disjoint); one local
                    // and one remote range of the same length.
                    region.copy_into(seg, 1, Some((off, len)), |local| unsafe {
                        peer.pull_many(local, &[(at, len as u64)])
                    })
                }
            };
            match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(failed(e)),
                Err(Denied::Closed) => Err(PullEnd::Closed),
                Err(Denied::NotHostMemory) => Err(failure(LaneError::NotHostMemory)),
                Err(Denied::OutOfBounds) => Err(failure(LaneError::LeaseTooLarge)),
            }
        };
        if let Some(end) = share::run(&units, helpers, copy) {
            return end;
        }
        if let Err(e) = peer.confirm() {
            return gone(e);
        }

        if region.seal_if_open(|| shared.seal()) {
            PullEnd::Done
        } else {
            PullEnd::Closed
        }
    }
}

/// A lease of at least this many bytes is copied by more than one thread
/// (where the process's helper budget allows): below it, starting a helper
/// costs more than it saves.
const PARALLEL_FROM: u64 = 8 << 20;

/// One copy of a pull: one system call inside one `Region::copy_into`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// Whole small segments `order[at..at + count]` of the [`Plan`].
    Run { at: usize, count: usize },
    /// `len` bytes at `off` of segment `seg`, lent at address `at`.
    Part {
        seg: usize,
        off: u64,
        len: usize,
        at: u64,
    },
}

/// How a pull copies a lease.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    /// The small segments (at most a chunk each), in the order they are
    /// copied: by their address in the source.
    order: Vec<usize>,
    /// The copies: runs of `order` as [`batch`] groups them, then large
    /// segments cut into [`PULL_CHUNK`]s.
    units: Vec<Unit>,
}

/// The units of a lease. Small segments are copied in the order of their
/// address in the source, not the lease's: the kernel pins a source page
/// per range, and ranges in address order meet the page tables and huge
/// pages they need still in cache. On this project's 2-core machine, 32 KiB
/// blocks in random order copy about 20% faster in this order when they are
/// dense in their pool (512 MiB), 5% when they are a quarter of it. Ranges
/// that follow each other on both sides (runs of blocks) keep their order,
/// so merging them into one range is unchanged.
fn plan(segs: &[(u64, u64)], region: &Region) -> Result<Plan, PullEnd> {
    // Runs of the lease that follow each other on both sides: (start in
    // the source, first segment, count).
    let mut runs: Vec<(u64, usize, usize)> = Vec::new();
    let mut parts = Vec::new();
    for (i, &(addr, len)) in segs.iter().enumerate() {
        if len > PULL_CHUNK {
            let mut off = 0u64;
            while off < len {
                let n = (len - off).min(PULL_CHUNK) as usize;
                let Some(at) = addr.checked_add(off) else {
                    return Err(failure(LaneError::BadLease {
                        detail: "a lease address overflows".into(),
                    }));
                };
                parts.push(Unit::Part {
                    seg: i,
                    off,
                    len: n,
                    at,
                });
                off += n as u64;
            }
            continue;
        }
        match runs.last_mut() {
            Some((_, first, count))
                if *first + *count == i
                    && region.follows(i - 1, i)
                    && ends(segs[i - 1]) == Some(addr) =>
            {
                *count += 1
            }
            _ => runs.push((addr, i, 1)),
        }
    }
    if runs.windows(2).any(|w| w[0].0 > w[1].0) {
        runs.sort_unstable_by_key(|r| r.0);
    }
    let order: Vec<usize> = runs.iter().flat_map(|&(_, f, n)| f..f + n).collect();
    let mut units = Vec::new();
    let mut at = 0;
    while at < order.len() {
        let count = batch(segs, &order, at, region);
        units.push(Unit::Run { at, count });
        at += count;
    }
    units.extend(parts);
    Ok(Plan { order, units })
}

/// Where a lent range ends, if that is an address.
fn ends((addr, len): (u64, u64)) -> Option<u64> {
    addr.checked_add(len)
}

/// How many segments of `order` from `at` on one call copies: at most
/// [`PULL_CHUNK`] bytes, and at most [`MAX_IOV`] ranges on each side once
/// neighbours that follow each other in memory are merged; at least one
/// (`order` holds segments of a chunk or less).
fn batch(segs: &[(u64, u64)], order: &[usize], at: usize, region: &Region) -> usize {
    let (mut count, mut bytes) = (0usize, 0u64);
    let (mut remote, mut local) = (0usize, 0usize);
    while let Some(&j) = order.get(at + count) {
        let (addr, len) = segs[j];
        if count > 0 && len > PULL_CHUNK - bytes {
            break;
        }
        let prev = (count > 0).then(|| order[at + count - 1]);
        let joins_remote = prev.is_some_and(|p| ends(segs[p]) == Some(addr));
        let joins_local = prev.is_some_and(|p| region.follows(p, j));
        let (r, l) = (
            remote + usize::from(!joins_remote),
            local + usize::from(!joins_local),
        );
        if r > MAX_IOV || l > MAX_IOV {
            break;
        }
        (remote, local) = (r, l);
        bytes += len;
        count += 1;
    }
    count.max(1)
}

/// [`merged`] for local pointers.
fn merged_local(ranges: &[(*mut u8, usize)]) -> Vec<(*mut u8, usize)> {
    let mut out: Vec<(*mut u8, usize)> = Vec::with_capacity(ranges.len());
    for &(p, n) in ranges {
        if n == 0 {
            continue;
        }
        match out.last_mut() {
            Some((q, m)) if q.wrapping_add(*m) == p => *m += n,
            _ => out.push((p, n)),
        }
    }
    out
}

/// `ranges` with every range that starts where the previous one ends
/// merged into it (empty ranges dropped).
fn merged(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, n) in ranges {
        if n == 0 {
            continue;
        }
        match out.last_mut() {
            Some((b, m)) if b.checked_add(*m) == Some(a) => *m += n,
            _ => out.push((a, n)),
        }
    }
    out
}

pub(crate) mod offer;

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::region::Region;
    use crate::transport::cma;
    use crate::transport::pull::conformance::{
        host_source, Applies, Backend, Mortal, Source, Stalled,
    };
    use crate::transport::pull::twin::Twin;
    use crate::transport::pull::uffd;
    use crate::{Descriptor, Device};
    use ferry_proto::DeviceKind;

    /// Cross-memory attach to this very process (`Peer::open` of our own
    /// pid is allowed: the kernel checks ptrace access, which a process has
    /// to itself), or to a forked twin of it for a source that goes away.
    #[derive(Default)]
    pub(super) struct CmaBackend(CmaPuller);

    impl Backend for CmaBackend {
        type P = CmaPuller;

        fn puller(&self) -> &CmaPuller {
            &self.0
        }

        fn chunk(&self, _into: DeviceKind) -> usize {
            CHUNK
        }

        fn copiers(&self, len: usize) -> usize {
            if len as u64 >= PARALLEL_FROM {
                share::max_threads()
            } else {
                1
            }
        }

        fn source(&self, sizes: &[usize]) -> Source<Peer> {
            // The memory lent is this process's own.
            host_source(&self.0, sizes, |_| {
                Peer::open(cma::pid()).expect("cross-memory attach to this process")
            })
        }

        fn mortal_source(&self, sizes: &[usize]) -> Applies<Mortal<Peer>> {
            // Forked once the source's memory is there (and lent): the twin
            // has it at the same addresses.
            let mut twin = None;
            let source = host_source(&self.0, sizes, |_| {
                let t = Twin::fork();
                let peer = Peer::open(t.0 as u32).expect("cross-memory attach to the twin");
                twin = Some(t);
                peer
            });
            let twin = twin.expect("the twin forked");
            Ok((source, Box::new(move || drop(twin))))
        }

        fn stalled_source(&self, len: usize) -> Applies<Stalled<Peer>> {
            let stall = uffd::Stall::new(len)
                .map_err(|e| format!("userfaultfd refused by this kernel: {e}"))?;
            // SAFETY: the mapping lives in `stall`, dropped in the source's
            // end after the region is closed, and only the kernel (a
            // cross-memory copy) touches it.
            let desc = unsafe { Descriptor::from_raw_parts(stall.base, len, Device::CPU, false) };
            // SAFETY: as above: valid for reads until `stall` is dropped,
            // written by nobody.
            let region = Arc::new(unsafe { Region::new(&[desc], false) });
            let lease = self.0.lend(&region, None);
            region.lend();
            let peer = Peer::open(cma::pid()).expect("cross-memory attach to this process");
            Ok(Stalled::over_uffd(lease, peer, region, stall, len))
        }
    }

    mod conformance {
        use super::CmaBackend;
        use crate::transport::pull::conformance::conformance_tests;

        conformance_tests!(CmaBackend::default());
    }

    /// 16 runs of 4 blocks, shuffled in the source, in order in the
    /// destination, then one segment larger than a chunk.
    #[test]
    fn a_plan_copies_in_source_order_and_keeps_runs_whole() {
        let blk = 100u64;
        let perm = [9u64, 3, 14, 0, 7, 12, 1, 5, 15, 2, 10, 6, 13, 4, 11, 8];
        let mut segs: Vec<(u64, u64)> = (0..64u64)
            .map(|i| ((1 << 20) + (perm[(i / 4) as usize] * 4 + i % 4) * blk, blk))
            .collect();
        segs.push((1 << 30, PULL_CHUNK * 2 + 1));
        let mut buf = vec![0u8; 6400 + segs[64].1 as usize];
        let (small, large) = buf.split_at_mut(6400);
        let mut descs: Vec<Descriptor<'_>> = small
            .chunks_mut(100)
            .map(Descriptor::from_mut_slice)
            .collect();
        descs.push(Descriptor::from_mut_slice(large));
        // SAFETY: the descriptors outlive the region and nothing else
        // touches them; the plan reads addresses only.
        let r = unsafe { Region::new(&descs, true) };
        let Plan { order, units } = plan(&segs, &r).expect("a plan");
        let mut seen = order.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..64).collect::<Vec<_>>(), "each small one once");
        assert!(
            order.windows(2).all(|w| segs[w[0]].0 < segs[w[1]].0),
            "in source order"
        );
        assert_eq!(units.len(), 1 + 3, "one call for the small ones");
        assert_eq!(units[0], Unit::Run { at: 0, count: 64 });
        let remote = merged(order.iter().map(|&i| segs[i]));
        assert_eq!(remote, vec![(1 << 20, 6400)], "one range in the source");
        let local = order.windows(2).filter(|w| !r.follows(w[0], w[1])).count();
        assert_eq!(local + 1, 16, "each run still one range here");
        assert!(matches!(units[1..], [Unit::Part { seg: 64, .. }, ..]));
        r.close();
    }

    #[test]
    fn cma_pulls_host_memory_and_registers_nothing() {
        let p = CmaPuller;
        assert_eq!(p.kind(), TransportKind::Cma);
        assert_eq!(p.id(), LaneId::CMA);
        let caps = p.caps();
        assert!(caps.lends == MemKinds::HOST && caps.pulls_into == MemKinds::HOST);
        assert_eq!(caps.failure, FailureScope::Connection);
        let descs = vec![
            Descriptor::from_vec(vec![1; 3]),
            Descriptor::from_vec(vec![2; 5]),
        ];
        // SAFETY: the descriptors outlive the region and are not touched elsewhere.
        let r = unsafe { Region::new(&descs, false) };
        assert!(matches!(p.register(&r), Ok(None)));
        let lease = p.lend(&r, None);
        assert_eq!(lease.lane(), LaneId::CMA);
        assert_eq!(lease.segments(), r.segments().as_slice());
        assert!(lease.opaque().is_empty() && lease.fits(&r));
        r.close();
    }
}
