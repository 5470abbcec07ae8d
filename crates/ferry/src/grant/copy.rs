//! The copies of a grant's cross-memory attach lane: reads with the
//! transport's checked `Peer::pull_many`; writes with `process_vm_writev`
//! (here, beside its only user), the one place where Ferry writes into
//! another process's memory, inside the owner's grant fence.

use std::io;

use crate::transport::cma::Peer;

/// Linux's `IOV_MAX`: the most ranges one call takes.
const IOV_MAX: usize = 1024;

/// Copies the ranges `local`, in order, into the ranges `remote` (address,
/// length) of process `pid`, in order, in one `process_vm_writev`. Fails
/// unless every byte was copied.
///
/// # Safety
///
/// Every `local[i]` must be valid for reads of its length during the call
/// (nothing may write it meanwhile). `local` and `remote` must each have at
/// most `IOV_MAX` (1024) ranges, with equal totals.
#[cfg(target_os = "linux")]
unsafe fn push_many(
    pid: u32,
    local: &[(*const u8, usize)],
    remote: &[(u64, u64)],
) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let liov: Vec<libc::iovec> = local
        .iter()
        .map(|&(p, n)| libc::iovec {
            iov_base: p.cast_mut().cast(),
            iov_len: n,
        })
        .collect();
    let mut riov = Vec::with_capacity(remote.len());
    for &(a, n) in remote {
        riov.push(libc::iovec {
            iov_base: usize::try_from(a).map_err(|_| io::Error::other("address out of range"))?
                as *mut libc::c_void,
            iov_len: usize::try_from(n).map_err(|_| io::Error::other("length out of range"))?,
        });
    }
    let total: usize = local.iter().map(|l| l.1).sum();
    loop {
        // SAFETY: by this function's contract every local iovec is valid
        // for reads of its length during the call; the kernel writes only
        // the other process's memory; both arrays live until the call
        // returns and their counts are theirs.
        let n = unsafe {
            libc::process_vm_writev(
                pid,
                liov.as_ptr(),
                liov.len() as libc::c_ulong,
                riov.as_ptr(),
                riov.len() as libc::c_ulong,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n as usize != total {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer's memory ended early",
            ));
        }
        return Ok(());
    }
}

#[cfg(not(target_os = "linux"))]
unsafe fn push_many(_pid: u32, _l: &[(*const u8, usize)], _r: &[(u64, u64)]) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "cross-memory attach needs Linux",
    ))
}

/// Writes the ranges `local` into the ranges `remote` of process `pid`,
/// pairwise (equal lengths). The caller has just made sure that `pid` names
/// the owner (the holder's `Liveness`): a write cannot read the image's
/// bytes in the same system call, so a process that replaced its program
/// between that check and the write (microseconds) would take it. Blocking.
///
/// # Safety
///
/// Every `local[i]` must be valid for reads of its length during the call;
/// `local[i]` and `remote[i]` have equal lengths.
pub(super) unsafe fn write(
    pid: u32,
    local: &[(*const u8, usize)],
    remote: &[(u64, u64)],
) -> io::Result<()> {
    for (l, r) in local.chunks(IOV_MAX).zip(remote.chunks(IOV_MAX)) {
        // SAFETY: the caller's ranges, under this function's contract: at
        // most IOV_MAX per call, equal lengths pairwise.
        unsafe { push_many(pid, l, r) }?;
    }
    Ok(())
}

/// Reads the ranges `remote` of `peer` into the ranges `local`, pairwise,
/// each call checked against the probed image (`Peer::pull_many`).
/// Blocking.
///
/// # Safety
///
/// Every `local[i]` must be valid for writes of its length, and touched by
/// nothing else during the call; `local[i]` and `remote[i]` have equal
/// lengths.
pub(super) unsafe fn read(
    peer: &Peer,
    local: &[(*mut u8, usize)],
    remote: &[(u64, u64)],
) -> io::Result<()> {
    // SAFETY: the caller's contract is `Peer::pull_many`'s.
    unsafe { peer.pull_many(local, remote) }
}

/// The copies of one operation: `local[u]` into (or from) `remote[u]` for
/// each unit `u`, one system call each.
pub(super) struct Plan<L> {
    pub(super) local: Vec<(L, usize)>,
    pub(super) remote: Vec<(u64, u64)>,
    pub(super) units: Vec<std::ops::Range<usize>>,
    /// Whether the units are worth sharing among threads.
    pub(super) parallel: bool,
}

// SAFETY: a plan holds the addresses of ranges and nothing else (`Offset`
// is implemented for raw byte pointers only); threads sharing it only read
// them and hand them to the kernel, under `run`'s caller's contract that
// the memory is valid for the copy meanwhile.
unsafe impl<L: Offset> Sync for Plan<L> {}

/// An operation of at least this many bytes is copied by more than one
/// thread, as a per-operation pull is (`transport::pull::cma`'s
/// `PARALLEL_FROM`, the same figure).
const PARALLEL_FROM: u64 = 8 << 20;

/// Plans the copy of the pairs `local`, `remote` (from [`pair`]) as a
/// per-operation pull plans a lease (`transport::pull::cma::plan`): the
/// pairs in the order of their remote address (the kernel pins a remote
/// page per range, and ranges in address order meet the page tables they
/// need still in cache), cut into units of at most one chunk
/// ([`CHUNK`](crate::transport::cma::CHUNK), 2 MiB) and `IOV_MAX - 1`
/// ranges (a checked read adds one), which [`run`] shares among threads
/// for operations of 8 MiB or more. Pairs stay equal pairwise.
pub(super) fn plan<L: Copy + Offset>(local: &[(L, usize)], remote: &[(u64, u64)]) -> Plan<L> {
    use crate::transport::cma::CHUNK;
    let mut order: Vec<usize> = (0..local.len().min(remote.len())).collect();
    if remote.windows(2).any(|w| w[0].0 > w[1].0) {
        order.sort_unstable_by_key(|&i| remote[i].0);
    }
    let mut p = Plan {
        local: Vec::with_capacity(order.len()),
        remote: Vec::with_capacity(order.len()),
        units: Vec::new(),
        parallel: false,
    };
    let (mut start, mut bytes, mut total) = (0usize, 0usize, 0u64);
    for i in order {
        let (mut l, mut n) = local[i];
        let mut r = remote[i].0;
        total = total.saturating_add(n as u64);
        while n > 0 {
            let take = n.min(CHUNK - bytes);
            p.local.push((l, take));
            p.remote.push((r, take as u64));
            (l, r, n, bytes) = (
                l.offset(take),
                r.wrapping_add(take as u64),
                n - take,
                bytes + take,
            );
            if bytes == CHUNK || p.local.len() - start == IOV_MAX - 1 {
                p.units.push(start..p.local.len());
                (start, bytes) = (p.local.len(), 0);
            }
        }
    }
    if start < p.local.len() {
        p.units.push(start..p.local.len());
    }
    p.parallel = total >= PARALLEL_FROM && p.units.len() > 1;
    p
}

/// A local address `n` bytes on.
pub(super) trait Offset {
    fn offset(self, n: usize) -> Self;
}

impl Offset for *mut u8 {
    fn offset(self, n: usize) -> Self {
        self.wrapping_add(n)
    }
}

impl Offset for *const u8 {
    fn offset(self, n: usize) -> Self {
        self.wrapping_add(n)
    }
}

/// Runs `copy` on every unit of `plan`: in order on this thread, or, for a
/// parallel plan, shared with the per-operation pulls' helper threads
/// (`transport::pull::share`, within the same process-wide budget). Stops
/// at the first failure and returns it, once every thread has stopped.
pub(super) fn run<L: Offset>(
    plan: &Plan<L>,
    copy: impl Fn(&[(L, usize)], &[(u64, u64)]) -> io::Result<()> + Sync,
) -> io::Result<()> {
    let one = |u: &std::ops::Range<usize>| copy(&plan.local[u.clone()], &plan.remote[u.clone()]);
    if !plan.parallel {
        return plan.units.iter().try_for_each(one);
    }
    use crate::transport::pull::{share, PullEnd};
    let failed = std::sync::Mutex::new(None);
    let end = share::run(&plan.units, share::max_threads() - 1, |u| {
        one(u).map_err(|e| {
            failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
            // Only stops the other threads; the cause is `failed`.
            PullEnd::Closed
        })
    });
    match end {
        None => Ok(()),
        Some(_) => Err(failed
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or_else(|| io::Error::other("a copy stopped"))),
    }
}

/// A local range: where, how many bytes.
pub(super) type Local = (*mut u8, usize);

/// Pairs the local block ranges with the remote ones (equal lengths
/// pairwise), merging a pair into the previous one where both sides follow
/// on in memory: fewer, larger ranges, still equal pairwise.
pub(super) fn pair(
    local: &[(*mut u8, usize)],
    remote: &[(u64, u64)],
) -> (Vec<Local>, Vec<(u64, u64)>) {
    let mut l: Vec<Local> = Vec::with_capacity(local.len());
    let mut r: Vec<(u64, u64)> = Vec::with_capacity(remote.len());
    for (&(la, n), &(ra, _)) in local.iter().zip(remote) {
        match (l.last_mut(), r.last_mut()) {
            (Some((l0, len)), Some((r0, rlen)))
                if l0.wrapping_add(*len) == la && r0.wrapping_add(*rlen) == ra =>
            {
                *len += n;
                *rlen += n as u64;
            }
            _ => {
                l.push((la, n));
                r.push((ra, n as u64));
            }
        }
    }
    (l, r)
}

/// The local pieces of a range transfer: for each `(block, offset)` of
/// `at` (checked: `ferry_proto::grant::ranges::local`), the address of
/// that offset in the block, taking `remote[i].len` bytes. `blocks` are
/// the segments of a descriptor over blocks `ids` (ascending, each once:
/// `ranges::local_blocks`), a block each.
pub(super) fn pieces(
    blocks: &[(*mut u8, usize)],
    ids: &[u32],
    at: &[(u32, u64)],
    remote: &[ferry_proto::grant::BlockRange],
) -> Vec<Local> {
    at.iter()
        .zip(remote)
        .map(|(&(block, offset), r)| {
            let seg = ids
                .binary_search(&block)
                .ok()
                .and_then(|i| blocks.get(i))
                .map_or(std::ptr::null_mut(), |s| s.0);
            (seg.wrapping_add(offset as usize), r.len as usize)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn neighbours_merge_only_on_both_sides() {
        let mut mem = [0u8; 64];
        let p = mem.as_mut_ptr();
        let at = |i: usize| p.wrapping_add(i * 8);
        let local = [(at(0), 8), (at(1), 8), (at(2), 8), (at(5), 8)];
        let remote = [(100, 8), (108, 8), (200, 8), (208, 8)];
        let (l, r) = super::pair(&local, &remote);
        assert_eq!(l, vec![(at(0), 16), (at(2), 8), (at(5), 8)]);
        assert_eq!(r, vec![(100, 16), (200, 8), (208, 8)]);
    }

    #[test]
    fn a_plan_goes_by_remote_address_in_chunks() {
        use crate::transport::cma::CHUNK;
        let base = std::ptr::null_mut::<u8>().wrapping_add(1 << 40);
        let local = [(base, 8), (base.wrapping_add(8), CHUNK + 8)];
        let remote = [(500, 8), (100, (CHUNK + 8) as u64)];
        let p = super::plan(&local, &remote);
        assert_eq!(
            p.remote,
            vec![(100, CHUNK as u64), (100 + CHUNK as u64, 8), (500, 8)]
        );
        assert_eq!(p.local[1], (base.wrapping_add(8 + CHUNK), 8));
        assert_eq!(p.units, vec![0..1, 1..3]);
        assert!(!p.parallel);
        // Many small ranges: at most IOV_MAX - 1 per unit.
        let local: Vec<_> = (0..3000).map(|i| (base.wrapping_add(i * 16), 8)).collect();
        let remote: Vec<_> = (0..3000).map(|i| (i as u64 * 16, 8)).collect();
        let p = super::plan(&local, &remote);
        assert_eq!(p.units, vec![0..1023, 1023..2046, 2046..3000]);
    }
}
