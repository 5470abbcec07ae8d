//! The lane's raw baseline: `process_vm_readv` / `process_vm_writev`
//! between the two processes of the run, no protocol, no fence: the bytes
//! the kernel copies for a one-sided operation of cross-memory attach, and
//! the process CPU clock the idle figure reads.
//!
//! READ copies with `process_vm_readv` (the sweep's `cma` baseline,
//! [`copy_in_chunks`](crate::peer::copy_in_chunks), and
//! [`copy_ranges_from_process`](ferry::cross_memory::copy_ranges_from_process)
//! for scattered blocks); WRITE with `process_vm_writev` from this process
//! into the owner's memory, the call a grant's WRITE makes. Both in calls
//! of at most [`CHUNK`] bytes and [`MAX_RANGES`] ranges.
#![allow(unsafe_code)]

use std::io;

use ferry::cross_memory::{copy_ranges_from_process, CHUNK};

/// The most ranges per call on either side (one fewer than `IOV_MAX`, as
/// Ferry's pulls).
pub(super) const MAX_RANGES: usize = 1023;

/// Copies `local.len()` bytes from `addr` of process `pid` into `local`.
pub(super) fn read(pid: u32, addr: u64, local: &mut [u8]) -> io::Result<()> {
    crate::peer::copy_in_chunks(pid, addr, local)
}

/// Copies `local` to `addr` of process `pid`, in calls of [`CHUNK`] bytes.
pub(super) fn write(pid: u32, addr: u64, local: &[u8]) -> io::Result<()> {
    for (i, c) in local.chunks(CHUNK).enumerate() {
        let at = addr
            .checked_add((i * CHUNK) as u64)
            .ok_or_else(|| io::Error::other("address overflows"))?;
        write_ranges(pid, &[(at, c.len() as u64)], &[c])?;
    }
    Ok(())
}

/// Copies blocks of `block` bytes: `remote[k]` (an index into the
/// process's memory at `base`) from or into `local[k]`, in calls of at most
/// [`CHUNK`] bytes and [`MAX_RANGES`] ranges, one range per block.
pub(super) fn blocks(
    pid: u32,
    base: u64,
    block: usize,
    remote: &[u32],
    local: Local<'_, '_>,
) -> io::Result<()> {
    let per = (CHUNK / block.max(1)).clamp(1, MAX_RANGES);
    let ranges = |ids: &[u32]| -> io::Result<Vec<(u64, u64)>> {
        ids.iter()
            .map(|&id| {
                (id as u64)
                    .checked_mul(block as u64)
                    .and_then(|o| base.checked_add(o))
                    .map(|at| (at, block as u64))
                    .ok_or_else(|| io::Error::other("block lies past the address space"))
            })
            .collect()
    };
    match local {
        Local::Into(dst) => {
            for (d, ids) in dst.chunks_mut(per).zip(remote.chunks(per)) {
                copy_ranges_from_process(pid, &ranges(ids)?, d)?;
            }
        }
        Local::From(src) => {
            for (s, ids) in src.chunks(per).zip(remote.chunks(per)) {
                write_ranges(pid, &ranges(ids)?, s)?;
            }
        }
    }
    Ok(())
}

/// This process's side of a copy of blocks: where a READ lands, or what a
/// WRITE sends.
pub(super) enum Local<'a, 'b> {
    /// A READ's destinations, one per block.
    Into(&'a mut [&'b mut [u8]]),
    /// A WRITE's sources, one per block.
    From(&'a [&'b [u8]]),
}

/// One `process_vm_writev` of the slices `local` (in order) into the
/// ranges `remote` (`(address, length)`, in order) of process `pid`: at
/// most [`MAX_RANGES`] on each side, with equal totals.
pub(super) fn write_ranges(pid: u32, remote: &[(u64, u64)], local: &[&[u8]]) -> io::Result<()> {
    let mine: u64 = local.iter().map(|l| l.len() as u64).sum();
    let theirs = remote
        .iter()
        .try_fold(0u64, |t, r| t.checked_add(r.1))
        .ok_or_else(|| io::Error::other("remote lengths overflow"))?;
    if mine != theirs || local.len() > MAX_RANGES || remote.len() > MAX_RANGES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "at most 1023 ranges on each side, with equal totals",
        ));
    }
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let liov: Vec<libc::iovec> = local
        .iter()
        .map(|l| libc::iovec {
            iov_base: l.as_ptr() as *mut libc::c_void,
            iov_len: l.len(),
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
    loop {
        // SAFETY: every local iovec points into a live `&[u8]` of its
        // length, which the kernel only reads; the remote ranges are the
        // other process's memory, which the kernel checks and writes (an
        // address it does not map is an error, never a write here); both
        // arrays live until the call returns and their counts are theirs.
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
        if n as u64 != mine {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer's memory ended early",
            ));
        }
        return Ok(());
    }
}

/// Nanoseconds of CPU this process has used, all its threads
/// (`CLOCK_PROCESS_CPUTIME_ID`; 0 if it cannot be read).
pub(super) fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` on this stack frame for
    // the whole call; `clock_gettime` writes only into it.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process may write into its own memory by `process_vm_writev`:
    /// the call and its checks, without a second process.
    #[test]
    fn writes_land_in_the_named_ranges() {
        let mut dst = vec![0u8; 64];
        let src = [7u8; 16];
        let base = dst.as_mut_ptr() as u64;
        let pid = std::process::id();
        write_ranges(
            pid,
            &[(base + 8, 8), (base + 40, 8)],
            &[&src[..8], &src[8..]],
        )
        .unwrap();
        let got = std::hint::black_box(&dst);
        assert!(got[8..16].iter().all(|&b| b == 7) && got[40..48].iter().all(|&b| b == 7));
        assert_eq!(got.iter().filter(|&&b| b == 7).count(), 16);
        assert!(
            write_ranges(pid, &[(base, 4)], &[&src[..8]]).is_err(),
            "totals differ"
        );
    }

    #[test]
    fn the_cpu_clock_advances() {
        let a = process_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i * i));
        }
        assert!(process_cpu_ns() > a, "{x}");
    }
}
