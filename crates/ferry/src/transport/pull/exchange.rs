//! The registry of the lanes that set themselves up by offers: which
//! lanes, in which order ([`OFFERED`]), and the one `match` that turns a
//! lane's id into its exchange ([`Exchange`]; see `offer.rs`).

use ferry_proto::lane::LaneId;
use ferry_proto::session::LaneAnswer;
use ferry_proto::wire::WireError;

use super::cma::offer::CmaExchange;
use super::offer::{Kept, LaneOffers, OfferCtx};
use super::procmem::offer::ProcMemExchange;
use super::ucx::offer::UcxExchange;

/// The lanes that set themselves up by offers, in the order the active
/// side tries them (ids ascending: the session refuses another order).
pub(crate) const OFFERED: [LaneId; 3] = [LaneId::CMA, LaneId::UCX, LaneId::PROCMEM];

/// One lane's exchange on one connection, for one side.
pub(crate) enum Exchange {
    Cma(CmaExchange),
    Ucx(UcxExchange),
    ProcMem(ProcMemExchange),
}

impl Exchange {
    /// The active side opens lane `id`: the exchange and its first offer.
    pub(crate) fn open(id: LaneId, ctx: &OfferCtx) -> Option<(Exchange, Vec<u8>)> {
        match id {
            LaneId::CMA => CmaExchange::open(ctx).map(|(e, b)| (Exchange::Cma(e), b)),
            LaneId::UCX => UcxExchange::open(ctx).map(|(e, b)| (Exchange::Ucx(e), b)),
            LaneId::PROCMEM => ProcMemExchange::open(ctx).map(|(e, b)| (Exchange::ProcMem(e), b)),
            _ => None,
        }
    }

    /// The passive side's exchange for the peer's first offer of lane
    /// `id` (one of [`OFFERED`]: the session refused any other).
    pub(crate) fn answering(id: LaneId, ctx: &OfferCtx) -> Option<Exchange> {
        match id {
            LaneId::CMA => Some(Exchange::Cma(CmaExchange::answering(ctx))),
            LaneId::UCX => Some(Exchange::Ucx(UcxExchange::answering(ctx))),
            LaneId::PROCMEM => Some(Exchange::ProcMem(ProcMemExchange::answering(ctx))),
            _ => None,
        }
    }

    /// See [`LaneOffers::accept`].
    pub(crate) async fn accept(
        &mut self,
        round: u8,
        bytes: &[u8],
    ) -> Result<LaneAnswer, WireError> {
        match self {
            Exchange::Cma(e) => e.accept(round, bytes).await,
            Exchange::Ucx(e) => e.accept(round, bytes).await,
            Exchange::ProcMem(e) => e.accept(round, bytes).await,
        }
    }

    /// See [`LaneOffers::keep`].
    pub(crate) fn keep(self, kept: Kept<'_>) {
        match self {
            Exchange::Cma(e) => e.keep(kept),
            Exchange::Ucx(e) => e.keep(kept),
            Exchange::ProcMem(e) => e.keep(kept),
        }
    }
}
