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

/// Which end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Active,
    Passive,
}

/// The 16 bytes that side `side` of one connection places in its memory for
/// the other to read: a hash of both sides' fresh nonces and of the
/// connection's two socket addresses. Nobody can make them appear in a
/// process that is not that side of *this* connection: a replayed or relayed
/// cookie belongs to another connection (other nonces, other addresses), and
/// the reader computes the value itself instead of trusting the wire.
pub(crate) fn cookie(
    side: Side,
    active_nonce: &[u8; 16],
    passive_nonce: &[u8; 16],
    active_addr: std::net::SocketAddr,
    passive_addr: std::net::SocketAddr,
) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"ferry-cma-cookie-v1\0");
    h.update([match side {
        Side::Active => 1u8,
        Side::Passive => 2u8,
    }]);
    h.update(active_nonce);
    h.update(passive_nonce);
    h.update(active_addr.to_string().as_bytes());
    h.update([0u8]);
    h.update(passive_addr.to_string().as_bytes());
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Whether the two ends of a connection are on this host as far as the
/// socket can tell (loopback, or the same address on both ends).
pub(crate) fn is_local(local: std::net::SocketAddr, peer: std::net::SocketAddr) -> bool {
    peer.ip().is_loopback() || peer.ip() == local.ip()
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

/// Whether this process can read the 16 bytes at `addr` of process `pid`
/// and they equal `expected`, which is computed only after the read (so that
/// the expected bytes are nowhere in this process's memory while it reads).
/// May block (the peer's pages may fault): call it from a blocking thread.
pub(crate) fn probe(pid: u32, addr: u64, expected: impl FnOnce() -> [u8; 16]) -> bool {
    if pid == 0 {
        return false;
    }
    let mut got = [0u8; 16];
    match pull(pid, &mut got, addr) {
        Ok(()) => {
            let ok = got == expected();
            if !ok {
                tracing::debug!(pid, "cross-memory attach: the probe bytes differ (another pid namespace, or not the peer)");
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
    fn probe_checks_bytes_the_reader_computes() {
        let a: std::net::SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let p: std::net::SocketAddr = "127.0.0.1:2000".parse().unwrap();
        let (na, np) = ([1u8; 16], [2u8; 16]);
        let mine = Box::new(cookie(Side::Active, &na, &np, a, p));
        let addr = mine.as_ptr() as u64;
        assert!(probe(pid(), addr, || cookie(Side::Active, &na, &np, a, p)));
        // Another role, other nonces or another connection: other bytes.
        assert!(!probe(pid(), addr, || cookie(
            Side::Passive,
            &na,
            &np,
            a,
            p
        )));
        assert!(!probe(pid(), addr, || cookie(
            Side::Active,
            &na,
            &[3; 16],
            a,
            p
        )));
        assert!(!probe(pid(), addr, || cookie(Side::Active, &na, &np, p, a)));
        assert!(!probe(0, addr, || *mine));
        // An unmapped address is an error, not a crash.
        let mut b = [0u8; 4];
        assert!(pull(pid(), &mut b, 8).is_err());
    }
}
