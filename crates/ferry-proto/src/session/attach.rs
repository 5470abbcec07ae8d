//! The passive side of the four `Attach` frames that set up cross-memory
//! attach on a connection (see [`Attach`](crate::wire::Attach)): the
//! active side's nonce, this side's offer, the active side's verdict, this
//! side's verdict. Hashing the cookies and probing the peer stay with the
//! driver; this is the order of the frames.

/// Two nonces: the active side's, then this side's.
pub type Nonces = ([u8; 16], [u8; 16]);

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
