//! UCX's set-up on a connection, in three offers: the active side sends its
//! worker's address (round 0); the passive side answers with its own
//! address and whether it reached the active side's worker (`CanPull`: it
//! may copy from the active side), or an empty address and `Refused`
//! (round 1); the active side answers with its verdict on the passive
//! side's worker, and no address (round 2). Each offer also says whether
//! its sender's UCX moves CUDA memory: where both say so, device memory is
//! lent through UCX too. A connection sets up UCX only where cross-memory
//! attach proved nothing.

use std::sync::Arc;

use ferry_proto::session::{LaneAnswer, LaneProof};
use ferry_proto::wire::WireError;

use crate::transport::pull::offer::{Kept, LaneOffers, OfferCtx};
use crate::transport::ucx::{self, Endpoint, Worker, MAX_ADDRESS};

/// Whether the sender reached the receiver's worker (not yet, in the
/// first offer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The first offer.
    Unknown,
    /// The sender reached the receiver's worker.
    CanPull,
    /// It did not, or declines.
    Refused,
}

/// One offer of the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UcxOffer {
    /// The sender's worker address (at most `MAX_ADDRESS` bytes; empty in
    /// the third offer, or when declining).
    pub(crate) address: Vec<u8>,
    /// Whether the sender reached the receiver's worker.
    pub(crate) verdict: Verdict,
    /// Whether the sender's UCX moves CUDA memory.
    pub(crate) cuda: bool,
}

impl UcxOffer {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let a = &self.address[..self.address.len().min(MAX_ADDRESS)];
        let mut v = Vec::with_capacity(a.len() + 6);
        v.extend_from_slice(&(a.len() as u32).to_le_bytes());
        v.extend_from_slice(a);
        v.push(match self.verdict {
            Verdict::Unknown => 0,
            Verdict::CanPull => 1,
            Verdict::Refused => 2,
        });
        v.push(u8::from(self.cuda));
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<UcxOffer, WireError> {
        let bad = WireError::InvalidField("ucx offer");
        let (n, rest) = b.split_first_chunk::<4>().ok_or(bad.clone())?;
        let n = u32::from_le_bytes(*n) as usize;
        if n > MAX_ADDRESS || rest.len() != n + 2 {
            return Err(bad);
        }
        Ok(UcxOffer {
            address: rest[..n].to_vec(),
            verdict: match rest[n] {
                0 => Verdict::Unknown,
                1 => Verdict::CanPull,
                2 => Verdict::Refused,
                _ => return Err(WireError::InvalidField("verdict")),
            },
            cuda: match rest[n + 1] {
                0 => false,
                1 => true,
                _ => return Err(WireError::InvalidField("rdma cuda memory")),
            },
        })
    }
}

/// One side's exchange (see the module documentation).
pub(crate) struct UcxExchange {
    active: bool,
    worker: Option<Arc<Worker>>,
    emulated: bool,
    /// Whether this side's UCX moves CUDA memory.
    cuda: bool,
    /// The endpoint to the peer's worker, once reached.
    ep: Option<Endpoint>,
    /// Both sides' UCX moves CUDA memory, and this side reached the peer.
    device: bool,
}

impl UcxExchange {
    fn new(active: bool, ctx: &OfferCtx) -> Self {
        UcxExchange {
            active,
            worker: ctx.ucx.clone(),
            emulated: ctx.ucx_emulated_rma,
            cuda: ucx::moves_cuda(),
            ep: None,
            device: false,
        }
    }

    /// Reaches the peer's worker at `address`, if UCX runs here and gets
    /// would not be emulated (unless the connector allows it).
    fn reach(&self, address: &[u8]) -> Option<Endpoint> {
        match self.worker.as_ref()?.connect(address) {
            Ok(ep) if self.emulated || ep.has_rma_lane() => Some(ep),
            Ok(_) => {
                tracing::debug!(
                    "UCX: no RMA transport to the peer (gets would be emulated): declined"
                );
                None
            }
            Err(e) => {
                tracing::debug!("UCX: cannot reach the peer's worker: {e}");
                None
            }
        }
    }

    fn proof(&self, peer_pulls: bool) -> LaneProof {
        LaneProof {
            can_pull: self.ep.is_some(),
            peer_pulls,
            device: self.device,
            release_leases: true,
        }
    }
}

impl LaneOffers for UcxExchange {
    fn open(ctx: &OfferCtx) -> Option<(Self, Vec<u8>)> {
        let e = UcxExchange::new(true, ctx);
        let offer = UcxOffer {
            address: e.worker.as_ref()?.address().to_vec(),
            verdict: Verdict::Unknown,
            cuda: e.cuda,
        };
        Some((e, offer.encode()))
    }

    fn answering(ctx: &OfferCtx) -> Self {
        UcxExchange::new(false, ctx)
    }

    async fn accept(&mut self, round: u8, bytes: &[u8]) -> Result<LaneAnswer, WireError> {
        let theirs = UcxOffer::decode(bytes)?;
        let out_of_turn = WireError::InvalidField("ucx offer");
        match (self.active, round) {
            // The passive side's answer: reach its worker, say so.
            (true, _) => {
                let reached = theirs.verdict == Verdict::CanPull && !theirs.address.is_empty();
                self.ep = if reached {
                    self.reach(&theirs.address)
                } else {
                    None
                };
                self.device = self.cuda && theirs.cuda && reached;
                let verdict = UcxOffer {
                    address: Vec::new(),
                    cuda: self.cuda,
                    verdict: if self.ep.is_some() {
                        Verdict::CanPull
                    } else {
                        Verdict::Refused
                    },
                };
                tracing::debug!(
                    pull_from_peer = self.ep.is_some(),
                    peer_pulls = reached,
                    cuda_memory = self.device,
                    "UCX set up"
                );
                Ok(LaneAnswer {
                    bytes: Some(verdict.encode()),
                    settled: Some(self.proof(reached)),
                })
            }
            // The active side's address: reach its worker, answer.
            (false, 0) => {
                if theirs.verdict != Verdict::Unknown || theirs.address.is_empty() {
                    return Err(out_of_turn);
                }
                self.ep = self.reach(&theirs.address);
                let answer = match (&self.ep, &self.worker) {
                    (Some(_), Some(w)) => {
                        self.device = self.cuda && theirs.cuda;
                        UcxOffer {
                            address: w.address().to_vec(),
                            verdict: Verdict::CanPull,
                            cuda: self.cuda,
                        }
                    }
                    _ => UcxOffer {
                        address: Vec::new(),
                        verdict: Verdict::Refused,
                        cuda: false,
                    },
                };
                Ok(LaneAnswer {
                    bytes: Some(answer.encode()),
                    settled: None,
                })
            }
            // The active side's verdict.
            (false, _) => {
                if theirs.verdict == Verdict::Unknown || !theirs.address.is_empty() {
                    return Err(out_of_turn);
                }
                let peer_pulls = self.ep.is_some() && theirs.verdict == Verdict::CanPull;
                Ok(LaneAnswer {
                    bytes: None,
                    settled: Some(self.proof(peer_pulls)),
                })
            }
        }
    }

    fn keep(self, kept: Kept<'_>) {
        if let Some(ep) = self.ep {
            let _ = kept.peers.ucx.set(Arc::new(ep));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_is_bounded_and_its_flags_are_yes_or_no() {
        let o = UcxOffer {
            address: vec![1, 2],
            verdict: Verdict::CanPull,
            cuda: true,
        };
        let mut v = o.encode();
        assert_eq!(UcxOffer::decode(&v), Ok(o));
        let last = v.len() - 1;
        v[last] = 7;
        assert_eq!(
            UcxOffer::decode(&v),
            Err(WireError::InvalidField("rdma cuda memory"))
        );
        assert_eq!(
            UcxOffer::decode(&v[..3]),
            Err(WireError::InvalidField("ucx offer"))
        );
        let mut long = (MAX_ADDRESS as u32 + 1).to_le_bytes().to_vec();
        long.resize(MAX_ADDRESS + 7, 0);
        assert_eq!(
            UcxOffer::decode(&long),
            Err(WireError::InvalidField("ucx offer"))
        );
    }
}
