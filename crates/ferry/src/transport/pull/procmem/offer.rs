//! How the lane proves its peer: cross-memory attach's four offers
//! ([`ProcMemExchange`]), with the cookie read
//! through the peer's `/proc/<pid>/mem`.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::{Peer, ProcMem};
use crate::transport::cma;
use crate::transport::probe::owns_socket;
use crate::transport::pull::cma::offer::{PeerExchange, ReadsPeer};
use crate::transport::pull::lanes::Peers;
use crate::transport::pull::offer::OfferCtx;

/// The lane's exchange on a connection: cross-memory attach's four offers,
/// the cookie read through `/proc/<pid>/mem`.
pub(crate) type ProcMemExchange = PeerExchange<ProcMemReads>;

/// The lane's way of reading its peer, for the exchange.
pub(crate) struct ProcMemReads;

impl ReadsPeer for ProcMemReads {
    type Peer = Peer;
    const NAME: &'static str = "/proc/<pid>/mem";
    const CUDA_IPC: bool = false;

    /// Where it is on ([`ProcMem::on`]) and cross-memory attach is enabled
    /// (the same permission).
    fn enabled(ctx: &OfferCtx) -> bool {
        ctx.cma && ProcMem::on()
    }

    fn probe(
        pid: u32,
        addr: u64,
        sock: SocketAddr,
        remote: SocketAddr,
        expected: impl FnOnce() -> [u8; 16] + Send + 'static,
    ) -> Option<(Peer, [u8; 16])> {
        probe(pid, addr, sock, remote, expected)
    }

    fn keep(peer: Arc<Peer>, peers: &Peers) {
        let _ = peers.procmem.set(peer);
    }
}

/// The probe: the process's `mem` file opened through its `/proc/<pid>`
/// directory first, then the kernel's word that this process holds the
/// connection's socket, then the cookie read through that file (a process
/// that replaced its program since reads as nothing).
pub(crate) fn probe(
    pid: u32,
    addr: u64,
    sock: SocketAddr,
    remote: SocketAddr,
    expected: impl FnOnce() -> [u8; 16],
) -> Option<(Peer, [u8; 16])> {
    use std::os::unix::fs::OpenOptionsExt;
    if pid == 0 {
        return None;
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(format!("/proc/{pid}"))
        .map(OwnedFd::from)
        .and_then(|dir| Peer::open(pid, &dir).map(|p| (p, dir)));
    let (peer, dir) = match opened {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(
                pid,
                "/proc/<pid>/mem: cannot open process {pid}'s memory: {e}"
            );
            return None;
        }
    };
    if !owns_socket(pid, &dir, sock, remote) {
        return None;
    }
    let mut got = [0u8; 32];
    // SAFETY: `got` lives in this frame, valid for writes of its 32 bytes
    // and touched by nothing else during the call.
    if let Err(e) = unsafe { peer.read(got.as_mut_ptr(), got.len(), addr) } {
        tracing::debug!(pid, "/proc/<pid>/mem: the cookie cannot be read: {e}");
        return None;
    }
    if got[..16] != expected() {
        tracing::debug!(pid, "/proc/<pid>/mem: the cookie differs");
        return None;
    }
    Some((peer, cma::proof_of(&got)))
}
