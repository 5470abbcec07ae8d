//! Cross-memory attach: one copy between two processes of the same host.
//!
//! The destination's owner always does the copy, with `process_vm_readv`,
//! *into its own memory* and inside its own region's lock (see
//! [`Region::write_at`](crate::region::Region::write_at)). No other process
//! ever writes into a Ferry buffer, so the fence that makes cancellation safe
//! on every other path holds here unchanged: once a cancel or drop returns,
//! no byte lands in that memory. The source side lends its memory for reading
//! ("a lease") and gets it back when the destination says it stopped (its
//! `Finish` or `Abort`) or the connection ends; a source buffer dropped while
//! lent is kept alive until then (see `Region::quarantine`).
//!
//! Whether the kernel lets this process read a peer is probed, never assumed:
//! the peer names its pid and the address of 16 random bytes ([`cookie`]),
//! and we read them. That checks the permission (same user and ptrace
//! allowed, no seccomp filter in the way — Docker's default profile refuses)
//! and that the pid means the peer in *our* pid namespace.

use std::io;

/// 16 random bytes at a fixed address of this process: a peer reads them to
/// prove that it can attach to this process.
pub(crate) fn cookie() -> &'static [u8; 16] {
    static COOKIE: std::sync::OnceLock<Box<[u8; 16]>> = std::sync::OnceLock::new();
    COOKIE.get_or_init(|| Box::new(crate::host::random_bytes()))
}

/// This process's id, as the kernel knows it.
pub(crate) fn pid() -> u32 {
    std::process::id()
}

/// Copies `local.len()` bytes from address `remote` of process `pid` into
/// `local`. Fails unless every byte was copied.
#[cfg(target_os = "linux")]
pub(crate) fn pull(pid: u32, local: &mut [u8], remote: u64) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let remote = usize::try_from(remote).map_err(|_| io::Error::other("address out of range"))?;
    let mut done = 0usize;
    while done < local.len() {
        let rest = &mut local[done..];
        let liov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let riov = libc::iovec {
            iov_base: remote.wrapping_add(done) as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: the kernel writes at most `rest.len()` bytes into `rest`,
        // which we borrow exclusively for the call; it only *reads* the
        // other process (any fault there is reported as an error, never as
        // a write here). The iovec arrays live on this stack frame for the
        // whole call, and their counts are 1.
        let n = unsafe { libc::process_vm_readv(pid, &liov, 1, &riov, 1, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer's memory ended early",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn pull(_pid: u32, _local: &mut [u8], _remote: u64) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "cross-memory attach needs Linux",
    ))
}

/// Copies `local.len()` bytes from address `remote` of process `pid` into
/// `local`: the one system call the `cma` transport is built on, for
/// baselines and diagnostics (`ferry bench` measures it raw). It only writes
/// into `local`; a bad address or a refused permission is an error.
pub fn copy_from_process(pid: u32, remote: u64, local: &mut [u8]) -> io::Result<()> {
    pull(pid, local, remote)
}

/// Whether this process can read the peer that claims to be `pid` with
/// `cookie` at `addr`: the kernel must permit it *and* the bytes must match.
pub(crate) fn probe(pid: u32, addr: u64, cookie: &[u8; 16]) -> bool {
    if pid == 0 {
        return false;
    }
    let mut got = [0u8; 16];
    match pull(pid, &mut got, addr) {
        Ok(()) => {
            let ok = &got == cookie;
            if !ok {
                tracing::debug!(
                    pid,
                    "cross-memory attach: the probe bytes differ (another pid namespace?)"
                );
            }
            ok
        }
        Err(e) => {
            tracing::debug!(pid, "cross-memory attach refused: {e}");
            false
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn probe_reads_own_cookie_and_rejects_wrong_bytes() {
        let c = cookie();
        let addr = c.as_ptr() as u64;
        assert!(probe(pid(), addr, c));
        assert!(!probe(pid(), addr, &[0; 16]));
        assert!(!probe(0, addr, c));
        // An unmapped address is an error, not a crash.
        let mut b = [0u8; 4];
        assert!(pull(pid(), &mut b, 8).is_err());
    }
}
