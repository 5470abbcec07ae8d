//! The passive side of the four `Attach` frames that set up cross-memory
//! attach on a connection (see [`Attach`](crate::wire::Attach)): the
//! active side's nonce, this side's offer, the active side's verdict, this
//! side's verdict. Hashing the cookies and probing the peer stay with the
//! driver; this is the order of the frames, and of the three `Rdma` frames
//! that set up an RDMA backend instead.
//!
//! A verdict of `CanPull` counts only with its proof: each side places, next
//! to its cookie, 16 random bytes of this connection (its *proof bytes*),
//! and a peer that read them echoes them in its verdict's `cookie` field
//! ([`proves`]). Only a peer that proved it can copy this process's memory
//! is lent any (a lease names addresses): a peer's word is not enough.

use super::{Fence, Role, Session, Step, Violation};
use crate::wire::{Attach, Message, Rdma, Verdict};

/// Two nonces: the active side's, then this side's.
pub type Nonces = ([u8; 16], [u8; 16]);

/// Whether `verdict` (the peer's last `Attach` frame) proves that the peer
/// copied this side's memory: it says `CanPull` and echoes `proof`, the
/// random bytes this side placed next to its cookie (all zeros never
/// count: that is what a verdict without a proof carries). Compared in
/// constant time.
pub fn proves(verdict: &Attach, proof: &[u8; 16]) -> bool {
    let diff = verdict
        .cookie
        .iter()
        .zip(proof)
        .fold(0u8, |d, (a, b)| d | (a ^ b));
    verdict.verdict == Verdict::CanPull && diff == 0 && *proof != [0; 16]
}

/// Where the passive side stands in the RDMA set-up (see
/// [`Rdma`](crate::wire::Rdma)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RdmaState {
    /// Nothing received yet.
    #[default]
    Idle,
    /// The active side's address arrived; the driver is answering.
    Answering,
    /// The answer is on its way (`true`: this side reached the peer).
    Answered(bool),
    /// Set up, or declined.
    Done,
}

/// Where the passive side stands in the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachState {
    /// Nothing received yet.
    #[default]
    Idle,
    /// The active side's nonce arrived; the driver is making its offer.
    Offering,
    /// The offer is on its way (`None`: declined).
    Offered(Option<Nonces>),
    /// Set up, or declined.
    Done,
}

impl<T: Fence> Session<T> {
    pub(super) fn on_rdma(&mut self, r: Rdma) -> Result<Step<T>, Violation> {
        if self.role == Role::Active {
            return Err(Violation::RdmaToActiveSide);
        }
        // Either cross-memory attach or RDMA lends on one connection.
        let attached =
            self.attach != AttachState::Idle && (self.caps.can_pull || self.caps.peer_pulls);
        if attached
            || self.attach == AttachState::Offering
            || matches!(self.attach, AttachState::Offered(_))
        {
            return Err(Violation::RdmaOutOfTurn);
        }
        match (self.rdma, r.verdict) {
            (RdmaState::Idle, Verdict::Unknown) if !r.address.is_empty() => {
                self.rdma = RdmaState::Answering;
                // CUDA IPC goes with cross-memory attach, never with UCX.
                self.caps.cuda_ipc = false;
                // The peer's word; this side's comes with its answer.
                self.caps.ucx_cuda = r.cuda;
                Ok(Step::RdmaOffer { address: r.address })
            }
            (RdmaState::Answered(reached), v) if v != Verdict::Unknown && r.address.is_empty() => {
                self.rdma = RdmaState::Done;
                self.caps.peer_pulls = reached && v == Verdict::CanPull;
                if self.caps.peer_pulls {
                    self.rdma_leases = true;
                }
                Ok(Step::Done)
            }
            _ => Err(Violation::RdmaOutOfTurn),
        }
    }

    /// The driver tried to reach the active side's RDMA worker (`reached`):
    /// the answer to send, with this side's worker `address` (ignored
    /// unless `reached`) and whether this side's UCX moves CUDA memory
    /// (`cuda`): device memory is lent through UCX where both said so.
    pub fn rdma_answered(&mut self, reached: bool, address: Vec<u8>, cuda: bool) -> Message {
        let mut cuda = cuda && reached;
        if self.rdma == RdmaState::Answering {
            self.rdma = RdmaState::Answered(reached);
            self.caps.ucx_cuda &= cuda;
            if reached {
                self.caps.attach = true;
                self.caps.can_pull = true;
                self.rdma_leases = true;
            }
        } else {
            cuda = false;
        }
        Message::Rdma(Rdma {
            cuda,
            address: if reached { address } else { Vec::new() },
            verdict: if reached {
                Verdict::CanPull
            } else {
                Verdict::Refused
            },
        })
    }

    pub(super) fn on_attach(&mut self, a: Attach) -> Result<Step<T>, Violation> {
        if self.role == Role::Active {
            return Err(Violation::AttachToActiveSide);
        }
        if self.rdma != RdmaState::Idle {
            return Err(Violation::AttachOutOfTurn);
        }
        match (self.attach, a.verdict) {
            (AttachState::Idle, Verdict::Unknown) => {
                self.attach = AttachState::Offering;
                // The peer's offer; this side's comes with its own.
                self.caps.cuda_ipc = a.cuda_ipc;
                Ok(Step::AttachOffer { nonce: a.cookie })
            }
            (AttachState::Offered(nonces), v) if v != Verdict::Unknown => {
                self.attach = AttachState::Done;
                // The peer's word counts only with its proof.
                self.caps.peer_pulls = nonces.is_some() && proves(&a, &self.proof);
                Ok(Step::AttachVerify {
                    nonces,
                    pid: a.pid,
                    addr: a.addr,
                })
            }
            _ => Err(Violation::AttachOutOfTurn),
        }
    }

    /// The offer for the active side's nonce is on its way (`None`: this
    /// side declined), saying whether this side offers CUDA IPC
    /// (`cuda_ipc`): the connection has it where both sides offered it and
    /// this side did not decline. `proof`: the random bytes this side
    /// placed next to its cookie, which the peer's verdict must echo for
    /// this side to lend it memory ([`proves`]).
    pub fn attach_offered(&mut self, nonces: Option<Nonces>, proof: [u8; 16], cuda_ipc: bool) {
        if self.attach == AttachState::Offering {
            self.attach = AttachState::Offered(nonces);
            self.proof = proof;
            self.caps.cuda_ipc &= cuda_ipc && nonces.is_some();
        }
    }

    /// The probe of the peer ended: `Some(proof)` where this side can copy
    /// from it, with the peer's proof bytes that it read (echoed in the
    /// verdict); `None` where it cannot. The verdict to send.
    pub fn attach_verified(&mut self, read: Option<[u8; 16]>) -> Message {
        let ok = read.is_some();
        self.caps.can_pull = ok;
        Message::Attach(Attach {
            pid: 0,
            addr: 0,
            cookie: read.unwrap_or_default(),
            verdict: if ok {
                Verdict::CanPull
            } else {
                Verdict::Refused
            },
            cuda_ipc: self.caps.cuda_ipc,
        })
    }
}
