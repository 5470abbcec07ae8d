//! How lanes set themselves up on a connection: each lane's code encodes
//! and checks its own offers ([`LaneOffers`]); the session
//! (`ferry_proto::session`, with its `LaneOffer` frames) keeps whose turn
//! it is and what each lane proved; the TCP driver only carries the
//! frames between the two (`super::exchange::Exchange`).
//!
//! The active side opens the lanes of
//! [`OFFERED`](super::exchange::OFFERED) one at a time, in that order,
//! until one proves that a side can copy from the other; the passive side
//! answers each offer with the same lane's code.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ferry_proto::session::LaneAnswer;
use ferry_proto::wire::WireError;

use super::lanes::Peers;
use crate::transport::ucx::Worker;

/// What the lanes' exchanges need of the connector and the connection.
#[derive(Clone, Default)]
pub(crate) struct OfferCtx {
    /// Cross-memory attach is enabled here.
    pub(crate) cma: bool,
    /// The peer runs on this host, as its metadata says (active side).
    pub(crate) same_host: bool,
    /// `(active, passive)` socket addresses of the connection.
    pub(crate) tuple: Option<(SocketAddr, SocketAddr)>,
    /// This connector's UCX worker, where UCX is enabled, loaded and
    /// trusted on this connection.
    pub(crate) ucx: Option<Arc<Worker>>,
    /// UCX may carry operations over endpoints without an RMA lane.
    pub(crate) ucx_emulated_rma: bool,
}

/// What one connection keeps of the lanes' exchanges once they settle.
pub(crate) struct Kept<'a> {
    /// What the connection holds of its peer for the lanes.
    pub(crate) peers: &'a Peers,
    /// This side's cookie and proof bytes (`cma::placed`), kept at a fixed
    /// address for the peer to read while the connection lives.
    pub(crate) cookie: &'a Mutex<Option<Box<[u8; 32]>>>,
}

/// A lane's side of its set-up on one connection: it encodes its own
/// offers and checks the peer's (the session never reads them).
pub(crate) trait LaneOffers: Sized + Send {
    /// The active side: this lane's exchange and its first offer (round
    /// 0), or `None` where it is not tried on this connection.
    fn open(ctx: &OfferCtx) -> Option<(Self, Vec<u8>)>;
    /// The passive side, on the peer's first offer.
    fn answering(ctx: &OfferCtx) -> Self;
    /// The peer's offer of `round`: this side's answer (the next round's
    /// bytes, and what the exchange proved where it ends here). An offer
    /// that is not this lane's is a typed wire error: the connection
    /// closes.
    fn accept(
        &mut self,
        round: u8,
        bytes: &[u8],
    ) -> impl std::future::Future<Output = Result<LaneAnswer, WireError>> + Send;
    /// What the exchange proved, kept with the connection (once it
    /// settled; the driver notes which lane proved a way:
    /// `Peers::set_proved`).
    fn keep(self, kept: Kept<'_>);
}
