//! The ways a peer can break the request protocol, each one typed.

use crate::cursor::CursorError;
use crate::wire::AbortReason;

/// A frame the protocol does not allow where it arrived. The connection is
/// closed afterwards, and every operation on it ends as ERRORED with the
/// violation as its cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// A `Hello` after the handshake.
    #[error("unexpected hello")]
    UnexpectedHello,
    /// An `Auth` after the handshake, on a connection that authenticated.
    #[error("unexpected authentication frame")]
    UnexpectedAuth,
    /// An `Auth` sent to a worker that has no shared secret.
    #[error("this worker has no shared secret configured")]
    AuthWithoutSecret,
    /// A `LaneOffer` for a lane this side does not set up by offers.
    #[error("an offer for lane {lane}, which this worker does not know")]
    UnknownLane {
        /// The lane's id.
        lane: u8,
    },
    /// A `LaneOffer` out of turn: a round this side did not wait for, a
    /// lane the active side did not open, a second lane while one is
    /// being set up, a lane out of the order of ids, or any lane after one
    /// proved a side can copy from the other.
    #[error("an offer for lane {lane} out of turn (round {round})")]
    LaneOutOfTurn {
        /// The lane's id.
        lane: u8,
        /// The round the frame said.
        round: u8,
    },
    /// A `GrantRequest` sent to the side that opened the connection
    /// (grants are served by the side that accepted it).
    #[error("grant request sent to the active side")]
    GrantRequestToActiveSide,
    /// A `GrantReply` sent to the side that accepted the connection.
    #[error("grant reply sent to the passive side")]
    GrantReplyToPassiveSide,
    /// An `OfferClaim` sent to the side that opened the connection
    /// (offers are served by the side that accepted it).
    #[error("offer claim sent to the active side")]
    OfferClaimToActiveSide,
    /// An `OfferReply` sent to the side that accepted the connection.
    #[error("offer reply sent to the passive side")]
    OfferReplyToPassiveSide,
    /// An `Open` sent to the side that opened the connection.
    #[error("open sent to the active side")]
    OpenToActiveSide,
    /// An `Open` whose request number is still in use on the connection.
    #[error("request number {0} in use")]
    RequestNumberInUse(u64),
    /// `Data` for a request whose bytes this side sends, or that moves by
    /// lending memory.
    #[error("data sent for request {req}, which receives no data frames")]
    UnexpectedData {
        /// The request.
        req: u64,
    },
    /// `Data` that does not continue the transfer where it stands (a gap,
    /// an overlap, bytes outside the request's part).
    #[error(transparent)]
    DataOutOfOrder(#[from] CursorError),
    /// A `Finish` before every byte of the request (or of every part of a
    /// striped transfer) arrived; or a confirmation before this side sent
    /// its own `Finish`.
    #[error("finish before all data of request {req}")]
    FinishBeforeAllData {
        /// The request.
        req: u64,
    },
    /// A part's `Finish` before every byte of the part arrived.
    #[error("finish before all data of part {part}")]
    PartFinishedEarly {
        /// The part.
        part: u16,
    },
    /// A part confirmed before this side sent the whole part.
    #[error("part {part} confirmed before this side sent all of it")]
    PartConfirmedBeforeSent {
        /// The part.
        part: u16,
    },
    /// A `Finish` for a leased transfer before the copy ended here.
    #[error("finish before the copy of request {req} ended")]
    FinishBeforeCopyEnded {
        /// The request.
        req: u64,
    },
    /// A `Finish` for a pulled WRITE before its `Lease`.
    #[error("finish before the lease of request {req}")]
    FinishBeforeLease {
        /// The request.
        req: u64,
    },
    /// A `Lease` sent to a worker that did not agree to attach.
    #[error("a lease to a worker that did not agree to attach")]
    LeaseWithoutAttach,
    /// A `Lease` this side did not ask for.
    #[error("a lease this worker did not ask for (request {req})")]
    UnaskedLease {
        /// The request.
        req: u64,
    },
    /// `Data` for a request whose memory here is device memory that this
    /// side cannot stage: it moves only by lending (see
    /// [`AbortReason::DeviceMemory`]), never in band.
    #[error("data sent for request {req}, whose memory is device memory that this side cannot stage (it moves only by lending: CUDA IPC, or UCX that moves CUDA memory)")]
    DataForDeviceMemory {
        /// The request.
        req: u64,
    },
    /// A `Lease` whose segments do not match the descriptors one for one.
    #[error("the lease of request {req} does not match the descriptors")]
    LeaseShapeMismatch {
        /// The request.
        req: u64,
    },
    /// A `Finish` without the `Digest` that must precede it: this side's
    /// integrity check is on, and the peer's is off (or it skipped it).
    #[error("finish of request {req} without a digest (the integrity check is on here: is it on at the peer?)")]
    MissingDigest {
        /// The request.
        req: u64,
    },
    /// A `Digest` where none may come: for a request whose first `Finish`
    /// this side sends, or a second one.
    #[error("a digest this side does not compare (request {req})")]
    UnexpectedDigest {
        /// The request.
        req: u64,
    },
}

impl Violation {
    /// The reason that describes the violation on the wire: the one place
    /// where violations meet abort reasons. The peer is told (an `Abort`
    /// of request 0) only of the authentication violations; for the others
    /// the connection simply closes.
    pub fn abort_reason(&self) -> AbortReason {
        match self {
            Violation::UnexpectedAuth | Violation::AuthWithoutSecret => {
                AbortReason::Unauthenticated
            }
            Violation::UnexpectedHello
            | Violation::UnknownLane { .. }
            | Violation::LaneOutOfTurn { .. }
            | Violation::OpenToActiveSide
            | Violation::GrantRequestToActiveSide
            | Violation::GrantReplyToPassiveSide
            | Violation::OfferClaimToActiveSide
            | Violation::OfferReplyToPassiveSide
            | Violation::RequestNumberInUse(_)
            | Violation::UnexpectedData { .. }
            | Violation::DataForDeviceMemory { .. }
            | Violation::DataOutOfOrder(_)
            | Violation::FinishBeforeAllData { .. }
            | Violation::PartFinishedEarly { .. }
            | Violation::PartConfirmedBeforeSent { .. }
            | Violation::FinishBeforeCopyEnded { .. }
            | Violation::FinishBeforeLease { .. }
            | Violation::LeaseWithoutAttach
            | Violation::UnaskedLease { .. }
            | Violation::LeaseShapeMismatch { .. }
            | Violation::MissingDigest { .. }
            | Violation::UnexpectedDigest { .. } => AbortReason::Protocol,
        }
    }

    /// Whether the peer is told before the connection closes.
    pub fn is_told(&self) -> bool {
        self.abort_reason() == AbortReason::Unauthenticated
    }
}
