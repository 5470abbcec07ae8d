//! The destination's side of cross-memory attach: copying what the source
//! lent, chunk by chunk, through the destination's region.

use super::*;

/// How a cross-memory copy ended.
pub(super) enum PullEnd {
    /// Every byte landed and the operation is sealed.
    Done,
    /// The destination closed (a cancel or the end of the operation).
    Closed,
    /// The copy failed; the operation must fail on both sides.
    Failed(String),
}

/// Copies every segment of a lease from process `peer` into `region`, one
/// chunk per system call, each outside the region's lock (the peer may stall
/// it: see `Region::copy_into`), then seals the operation under that lock.
/// Every copy, a check before the first and a confirmation before the seal
/// make sure that `peer` still runs the program that passed the attach probe.
pub(super) fn pull_all(
    peer: &cma::Peer,
    region: &Region,
    shared: &OpShared,
    segs: &[(u64, u64)],
) -> PullEnd {
    /// The most iovecs of one system call: one fewer than Linux's
    /// `IOV_MAX`, since `Peer::pull_many` adds the range that checks the
    /// program image.
    pub(super) const MAX_IOV: usize = 1023;
    let pid = peer.pid();
    let failed =
        |e: io::Error| PullEnd::Failed(format!("cross-memory copy from process {pid} failed: {e}"));
    if let Err(e) = peer.check() {
        return failed(e);
    }
    let mut i = 0;
    while i < segs.len() {
        // Small segments in a row: one vectored call for up to a chunk.
        let mut count = 0;
        let mut bytes = 0u64;
        while i + count < segs.len() && count < MAX_IOV && segs[i + count].1 <= PULL_CHUNK - bytes {
            bytes += segs[i + count].1;
            count += 1;
        }
        if count > 1 {
            let batch = &segs[i..i + count];
            let r = region.copy_into(i, count, None, |local| {
                if local.iter().zip(batch).any(|(l, r)| l.1 as u64 != r.1) {
                    return Err(io::Error::other("lease larger than the destination"));
                }
                // SAFETY: `copy_into` hands out whole segments of the region,
                // counted as in flight until we return: valid for writes and
                // touched by nothing else meanwhile; the lengths match the
                // lease pairwise (checked above) and `count` <= IOV_MAX.
                unsafe { peer.pull_many(local, batch) }
            });
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return failed(e),
                Err(Denied::Closed) => return PullEnd::Closed,
                Err(Denied::OutOfBounds) => {
                    return PullEnd::Failed("lease larger than the destination".into())
                }
            }
            i += count;
            continue;
        }
        let (addr, len) = segs[i];
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(PULL_CHUNK) as usize;
            let Some(at) = addr.checked_add(off) else {
                return PullEnd::Failed("lease address overflows".into());
            };
            // SAFETY: `copy_into` hands out `n` bytes at `off` of segment
            // `i` (bounds checked), counted as in flight until we return:
            // valid for writes and touched by nothing else meanwhile; one
            // local and one remote range of the same length.
            let r = region.copy_into(i, 1, Some((off, n)), |local| unsafe {
                peer.pull_many(local, &[(at, n as u64)])
            });
            match r {
                Ok(Ok(())) => off += n as u64,
                Ok(Err(e)) => return failed(e),
                Err(Denied::Closed) => return PullEnd::Closed,
                Err(Denied::OutOfBounds) => {
                    return PullEnd::Failed("lease larger than the destination".into())
                }
            }
        }
        i += 1;
    }
    if let Err(e) = peer.confirm() {
        return failed(e);
    }
    if region.seal_if_open(|| shared.seal()) {
        PullEnd::Done
    } else {
        PullEnd::Closed
    }
}
