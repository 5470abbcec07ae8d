//! UCX as a [`Lane`]: the destination gets (`ucp_get_nbx`) what the
//! source lent, chunk by chunk, into its own region; the source lends
//! memory it registered, with remote keys for exactly that memory.
//!
//! Plain memory is registered as exactly the lent ranges while it is lent
//! and unregistered when the last lease of the region ends
//! (`Region::give_back`): a key kept by a peer past the end of its
//! operation grants nothing on transports that check keys (RDMA). Blocks
//! of a [`Pool`](crate::Pool) use the pool's registration, made once and
//! kept until the pool is dropped, unless the connector registers
//! strictly. See `docs/transports.md` ("Registration").
//!
//! Device (GPU) memory goes the same way where this process's UCX moves
//! CUDA memory ([`ucx::moves_cuda`]: a UCX built with CUDA, such as
//! `libucx-cu12`): UCX detects the memory type of what it registers and of
//! the buffers it gets into, and picks its CUDA transports (GPUDirect RDMA
//! where a NIC reaches the GPU, its own CUDA IPC on one host, else staged
//! by UCX). Such gets are never merged across two segments of the
//! destination: two device allocations may lie end to end. On one H100
//! (2026-11-24, `libucx-cu12` 1.22) this moved device memory correctly
//! between two processes of one host, but at 0.48 GB/s for 64 MiB, about
//! 500 times slower than CUDA IPC: UCX probably did not use its own CUDA
//! IPC there (not diagnosed, `docs/gpu.md`). GPUDirect RDMA over a NIC is
//! unverified. A process that simulates a GPU runs the path with host
//! memory.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, MemKinds, Reach};

use super::registration::UcxKeys;
use super::{Lane, LaneError, LeaseBlob, PullEnd};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::{Denied, Region};
use crate::transport::ucx::{
    self, decode_keys, encode_keys, post_get, Batch, Endpoint, MemReg, RemoteKeys,
};

/// How many bytes one copy moves at most (and so how long a cancel waits
/// for one): a chunk of a large segment, or a run of small ones.
const PULL_CHUNK: u64 = 8 << 20;

/// The most requests posted for one copy (a run of small segments).
const MAX_BATCH: usize = 4096;

/// How long gets in flight when their destination is closed (a cancel)
/// may take to end on their own before the pull recalls them by closing
/// the endpoint (see [`Batch::wait_or_recall`]): far longer than a chunk
/// takes from a peer that answers, short enough that a cancel gives the
/// memory back well within a second of meeting one that does not (a
/// stopped process, a cut link).
pub(crate) const RECALL_AFTER: Duration = Duration::from_millis(250);

/// The UCX lane. A peer is an endpoint to the peer's worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UcxPuller {
    /// Register every lent segment as exactly the lent ranges, also blocks
    /// of a pool (see [`register`](Lane::register)).
    strict: bool,
}

impl Default for UcxPuller {
    /// Registers strictly.
    fn default() -> Self {
        UcxPuller { strict: true }
    }
}

/// What a failed get ends: the connection (the peer's endpoint or
/// registration is gone, or it lent memory it does not have).
const SCOPE: FailureScope = FailureScope::Connection;

/// A failed pull, with `cause`.
fn failure(cause: LaneError) -> PullEnd {
    PullEnd::failed(SCOPE, cause)
}

impl UcxPuller {
    /// The lane, registering pools' blocks through the pool's registration
    /// unless `strict` (see [`register`](Lane::register)).
    pub(crate) fn new(strict: bool) -> Self {
        UcxPuller { strict }
    }

    /// The registrations and keys of a source region's memory (see
    /// [`register`](Lane::register)).
    fn register_source(&self, region: &Region) -> Result<UcxKeys, LaneError> {
        let strict = self.strict;
        let failed = |e: String| LaneError::Registration(e);
        let ucx = ucx::ucx_for(strict).map_err(|e| failed(e.to_string()))?;
        let segs = region.segments();
        let mut covered = vec![false; segs.len()];
        let mut pooled: Vec<Arc<MemReg>> = Vec::new();
        for (start, count, cache) in region.pools().iter().filter(|_| !strict) {
            let reg = cache
                .get_or_make(|base, len| MemReg::register(ucx, base, len))
                .map_err(|e| failed(e.to_string()))?;
            // `None`: the pool was released; its blocks go as exact ranges.
            if let Some(reg) = reg {
                covered[*start..start + count].fill(true);
                if !pooled.iter().any(|r| Arc::ptr_eq(r, &reg)) {
                    pooled.push(reg);
                }
            }
        }
        let rest: Vec<(u64, u64)> = segs
            .iter()
            .zip(&covered)
            .filter(|(_, &c)| !c)
            .map(|(s, _)| *s)
            .collect();
        let mut own = Vec::new();
        // Device memory is registered segment by segment: two device
        // allocations may lie end to end, and one registration must not
        // span them.
        let exact: Vec<(u64, u64)> = if region.is_host() {
            ranges(&rest)
        } else {
            rest.iter().copied().filter(|s| s.1 > 0).collect()
        };
        for (base, len) in exact {
            own.push(MemReg::register(ucx, base, len).map_err(|e| failed(e.to_string()))?);
        }
        pooled.extend(own.iter().cloned());
        Ok(UcxKeys {
            keys: encode_keys(&pooled),
            _own: own,
        })
    }
}

impl Lane for UcxPuller {
    type Peer = Endpoint;
    type Registration = UcxKeys;

    fn id(&self) -> LaneId {
        LaneId::UCX
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Ucx
    }

    fn caps(&self) -> LaneCaps {
        // Device memory only where this process's UCX moves CUDA memory.
        let kinds = if ucx::moves_cuda() {
            MemKinds::BOTH
        } else {
            MemKinds::HOST
        };
        LaneCaps {
            id: LaneId::UCX,
            lends: kinds,
            pulls_into: kinds,
            reach: Reach::Network,
            within_process: true,
            failure: SCOPE,
            proven_by: LaneId::UCX,
        }
    }

    /// Registers a source region's memory for as long as it is lent:
    /// blocks of a pool through the pool's registration cache (the whole
    /// pool, once, kept until the pool is dropped) unless strict; every
    /// other segment, and every segment when strict, as exactly the lent
    /// ranges (neighbours merged), unregistered when the region's last
    /// lease ends. A destination needs nothing (UCX registers it itself,
    /// in its own cache).
    fn register(&self, region: &Region) -> Result<Option<UcxKeys>, LaneError> {
        if region.is_writable() {
            return Ok(None);
        }
        if !region.is_host() && !ucx::moves_cuda() {
            return Err(LaneError::Registration(
                "device memory is not lent over UCX here: this process's UCX does not move \
                 CUDA memory"
                    .into(),
            ));
        }
        // UCX's CUDA transports look at device memory through the context
        // current on the calling thread (`ucp_mem_map` of device memory
        // exports it).
        let keys = match region.device().map(|d| d.id()) {
            Some(d) => crate::cuda::context::on_device(d, || self.register_source(region))?,
            None => self.register_source(region)?,
        };
        Ok(Some(keys))
    }

    fn lend(&self, region: &Region, kept: Option<&UcxKeys>) -> LeaseBlob {
        let keys = kept.map_or_else(|| encode_keys(&[]), |k| k.keys.clone());
        LeaseBlob::new(LaneId::UCX, region.segments(), keys)
    }

    fn pull(
        &self,
        peer: &Endpoint,
        lease: &LeaseBlob,
        region: &Region,
        shared: &OpShared,
    ) -> PullEnd {
        let device = !region.is_host();
        let cuda = ucx::moves_cuda();
        if device && !cuda {
            return failure(LaneError::NotHostMemory);
        }
        if cuda {
            // The gets (and the progress that ends them on this thread)
            // may touch device memory on either side: UCX's CUDA
            // transports want a context current here, this destination's
            // device's (else the first device's). No get spans two
            // segments: two device allocations may lie end to end.
            let ordinal = region.device().map_or(0, |d| d.id());
            return crate::cuda::context::on_device(ordinal, || {
                self.pull_all(peer, lease, region, shared, false)
            });
        }
        // Host memory on both sides: gets of neighbouring segments merge.
        self.pull_all(peer, lease, region, shared, true)
    }
}

impl UcxPuller {
    /// Gets every lent segment into `region` (gets across segments merged
    /// where `merge`), then seals it.
    fn pull_all(
        &self,
        peer: &Endpoint,
        lease: &LeaseBlob,
        region: &Region,
        shared: &OpShared,
        merge: bool,
    ) -> PullEnd {
        let keys = match decode_keys(lease.opaque()) {
            Ok(k) => k,
            Err(e) => {
                return failure(LaneError::BadLease {
                    detail: format!("bad keys: {e}"),
                })
            }
        };
        let keys = match RemoteKeys::unpack(peer, &keys) {
            Ok(k) => k,
            Err(e) => {
                return failure(LaneError::BadLease {
                    detail: format!("cannot use the peer's keys: {e}"),
                })
            }
        };
        let segs = lease.segments();
        // Set once a get was recalled (the endpoint closed).
        let recalled = Cell::new(false);
        let open = || region.is_open();
        let mut i = 0;
        while i < segs.len() {
            let count = batch(segs, i);
            let r = if count > 0 {
                let lent = &segs[i..i + count];
                let r = region.copy_into(i, count, None, |local| {
                    get_all(&keys, local, lent, merge, &open, &recalled)
                });
                i += count;
                r
            } else {
                // One large segment, a chunk at a time.
                let (addr, len) = segs[i];
                let mut off = 0u64;
                let mut r = Ok(Ok(()));
                while off < len {
                    let n = (len - off).min(PULL_CHUNK);
                    let at = addr.saturating_add(off);
                    r = region.copy_into(i, 1, Some((off, n as usize)), |local| {
                        get_all(&keys, local, &[(at, n)], merge, &open, &recalled)
                    });
                    if !matches!(r, Ok(Ok(()))) {
                        break;
                    }
                    off += n;
                }
                i += 1;
                r
            };
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return failure(e),
                Err(Denied::Closed) if recalled.get() => return failure(recalled_cause()),
                Err(Denied::Closed) => return PullEnd::Closed,
                Err(Denied::NotHostMemory) => return failure(LaneError::NotHostMemory),
                Err(Denied::OutOfBounds) => return failure(LaneError::LeaseTooLarge),
            }
        }
        if let Some(why) = peer.failure() {
            return failure(LaneError::SourceGone {
                detail: format!("the peer's UCX endpoint failed: {why}"),
            });
        }
        if region.seal_if_open(|| shared.seal()) {
            PullEnd::Done
        } else {
            PullEnd::Closed
        }
    }
}

/// Why a pull whose gets were recalled ends its connection: the endpoint
/// is closed, so the lane is gone on that connection (the next operation
/// to the peer connects again).
fn recalled_cause() -> LaneError {
    LaneError::Recalled {
        detail: format!(
            "a cancel met UCX gets that the peer did not answer within {RECALL_AFTER:?}: \
             recalled by closing the connection's UCX endpoint"
        ),
    }
}

/// Gets every lent range into the local one of the same index (equal
/// lengths pairwise, neighbours on both sides merged where `merge`),
/// waiting for all; or, where the destination is closed meanwhile (`open`
/// turns false) and the gets do not end within [`RECALL_AFTER`], recalls
/// them (the endpoint is closed, `recalled` set) and waits for that.
fn get_all(
    keys: &RemoteKeys<'_>,
    local: &[(*mut u8, usize)],
    lent: &[(u64, u64)],
    merge: bool,
    open: &dyn Fn() -> bool,
    recalled: &Cell<bool>,
) -> Result<(), LaneError> {
    if local.len() != lent.len() || local.iter().zip(lent).any(|(l, r)| l.1 as u64 != r.1) {
        return Err(LaneError::LeaseTooLarge);
    }
    // Pairs whose both sides continue the previous pair become one get.
    let mut pairs: Vec<(*mut u8, u64, u64)> = Vec::with_capacity(local.len());
    for (&(p, n), &(a, _)) in local.iter().zip(lent) {
        if n == 0 {
            continue;
        }
        match pairs.last_mut() {
            Some((q, r, m))
                if merge && q.wrapping_add(*m as usize) == p && r.checked_add(*m) == Some(a) =>
            {
                *m += n as u64
            }
            _ => pairs.push((p, a, n as u64)),
        }
    }
    let ep = keys.endpoint();
    let api = &ep.worker.ucx.api;
    let batch = Batch::new();
    let mut failed = None;
    for (p, a, n) in pairs {
        let Some(rkey) = keys.find(a, n) else {
            failed = Some(LaneError::NotLent {
                detail: format!("{n} bytes at {a:#x} that no key of its lease covers"),
            });
            break;
        };
        // SAFETY: `p` points to `n` bytes of the destination that
        // `copy_into` handed out and counts as in flight until this
        // function returns, which is after every get ended
        // (`wait_or_recall` below returns only then, a recalled get
        // included); the key stays unpacked until after that too.
        if let Err(s) = unsafe { post_get(ep, &batch, p, n as usize, a, rkey) } {
            failed = Some(LaneError::Copy {
                detail: format!("ucp_get_nbx: {}", api.describe(s)),
            });
            break;
        }
    }
    let (status, recall) = batch.wait_or_recall(ep, open, RECALL_AFTER);
    if recall {
        recalled.set(true);
    }
    if let Some(f) = failed {
        return Err(f);
    }
    match status {
        None => Ok(()),
        Some(s) => Err(LaneError::Copy {
            detail: format!("a UCX get failed: {}", api.describe(s)),
        }),
    }
}

/// How many segments from `i` on one copy moves: at most [`PULL_CHUNK`]
/// bytes and [`MAX_BATCH`] segments; 0 when segment `i` alone is larger
/// than a chunk.
fn batch(segs: &[(u64, u64)], i: usize) -> usize {
    let (mut count, mut bytes) = (0usize, 0u64);
    while let Some(&(_, len)) = segs.get(i + count) {
        if len > PULL_CHUNK - bytes || count == MAX_BATCH {
            break;
        }
        bytes += len;
        count += 1;
    }
    count
}

/// The ranges a region's segments cover, sorted, overlapping or touching
/// ones merged (what gets registered: exactly the lent bytes).
fn ranges(segs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut s: Vec<(u64, u64)> = segs.iter().copied().filter(|s| s.1 > 0).collect();
    s.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, n) in s {
        match out.last_mut() {
            Some((b, m)) if a <= b.saturating_add(*m) => {
                let end = a.saturating_add(n).max(b.saturating_add(*m));
                *m = end - *b;
            }
            _ => out.push((a, n)),
        }
    }
    out
}

#[cfg(test)]
mod conformance;
pub(crate) mod offer;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_ranges_are_exactly_the_lent_bytes() {
        let segs = [(100, 10), (0, 50), (110, 5), (40, 20), (500, 0), (200, 1)];
        assert_eq!(ranges(&segs), vec![(0, 60), (100, 15), (200, 1)]);
        assert_eq!(batch(&[(0, 1), (1, 1), (5, PULL_CHUNK)], 0), 2);
        assert_eq!(batch(&[(0, PULL_CHUNK + 1)], 0), 0);
    }
}
