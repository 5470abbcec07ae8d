//! CUDA IPC as a [`Lane`]: GPU memory between two processes of one host.
//!
//! The source lends the allocations under its device memory: one
//! `cuIpcGetMemHandle` per allocation, and for each segment its allocation
//! and offset ([`lease`] encodes them in the lease's opaque bytes; the
//! lease's segments keep the device addresses and lengths). The destination
//! opens each handle once per peer (`cuIpcOpenMemHandle_v2`, kept in the
//! peer's cache and closed when the connection goes, never under a copy)
//! and copies every segment in chunks (or runs of small segments) of at
//! most [`DEVICE_CHUNK`] bytes on one GPU, [`PEER_CHUNK`] between two,
//! [`HOST_CHUNK`] into host memory, each inside one [`Region::copy_into`]: the copy is queued
//! on the puller's own non-blocking stream and the stream synchronized
//! before the callback returns, so a cancel waits for one chunk at most
//! and nothing lands after `Region::close` has returned. Into host memory
//! (a GPU→CPU pair) the copies are device-to-host.
//!
//! A chunk is sized in time, not bytes: about a millisecond of copy at
//! the slowest rate its kind of copy runs (well under
//! [`COPY_GRACE`](crate::region::COPY_GRACE), which a cancel waits), and
//! long enough that the fixed cost of queuing it and waiting for it (a
//! few microseconds) is lost in it. A device-to-device copy runs at
//! hundreds of GB/s (an H100's at about 1.5 TB/s): 2 MiB chunks there
//! would spend most of their time queuing and waiting.
//!
//! It runs on connections where cross-memory attach was set up (the
//! attach probe proved the peer is a process of this host that this one
//! may attach to); the peer's process handle is checked before the first
//! copy and confirmed before the seal, as for cross-memory attach.
//!
//! Verified on one H100 on 2026-11-24 (`tests/cuda_ipc.rs`): GPU to GPU
//! from 1 byte to 1 GiB and one byte more, 16 mixed descriptors, GPU to
//! host memory both ways, a cancel mid-transfer and a source killed
//! mid-transfer, between two processes. Not yet run: two GPUs in one host
//! (peer access and the `PEER_CHUNK` copies). Without a GPU, the lease
//! codec and the no-CUDA behaviour are what is tested here.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, MemKinds, Reach};
use ferry_proto::DeviceKind;

use super::registration::IpcExport;
use super::{Lane, LaneError, LeaseBlob, PullEnd};
use crate::cuda::ipc::{self, CopyStream, Dst, Handle, Opened};
use crate::cuda::{CudaError, PrimaryCtx};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::{Denied, Region};
use crate::sync::lock;
use crate::transport::cma;

pub(crate) mod lease;

/// The most bytes one copy (one callback of the region, one wait for the
/// stream) moves into memory of the GPU the source's memory is on: about
/// 0.7 ms on an H100, 4 ms at 256 GB/s, well within what a cancel waits
/// (`COPY_GRACE`). A 1 GiB READ is one copy and one wait: each wait
/// leaves the copy engine idle until the next copy is queued.
pub(crate) const DEVICE_CHUNK: u64 = 1 << 30;

/// The most bytes one copy moves into another GPU's memory (peer access
/// over PCIe, or the driver staging through host memory where there is
/// none: 3 ms at 20 GB/s).
pub(crate) const PEER_CHUNK: u64 = 64 << 20;

/// The most bytes one copy moves into host memory (device to host, over
/// PCIe: 1 ms at 16 GB/s).
pub(crate) const HOST_CHUNK: u64 = 16 << 20;

/// How many opened allocations a peer keeps: beyond this, the oldest are
/// closed once no copy uses them (an opened allocation keeps the source's
/// memory alive after the source freed it).
const KEEP_OPEN: usize = 64;

/// The device whose primary context copies into host memory (a GPU→CPU
/// pair) where this process does not see the source's device (the lease
/// names it by UUID): peer access is enabled lazily where needed.
const HOST_COPY_DEVICE: u32 = 0;

/// CUDA IPC between two processes of one host (see the module
/// documentation).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CudaIpcPuller;

/// What a destination holds of one source: the process that passed the
/// attach probe, and the source's allocations it opened.
pub(crate) struct IpcPeer {
    process: Arc<cma::Peer>,
    opened: Mutex<Cache>,
}

/// Opened allocations by (handle, device of the context), and their keys
/// oldest first.
type Cache = (HashMap<Key, Arc<Opened>>, VecDeque<Key>);

/// An opened allocation: its handle, and the device of the context it is
/// opened in.
type Key = (Handle, u32);

impl IpcPeer {
    /// A peer over `process` (the connection's attach-probed peer).
    pub(crate) fn new(process: Arc<cma::Peer>) -> IpcPeer {
        IpcPeer {
            process,
            opened: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// `handle` opened in `ctx`: from this peer's cache, or from another
    /// peer's that still holds it (a handle is opened once per context in
    /// this process), or opened now.
    fn open(&self, ctx: &Arc<PrimaryCtx>, handle: &Handle) -> Result<Arc<Opened>, CudaError> {
        let key = (*handle, ctx.ordinal());
        let mut mine = lock(&self.opened);
        if let Some(o) = mine.0.get(&key) {
            return Ok(o.clone());
        }
        let o = {
            let mut all = lock(everyone());
            all.retain(|_, w| w.strong_count() > 0);
            match all.get(&key).and_then(Weak::upgrade) {
                Some(o) => o,
                None => {
                    let o = Arc::new(Opened::open(ctx, handle)?);
                    all.insert(key, Arc::downgrade(&o));
                    o
                }
            }
        };
        mine.0.insert(key, o.clone());
        mine.1.push_back(key);
        // Beyond the bound, the oldest leave the cache. One that a copy
        // still uses stays open until that copy drops its `Arc`: the close
        // (`Opened::drop`) never runs under a copy.
        while mine.0.len() > KEEP_OPEN {
            let Some(k) = mine.1.pop_front() else { break };
            mine.0.remove(&k);
        }
        Ok(o)
    }
}

/// Every allocation this process has opened, by (handle, device), held
/// weakly: the peers' caches own them.
fn everyone() -> &'static Mutex<HashMap<Key, Weak<Opened>>> {
    static ALL: OnceLock<Mutex<HashMap<Key, Weak<Opened>>>> = OnceLock::new();
    ALL.get_or_init(|| Mutex::new(HashMap::new()))
}

/// What a failed CUDA IPC copy ends: its one request (no GPU here, no
/// peer access between the two devices, memory the driver would not map;
/// a source that went away ends the connection on its own).
const SCOPE: FailureScope = FailureScope::Request;

impl Lane for CudaIpcPuller {
    type Peer = IpcPeer;
    type Registration = IpcExport;

    fn id(&self) -> LaneId {
        LaneId::CUDA_IPC
    }

    fn kind(&self) -> TransportKind {
        TransportKind::CudaIpc
    }

    fn caps(&self) -> LaneCaps {
        LaneCaps {
            id: LaneId::CUDA_IPC,
            // Lends device memory; pulls into device memory or host memory.
            lends: MemKinds::DEVICE,
            pulls_into: MemKinds::BOTH,
            reach: Reach::Host,
            // CUDA does not open a process's own IPC handles.
            within_process: false,
            failure: SCOPE,
            // Rides on cross-memory attach's proof of the peer.
            proven_by: LaneId::CMA,
        }
    }

    /// At the source (a region that is not written): exports its device
    /// memory (one IPC handle per allocation), kept until the last lease
    /// ends. Nothing at a destination.
    fn register(&self, region: &Region) -> Result<Option<IpcExport>, LaneError> {
        if region.is_writable() {
            return Ok(None);
        }
        let Some(device) = region.device() else {
            return Err(LaneError::Registration(
                "host memory is lent by cross-memory attach, not CUDA IPC".into(),
            ));
        };
        let segs = region.segments();
        let e =
            ipc::export(device.id(), &segs).map_err(|e| LaneError::Registration(e.to_string()))?;
        let allocs: Vec<lease::Alloc> = e
            .allocs
            .iter()
            .map(|&(handle, size)| lease::Alloc { handle, size })
            .collect();
        let lens: Vec<u64> = segs.iter().map(|s| s.1).collect();
        let uuid = ipc::device_uuid(device.id());
        Ok(Some(IpcExport(lease::encode(uuid, &allocs, &e.at, &lens))))
    }

    /// The segments' device addresses and lengths, with the exported
    /// handles ([`register`](Self::register) first; without it the opaque
    /// bytes are empty and the destination refuses the lease).
    fn lend(&self, region: &Region, kept: Option<&IpcExport>) -> LeaseBlob {
        let opaque = kept.map(|e| e.0.clone()).unwrap_or_default();
        LeaseBlob::new(LaneId::CUDA_IPC, region.segments(), opaque)
    }

    fn pull(
        &self,
        peer: &IpcPeer,
        lease: &LeaseBlob,
        region: &Region,
        shared: &OpShared,
    ) -> PullEnd {
        let pid = peer.process.pid();
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            let detail = format!("CUDA IPC copy from process {pid} failed: {what}: {e}");
            let cause = match what {
                "the source process" => LaneError::SourceGone { detail },
                "bad lease" => LaneError::BadLease { detail },
                "destination" => LaneError::Destination { detail },
                _ => LaneError::Copy { detail },
            };
            PullEnd::failed(SCOPE, cause)
        };
        let t0 = std::time::Instant::now();
        if let Err(e) = peer.process.check() {
            return failed("the source process", &e);
        }
        let lens: Vec<u64> = lease.segments().iter().map(|s| s.1).collect();
        let l = match lease::decode(lease.opaque(), &lens) {
            Ok(l) => l,
            Err(e) => return failed("bad lease", &e),
        };
        // The source's device, where this process sees it.
        let source_device = ipc::ordinal_of(&l.device);
        let (ordinal, host) = match region.device() {
            Some(d) if d.kind() == DeviceKind::Cuda => (d.id(), false),
            Some(d) => return failed("destination", &format!("{d} is not CUDA memory")),
            // Into host memory: on the source's own device where this
            // process sees it (no peer mapping, and no context made on a
            // GPU this process may not otherwise use).
            None => (source_device.unwrap_or(HOST_COPY_DEVICE), true),
        };
        let setup = CopyStream::take(ordinal).and_then(|(stream, ctx)| {
            let opened = l
                .allocs
                .iter()
                .map(|a| peer.open(&ctx, &a.handle))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((stream, opened))
        });
        let (stream, opened) = match setup {
            Ok(s) => s,
            Err(e) => return failed("set-up", &e),
        };
        // `decode` checked each segment against the allocation size the
        // source declared; the driver says what was really mapped.
        if let Some((a, o)) = l
            .allocs
            .iter()
            .zip(&opened)
            .find(|(a, o)| a.size > o.size())
        {
            return failed(
                "bad lease",
                &format!(
                    "an allocation of {} bytes declared, {} mapped",
                    a.size,
                    o.size()
                ),
            );
        }
        // Where segment `i` starts in this process (its allocation's
        // mapping plus its offset): `decode` checked offset + length
        // against the allocation's size.
        let src = |i: usize| -> u64 {
            let (a, off) = l.at[i];
            opened
                .get(a as usize)
                .map_or(0, |o| o.base().wrapping_add(off))
        };
        let t_setup = t0.elapsed();
        let chunk = if host {
            HOST_CHUNK
        } else if source_device == Some(ordinal) {
            DEVICE_CHUNK
        } else {
            PEER_CHUNK
        };
        for unit in units(&lens, chunk) {
            let r = match unit {
                Unit::Run { first, count } => region.copy_into(first, count, None, |local| {
                    if local
                        .iter()
                        .zip(&lens[first..])
                        .any(|(d, &n)| d.1 as u64 != n)
                    {
                        return Err(CudaError::Copy("lease larger than the destination".into()));
                    }
                    // Two segments may be one copy only where they are
                    // blocks of one pool here and lie in one allocation
                    // there: a copy never spans two allocations.
                    let one = |a: usize, b: usize| {
                        region.same_pool(first + a, first + b)
                            && l.at[first + a].0 == l.at[first + b].0
                    };
                    let jobs = local
                        .iter()
                        .enumerate()
                        .map(|(k, &(p, n))| (p, src(first + k), n));
                    let jobs = coalesce(jobs, one);
                    // SAFETY: `copy_into` hands out whole segments of the
                    // region, valid for writes and touched by nothing else
                    // until we return; each source range lies inside an
                    // allocation opened in the stream's context and held
                    // (`opened`) past the sync; the lengths match pairwise.
                    // A merged copy is the union of jobs end to end on both
                    // sides, in one pool here and one allocation there, so
                    // it is covered by theirs.
                    unsafe { copy(&stream, host, jobs) }
                }),
                Unit::Part { seg, off, len } => {
                    region.copy_into(seg, 1, Some((off, len)), |local| {
                        let jobs = local
                            .iter()
                            .map(|&(p, n)| (p, src(seg).wrapping_add(off), n));
                        // SAFETY: as above, for `len` bytes at `off` of
                        // segment `seg` (bounds checked by `copy_into`, and
                        // by `decode` in the source's allocation).
                        unsafe { copy(&stream, host, jobs) }
                    })
                }
            };
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return failed("copy", &e),
                Err(Denied::Closed) => return PullEnd::Closed,
                Err(Denied::OutOfBounds) => {
                    return PullEnd::failed(SCOPE, LaneError::LeaseTooLarge)
                }
                Err(Denied::NotHostMemory) => {
                    return PullEnd::failed(SCOPE, LaneError::NotHostMemory)
                }
            }
        }
        let t_copy = t0.elapsed();
        if let Err(e) = peer.process.confirm() {
            return failed("the source process", &e);
        }
        let end = if region.seal_if_open(|| shared.seal()) {
            PullEnd::Done
        } else {
            PullEnd::Closed
        };
        tracing::debug!(
            bytes = lens.iter().sum::<u64>(),
            setup_us = t_setup.as_micros() as u64,
            copy_us = (t_copy - t_setup).as_micros() as u64,
            sealed_us = (t0.elapsed() - t_copy).as_micros() as u64,
            "CUDA IPC pull"
        );
        end
    }
}

/// Queues one copy per `(destination, source, length)` on `stream`, then
/// waits for all of them, also after a failure to queue one (so that no
/// copy is in flight when this returns).
///
/// # Safety
///
/// Every destination is valid for its length of writes (device memory of
/// the stream's device, or host memory where `host`) and accessed by
/// nothing else until this returns; every source range lies inside an
/// allocation opened in the stream's context that stays open until this
/// returns.
unsafe fn copy(
    stream: &CopyStream,
    host: bool,
    jobs: impl Iterator<Item = (*mut u8, u64, usize)>,
) -> Result<(), CudaError> {
    let _cur = stream.enter()?;
    let mut r = Ok(());
    for (p, src, n) in jobs {
        let dst = if host {
            Dst::Host(p)
        } else {
            Dst::Device(p as usize as u64)
        };
        // SAFETY: the caller's contract, for this one range.
        r = unsafe { stream.queue(dst, src, n) };
        if r.is_err() {
            break;
        }
    }
    let synced = stream.sync();
    r.and(synced)
}

/// `jobs` (copies `(destination, source, length)`, the `k`th of them
/// job `k`) with each run that lies end to end on both sides (the next
/// destination and source start where the previous ones end) merged into
/// one copy, where `one(j, k)` says that jobs `j` and `k` lie in one
/// allocation on both sides (a copy never spans two). Blocks of a pool
/// lent and received in order then cost one driver call, not one each.
/// Empty jobs are left out.
fn coalesce(
    jobs: impl Iterator<Item = (*mut u8, u64, usize)>,
    one: impl Fn(usize, usize) -> bool,
) -> impl Iterator<Item = (*mut u8, u64, usize)> {
    let mut jobs = jobs.enumerate().filter(|j| j.1 .2 > 0).peekable();
    std::iter::from_fn(move || {
        let (first, (p, src, mut n)) = jobs.next()?;
        while let Some(&(k, (q, s, m))) = jobs.peek() {
            let follows = (p as usize).checked_add(n) == Some(q as usize)
                && src.checked_add(n as u64) == Some(s)
                && one(first, k);
            match n.checked_add(m) {
                Some(total) if follows => {
                    n = total;
                    jobs.next();
                }
                _ => break,
            }
        }
        Some((p, src, n))
    })
}

/// One copy of a pull: one `Region::copy_into`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// Whole segments `first..first + count`, a chunk at most.
    Run { first: usize, count: usize },
    /// `len` bytes at `off` of segment `seg`, larger than a chunk.
    Part { seg: usize, off: u64, len: usize },
}

/// The copies of a lease of segments of lengths `lens`, in order: runs of
/// small segments totalling at most `chunk` bytes, and each larger
/// segment cut into chunks.
fn units(lens: &[u64], chunk: u64) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lens.len() {
        if lens[i] > chunk {
            let mut off = 0;
            while off < lens[i] {
                let len = (lens[i] - off).min(chunk);
                out.push(Unit::Part {
                    seg: i,
                    off,
                    len: len as usize,
                });
                off += len;
            }
            i += 1;
            continue;
        }
        let (first, mut bytes) = (i, 0u64);
        while i < lens.len() && lens[i] <= chunk - bytes && (i == first || bytes < chunk) {
            bytes += lens[i];
            i += 1;
        }
        out.push(Unit::Run {
            first,
            count: i - first,
        });
    }
    out
}

#[cfg(test)]
mod conformance;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Descriptor;

    #[test]
    fn jobs_end_to_end_on_both_sides_are_one_copy() {
        let at = |a: usize| a as *mut u8;
        let jobs = vec![
            (at(0x1000), 0x9000, 0x100),
            (at(0x1100), 0x9100, 0x100), // follows on both sides
            (at(0x1200), 0x9300, 0x100), // the source skips
            (at(0x1400), 0x9400, 0x100), // the destination skips
            (at(0x1500), 0x9500, 0),     // empty: dropped
            (at(0x1500), 0x9500, 0x10),
        ];
        let merged: Vec<_> = coalesce(jobs.clone().into_iter(), |_, _| true).collect();
        assert_eq!(
            merged,
            vec![
                (at(0x1000), 0x9000, 0x200),
                (at(0x1200), 0x9300, 0x100),
                (at(0x1400), 0x9400, 0x110),
            ]
        );
        // Never across two allocations, however the addresses lie.
        let apart: Vec<_> = coalesce(jobs.clone().into_iter(), |j, k| j / 2 == k / 2).collect();
        assert_eq!(apart[0], (at(0x1000), 0x9000, 0x200));
        assert_eq!(apart.len(), 4, "{apart:?}");
        let none: Vec<_> = coalesce(jobs.into_iter(), |_, _| false).collect();
        assert_eq!(none.len(), 5, "all but the empty one");
        assert_eq!(coalesce(std::iter::empty(), |_, _| true).count(), 0);
    }

    #[test]
    fn units_are_chunks_or_runs_of_at_most_a_chunk() {
        let c = HOST_CHUNK;
        let u = units(&[1, 2, c - 3, 1, c + 1, 0, 5], c);
        assert_eq!(
            u,
            vec![
                Unit::Run { first: 0, count: 3 },
                Unit::Run { first: 3, count: 1 },
                Unit::Part {
                    seg: 4,
                    off: 0,
                    len: c as usize
                },
                Unit::Part {
                    seg: 4,
                    off: c,
                    len: 1
                },
                Unit::Run { first: 5, count: 2 },
            ]
        );
        // Every segment exactly once; no unit over a chunk.
        let lens: Vec<u64> = (0..300u64).map(|i| (i * 7919) % (3 * c)).collect();
        let mut seen = vec![0u64; lens.len()];
        for u in units(&lens, c) {
            match u {
                Unit::Run { first, count } => {
                    assert!(count >= 1);
                    let bytes: u64 = lens[first..first + count].iter().sum();
                    assert!(bytes <= c || count == 1);
                    for (k, s) in seen[first..first + count].iter_mut().enumerate() {
                        *s += lens[first + k];
                    }
                }
                Unit::Part { seg, len, .. } => {
                    assert!(len as u64 <= c);
                    seen[seg] += len as u64;
                }
            }
        }
        assert_eq!(seen, lens);
        assert!(units(&[], c).is_empty());
        // A GiB into device memory is one copy, into host memory 64.
        assert_eq!(units(&[1 << 30], DEVICE_CHUNK).len(), 1);
        assert_eq!(units(&[(1 << 30) + 1], DEVICE_CHUNK).len(), 2);
        assert_eq!(units(&[1 << 30], HOST_CHUNK).len(), 64);
    }

    /// Without CUDA (this machine): the puller says what it is, lends
    /// nothing it cannot export, and a pull fails with a reason before
    /// touching the region (made-up device addresses, never dereferenced).
    #[test]
    fn without_cuda_lending_and_pulling_fail_cleanly() {
        let p = CudaIpcPuller;
        assert_eq!(p.kind(), TransportKind::CudaIpc);
        let caps = p.caps();
        assert!(caps.lends == MemKinds::DEVICE && caps.pulls_into == MemKinds::BOTH);
        assert_eq!(caps.failure, FailureScope::Request);
        if crate::cuda::available() {
            println!("skipped: CUDA is available here (tests/cuda_ipc.rs runs the real thing)");
            return;
        }
        // SAFETY: never dereferenced: nothing here copies (no CUDA).
        let descs = vec![unsafe { Descriptor::from_cuda_ptr(0x7f00_0000_0000, 4096, 0, false) }];
        // SAFETY: as above.
        let src = unsafe { Region::new(&descs, false) };
        let e = p.register(&src).err().expect("no CUDA: nothing exported");
        assert!(e.to_string().contains("CUDA unavailable"), "{e}");
        let lease = p.lend(&src, None);
        assert_eq!(lease.lane(), LaneId::CUDA_IPC);
        assert!(lease.opaque().is_empty(), "nothing exported");
        assert_eq!(lease.segments(), &[(0x7f00_0000_0000, 4096)]);
        // Host memory is not lent by CUDA IPC.
        let host = vec![Descriptor::from_vec(vec![0; 8])];
        // SAFETY: the vector outlives the region.
        let h = unsafe { Region::new(&host, false) };
        assert!(p.register(&h).is_err());
        h.close();
        src.close();
    }

    /// A lease the destination cannot read fails before any copy.
    #[test]
    fn a_bad_lease_fails_before_any_copy() {
        let peer = IpcPeer::new(Arc::new(
            cma::Peer::open(cma::pid()).expect("attach to this process"),
        ));
        let mut buf = vec![0u8; 16];
        let descs = vec![Descriptor::from_mut_slice(&mut buf)];
        // SAFETY: the buffer outlives the region; nothing else touches it.
        let r = unsafe { Region::new(&descs, true) };
        let shared = OpShared::new(ferry_proto::OperationStatus::InProgress);
        for opaque in [Vec::new(), b"FCIP".to_vec(), b"garbage".to_vec()] {
            let lease = LeaseBlob::new(LaneId::CUDA_IPC, vec![(0x1000, 16)], opaque);
            match CudaIpcPuller.pull(&peer, &lease, &r, &shared) {
                PullEnd::Failed {
                    scope: FailureScope::Request,
                    cause: cause @ LaneError::BadLease { .. },
                } => assert!(cause.to_string().contains("bad lease"), "{cause}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(!shared.is_sealed());
        r.close();
        drop(descs);
        assert_eq!(buf, [0; 16], "nothing landed");
    }
}
