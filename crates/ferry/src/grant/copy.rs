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

/// Writes the ranges `local` into the ranges `remote` of `peer`, pairwise
/// (equal lengths), after `Peer::check` (one 16-byte read) showed it still
/// runs the probed image: a write cannot read the image's bytes in the same
/// system call, so a process that replaced its program between the check
/// and the write (microseconds) would take it. Blocking.
///
/// # Safety
///
/// Every `local[i]` must be valid for reads of its length during the call;
/// `local[i]` and `remote[i]` have equal lengths.
pub(super) unsafe fn write(
    peer: &Peer,
    local: &[(*const u8, usize)],
    remote: &[(u64, u64)],
) -> io::Result<()> {
    peer.check()?;
    for (l, r) in local.chunks(IOV_MAX).zip(remote.chunks(IOV_MAX)) {
        // SAFETY: the caller's ranges, under this function's contract: at
        // most IOV_MAX per call, equal lengths pairwise.
        unsafe { push_many(peer.pid(), l, r) }?;
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
}
