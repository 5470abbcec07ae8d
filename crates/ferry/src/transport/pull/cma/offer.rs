//! Cross-memory attach's set-up on a connection, in four offers: the
//! active side sends its pid and fresh nonce (round 0); the passive side
//! answers with its pid, its nonce and where its cookie lies, or pid 0 (it
//! declines; round 1); the active side answers with its verdict on the
//! passive side's cookie and its own pid and cookie address (round 2); the
//! passive side answers with its verdict (round 3). A cookie is a hash of
//! both nonces and the connection's addresses, computed by the reader
//! itself (`transport::cma::cookie`): reading it proves the permission and
//! that the pid names the peer in the reader's pid namespace, and it
//! cannot be replayed or relayed from another connection.
//!
//! The 16 bytes after a cookie are random (its side's *proof bytes*); a
//! verdict echoes the receiver's proof bytes where the sender read them,
//! and a `CanPull` without them proves nothing ([`proves`]): only a peer
//! that proved it can copy this process's memory is lent any (a lease
//! names addresses), never on its word.
//!
//! CUDA IPC rides on this exchange: each offer says whether its sender
//! offers it; device memory is lent where both did and this side did not
//! decline.
//!
//! Another same-host lane that proves its peer the same way (a pid, and a
//! cookie read through its own way of reading the peer) reuses the whole
//! exchange: it implements [`ReadsPeer`] and offers
//! [`PeerExchange<ItsLane>`]; only how it reads is its own.

use std::net::SocketAddr;
use std::sync::Arc;

use ferry_proto::session::{LaneAnswer, LaneProof};
use ferry_proto::wire::WireError;

use crate::host;
use crate::transport::cma::{self, Side};
use crate::transport::probe::{attach, verify_peer};
use crate::transport::pull::lanes::Peers;
use crate::transport::pull::offer::{Kept, LaneOffers, OfferCtx};

/// What one side found when it tried to read the other's cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not probed yet (the first two offers).
    Unknown,
    /// The sender read the receiver's cookie: it can copy from it.
    CanPull,
    /// The kernel refused, or the bytes did not match.
    Refused,
}

/// One offer of the exchange (30 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CmaOffer {
    /// The sender's process id (0: the sender does not offer attach).
    pub(crate) pid: u32,
    /// Where the sender's cookie lies in its memory.
    pub(crate) addr: u64,
    /// The sender's nonce (in the first two offers), or, in a verdict, the
    /// receiver's proof bytes that the sender read (zeros if it read none).
    pub(crate) cookie: [u8; 16],
    /// Whether the sender could read the receiver's cookie.
    pub(crate) verdict: Verdict,
    /// The sender offers CUDA IPC (a CUDA driver that sees a device).
    pub(crate) cuda_ipc: bool,
}

/// The length of an encoded [`CmaOffer`].
pub(crate) const OFFER_LEN: usize = 4 + 8 + 16 + 1 + 1;

impl CmaOffer {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(OFFER_LEN);
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.cookie);
        v.push(match self.verdict {
            Verdict::Unknown => 0,
            Verdict::CanPull => 1,
            Verdict::Refused => 2,
        });
        v.push(u8::from(self.cuda_ipc));
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<CmaOffer, WireError> {
        let b: &[u8; OFFER_LEN] = b
            .try_into()
            .map_err(|_| WireError::InvalidField("cma offer length"))?;
        let mut cookie = [0u8; 16];
        cookie.copy_from_slice(&b[12..28]);
        Ok(CmaOffer {
            pid: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            addr: u64::from_le_bytes(b[4..12].try_into().unwrap_or_default()),
            cookie,
            verdict: match b[28] {
                0 => Verdict::Unknown,
                1 => Verdict::CanPull,
                2 => Verdict::Refused,
                _ => return Err(WireError::InvalidField("verdict")),
            },
            cuda_ipc: match b[29] {
                0 => false,
                1 => true,
                _ => return Err(WireError::InvalidField("cuda ipc offer")),
            },
        })
    }

    /// A verdict: `read` the receiver's proof bytes (`None`: refused).
    fn verdict(pid: u32, addr: u64, read: Option<[u8; 16]>, cuda_ipc: bool) -> CmaOffer {
        CmaOffer {
            pid,
            addr,
            cookie: read.unwrap_or_default(),
            verdict: if read.is_some() {
                Verdict::CanPull
            } else {
                Verdict::Refused
            },
            cuda_ipc,
        }
    }
}

/// Whether `verdict` (the peer's last offer) proves that the peer copied
/// this side's memory: it says `CanPull` and echoes `proof`, the random
/// bytes this side placed next to its cookie (all zeros never count: that
/// is what a verdict without a proof carries). Compared in constant time.
pub(crate) fn proves(verdict: &CmaOffer, proof: &[u8; 16]) -> bool {
    let diff = verdict
        .cookie
        .iter()
        .zip(proof)
        .fold(0u8, |d, (a, b)| d | (a ^ b));
    verdict.verdict == Verdict::CanPull && diff == 0 && *proof != [0; 16]
}

/// A same-host lane that proves its peer with this module's four offers:
/// how it reads the peer's cookie, and where it keeps the peer it proved.
pub(crate) trait ReadsPeer: Send + 'static {
    /// What it holds of a peer it proved.
    type Peer: Send + Sync + 'static;
    /// Its name in logs.
    const NAME: &'static str;
    /// Whether its offers carry CUDA IPC's bit (only cross-memory
    /// attach's do).
    const CUDA_IPC: bool;

    /// Whether this side offers the lane on a connection of `ctx`.
    fn enabled(ctx: &OfferCtx) -> bool;

    /// Its probe, on a probe thread (`probe::verify_peer`): whether
    /// process `pid` holds the socket `sock` -> `remote`
    /// (`probe::owns_socket`) and its cookie at `addr` reads as
    /// `expected`: the peer, and the proof bytes that follow the cookie.
    fn probe(
        pid: u32,
        addr: u64,
        sock: SocketAddr,
        remote: SocketAddr,
        expected: impl FnOnce() -> [u8; 16] + Send + 'static,
    ) -> Option<(Self::Peer, [u8; 16])>;

    /// Keeps the proven peer with the connection.
    fn keep(peer: Arc<Self::Peer>, peers: &Peers);
}

/// Cross-memory attach reads its peer with `process_vm_readv`.
pub(crate) struct Cma;

impl ReadsPeer for Cma {
    type Peer = cma::Peer;
    const NAME: &'static str = "cross-memory attach";
    const CUDA_IPC: bool = true;

    fn enabled(ctx: &OfferCtx) -> bool {
        ctx.cma
    }

    fn probe(
        pid: u32,
        addr: u64,
        sock: SocketAddr,
        remote: SocketAddr,
        expected: impl FnOnce() -> [u8; 16] + Send + 'static,
    ) -> Option<(cma::Peer, [u8; 16])> {
        attach(pid, addr, sock, remote, expected)
    }

    fn keep(peer: Arc<cma::Peer>, peers: &Peers) {
        let _ = peers.process.set(peer);
    }
}

/// Cross-memory attach's exchange.
pub(crate) type CmaExchange = PeerExchange<Cma>;

/// One side's exchange (see the module documentation), for lane `L`.
pub(crate) struct PeerExchange<L: ReadsPeer> {
    active: bool,
    /// Cross-memory attach is enabled here.
    enabled: bool,
    /// `(active, passive)` socket addresses.
    tuple: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
    /// Whether this side offers CUDA IPC.
    ipc: bool,
    /// Both nonces, once known (`None`: this side declined).
    nonces: Option<([u8; 16], [u8; 16])>,
    /// The active side's nonce, before the passive side's arrives.
    mine: [u8; 16],
    /// This side's cookie and proof bytes.
    cookie: Option<Box<[u8; 32]>>,
    /// Both sides offered CUDA IPC (and this side did not decline).
    device: bool,
    /// The peer's process, once this side read its cookie.
    peer: Option<Arc<L::Peer>>,
}

impl<L: ReadsPeer> PeerExchange<L> {
    fn new(active: bool, ctx: &OfferCtx) -> Self {
        PeerExchange {
            active,
            enabled: L::enabled(ctx),
            tuple: ctx.tuple,
            ipc: L::CUDA_IPC && crate::cuda::offers_cuda_ipc(),
            nonces: None,
            mine: [0; 16],
            cookie: None,
            device: false,
            peer: None,
        }
    }

    fn proof(&self) -> [u8; 16] {
        self.cookie
            .as_deref()
            .map(cma::proof_of)
            .unwrap_or_default()
    }

    /// Whether `verdict` proves the peer read this side's cookie.
    fn proved_by(&self, verdict: &CmaOffer) -> bool {
        self.nonces.is_some() && proves(verdict, &self.proof())
    }

    /// Active, round 1: the passive side's offer. Probes its cookie and
    /// answers with this side's verdict and cookie.
    async fn on_offer(&mut self, theirs: CmaOffer) -> LaneAnswer {
        let Some((me, them)) = self.tuple else {
            return LaneAnswer::default();
        };
        let (na, np) = (self.mine, theirs.cookie);
        // A peer that declined (pid 0) lends nothing by attach.
        self.device = self.ipc && theirs.cuda_ipc && theirs.pid != 0;
        self.nonces = Some((na, np));
        let cookie = cma::placed(cma::cookie(Side::Active, &na, &np, me, them));
        // The passive end of this connection is `them` -> `me`.
        let (pid, addr) = (theirs.pid, theirs.addr);
        let verified = verify_peer(pid, move || {
            L::probe(pid, addr, them, me, move || {
                cma::cookie(Side::Passive, &na, &np, me, them)
            })
        })
        .await;
        let at = cookie.as_ptr() as u64;
        self.cookie = Some(cookie);
        let read = verified.as_ref().map(|v| v.1);
        self.peer = verified.map(|v| Arc::new(v.0));
        let answer = CmaOffer::verdict(cma::pid(), at, read, self.device);
        LaneAnswer {
            bytes: Some(answer.encode()),
            settled: None,
        }
    }

    /// Passive, round 0: the active side's nonce. Offers this side's pid,
    /// nonce and cookie, or declines.
    fn on_nonce(&mut self, theirs: CmaOffer) -> LaneAnswer {
        let enabled = self.enabled;
        let usable = self
            .tuple
            .filter(|&(act, pas)| enabled && cma::is_local(pas, act));
        let offer = match usable {
            Some((act, pas)) => {
                let np = host::random_bytes();
                let cookie = cma::placed(cma::cookie(Side::Passive, &theirs.cookie, &np, act, pas));
                let at = cookie.as_ptr() as u64;
                self.cookie = Some(cookie);
                self.nonces = Some((theirs.cookie, np));
                self.device = self.ipc && theirs.cuda_ipc;
                CmaOffer {
                    pid: cma::pid(),
                    addr: at,
                    cookie: np,
                    verdict: Verdict::Unknown,
                    cuda_ipc: self.ipc,
                }
            }
            None => CmaOffer {
                pid: 0,
                addr: 0,
                cookie: [0; 16],
                verdict: Verdict::Unknown,
                cuda_ipc: false,
            },
        };
        LaneAnswer {
            bytes: Some(offer.encode()),
            settled: None,
        }
    }

    /// Passive, round 2: the active side's verdict and cookie. Probes its
    /// cookie; answers with this side's verdict, and settles.
    async fn on_verdict(&mut self, theirs: CmaOffer) -> LaneAnswer {
        // The peer's word counts only with its proof.
        let peer_pulls = self.proved_by(&theirs);
        let verified = match (self.nonces, self.tuple) {
            (Some((na, np)), Some((act, pas))) => {
                // The active end of this connection is `act` -> `pas`.
                let (pid, addr) = (theirs.pid, theirs.addr);
                verify_peer(pid, move || {
                    L::probe(pid, addr, act, pas, move || {
                        cma::cookie(Side::Active, &na, &np, act, pas)
                    })
                })
                .await
            }
            _ => None,
        };
        // The peer's proof bytes go back with the verdict.
        let read = verified.as_ref().map(|v| v.1);
        self.peer = verified.map(|v| Arc::new(v.0));
        let answer = CmaOffer::verdict(0, 0, read, self.device);
        LaneAnswer {
            bytes: Some(answer.encode()),
            settled: Some(self.proof_with(peer_pulls)),
        }
    }

    fn proof_with(&self, peer_pulls: bool) -> LaneProof {
        LaneProof {
            can_pull: self.peer.is_some(),
            peer_pulls,
            device: self.device,
            release_leases: false,
        }
    }
}

impl<L: ReadsPeer> LaneOffers for PeerExchange<L> {
    fn open(ctx: &OfferCtx) -> Option<(Self, Vec<u8>)> {
        let (me, them) = ctx.tuple?;
        if !(L::enabled(ctx) && ctx.same_host && cma::is_local(me, them)) {
            return None;
        }
        let mut e = PeerExchange::new(true, ctx);
        e.mine = host::random_bytes();
        let nonce = CmaOffer {
            pid: cma::pid(),
            addr: 0,
            cookie: e.mine,
            verdict: Verdict::Unknown,
            cuda_ipc: e.ipc,
        };
        Some((e, nonce.encode()))
    }

    fn answering(ctx: &OfferCtx) -> Self {
        PeerExchange::new(false, ctx)
    }

    async fn accept(&mut self, round: u8, bytes: &[u8]) -> Result<LaneAnswer, WireError> {
        let theirs = CmaOffer::decode(bytes)?;
        Ok(match (self.active, round) {
            (true, 1) => self.on_offer(theirs).await,
            (true, _) => {
                // Their verdict on us: it counts only with the proof that
                // they read our memory (our proof bytes, echoed).
                let peer_pulls = self.proved_by(&theirs);
                LaneAnswer {
                    bytes: None,
                    settled: Some(self.proof_with(peer_pulls)),
                }
            }
            (false, 0) => self.on_nonce(theirs),
            (false, _) => self.on_verdict(theirs).await,
        })
    }

    fn keep(self, kept: Kept<'_>) {
        tracing::debug!(
            pull_from_peer = self.peer.is_some(),
            cuda_ipc = self.device,
            "{} probed",
            L::NAME
        );
        if let Some(p) = self.peer {
            L::keep(p, kept.peers);
        }
        if let Some(c) = self.cookie {
            *kept
                .cookie
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_without_its_proof_bytes_proves_nothing() {
        let with = |verdict, cookie| CmaOffer {
            pid: 0,
            addr: 0,
            cookie,
            verdict,
            cuda_ipc: false,
        };
        assert!(proves(&with(Verdict::CanPull, [3; 16]), &[3; 16]));
        assert!(!proves(&with(Verdict::CanPull, [3; 16]), &[4; 16]));
        assert!(!proves(&with(Verdict::Refused, [3; 16]), &[3; 16]));
        assert!(!proves(&with(Verdict::Unknown, [3; 16]), &[3; 16]));
        // Zeros, what a verdict without a proof carries, never count.
        assert!(!proves(&with(Verdict::CanPull, [0; 16]), &[0; 16]));
    }

    #[test]
    fn an_offer_is_exact_and_its_flags_are_yes_or_no() {
        let o = CmaOffer {
            pid: 1234,
            addr: 0x5555_0000,
            cookie: [7; 16],
            verdict: Verdict::CanPull,
            cuda_ipc: true,
        };
        let mut v = o.encode();
        assert_eq!(v.len(), OFFER_LEN);
        assert_eq!(CmaOffer::decode(&v), Ok(o));
        assert_eq!(
            CmaOffer::decode(&v[..OFFER_LEN - 1]),
            Err(WireError::InvalidField("cma offer length"))
        );
        v[29] = 2;
        assert_eq!(
            CmaOffer::decode(&v),
            Err(WireError::InvalidField("cuda ipc offer"))
        );
        v[29] = 0;
        v[28] = 3;
        assert_eq!(
            CmaOffer::decode(&v),
            Err(WireError::InvalidField("verdict"))
        );
    }

    /// The passive side's answer to a nonce: an offer where attach is
    /// enabled and the connection is local; CUDA IPC where both offered it
    /// and this side did not decline.
    #[test]
    fn the_cuda_ipc_offer_needs_both_sides() {
        let local = "127.0.0.1:1".parse().unwrap();
        let ctx = |cma| OfferCtx {
            cma,
            tuple: Some((local, local)),
            ..OfferCtx::default()
        };
        for (enabled, theirs) in [(true, true), (true, false), (false, true)] {
            let mut e = CmaExchange::answering(&ctx(enabled));
            e.ipc = true;
            let nonce = CmaOffer {
                pid: 42,
                addr: 0,
                cookie: [9; 16],
                verdict: Verdict::Unknown,
                cuda_ipc: theirs,
            };
            let a = e.on_nonce(nonce);
            let offer = CmaOffer::decode(&a.bytes.unwrap()).unwrap();
            assert_eq!(offer.pid != 0, enabled);
            assert_eq!(offer.cuda_ipc, enabled);
            assert_eq!(e.device, enabled && theirs, "{enabled} {theirs}");
            assert!(a.settled.is_none());
        }
    }
}
