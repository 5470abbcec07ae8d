//! What a [`Session`](super::Session) tells its driver: the answer to a
//! frame ([`Step`]), the work it queues ([`Action`]), and how an active
//! request begins ([`Start`]).

use crate::lane::LaneId;
use crate::wire::{AbortReason, Message, Open};
use crate::{Cursor, OperationKind, Token};

/// How a stream of `Data` frames ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Last {
    /// With the `Finish` that seals the operation (not striped). The
    /// driver seals the operation under the region's lock as the first
    /// byte of that frame enters the socket.
    Seal,
    /// With a plain `Finish`, which the destination confirms: a part other
    /// than 0. Once it is written, the driver calls
    /// [`Session::part_sent`](super::Session::part_sent).
    Part,
    /// Part 0: with the sealing `Finish`, once every other part is
    /// confirmed ([`Fence::can_commit`](super::Fence::can_commit)).
    SealAfterParts,
}

/// What a frame asks of the driver right away (other work is queued as
/// [`Action`]s).
#[derive(Debug)]
pub enum Step<T> {
    /// Nothing more.
    Done,
    /// Read the `Data` frame's payload into the target's descriptor `desc`
    /// at `offset`.
    Payload {
        /// The request's handle.
        target: T,
        /// Descriptor.
        desc: u32,
        /// Offset in it.
        offset: u64,
        /// Payload length.
        len: u32,
    },
    /// Digest this side's bytes of request `req` (the flat byte `range`
    /// of the target's memory, cut to its end: what landed, or what this
    /// side lent), outside the session's lock, then call
    /// [`Session::verified`](super::Session::verified) with it (see
    /// `digest.rs`).
    Verify {
        /// The request.
        req: u64,
        /// Its handle.
        target: T,
        /// `[start, end)` of the bytes to digest.
        range: (u64, u64),
    },
    /// Read and drop the payload: its request has ended here.
    Discard {
        /// Payload length.
        len: u32,
    },
    /// Check the request's capability against the exposure table, then
    /// call [`Session::bound`](super::Session::bound).
    CheckGrant(Open),
    /// The peer's offer of round `round` in lane `lane`'s set-up: the
    /// lane's code reads it and answers through
    /// [`Session::lane_answered`](super::Session::lane_answered).
    LaneOffer {
        /// The lane.
        lane: LaneId,
        /// The peer's round.
        round: u8,
        /// What the peer's lane offers (only the lane reads it).
        bytes: Vec<u8>,
    },
    /// A holder's request on a grant this side owns (passive side only):
    /// the driver serves it with the grant's checks
    /// ([`grant::serve`](crate::grant::serve)) and sends the reply.
    ServeGrant(crate::wire::GrantRequest),
    /// The owner's reply to one of this side's grant requests (active side
    /// only): the driver hands it to whoever waits for it.
    GrantReply(crate::wire::GrantReply),
    /// A worker's claim on an offer this side owns (passive side only):
    /// the driver checks it ([`grant::claim`](crate::grant::claim)),
    /// makes the grant bound to the connection's peer, and replies.
    ServeClaim(crate::wire::OfferClaim),
    /// The owner's reply to one of this side's claims (active side only).
    OfferReply(crate::wire::OfferReply),
}

/// Work for the driver, in order.
#[derive(Debug)]
pub enum Action<T> {
    /// Send a control frame; `reply`: the peer provoked it (bounded).
    Send {
        /// The frame.
        msg: Message,
        /// A reply the peer provoked.
        reply: bool,
    },
    /// Send the bytes under `cursor` from the target's memory as `Data`
    /// frames, ending as `last` says.
    Stream {
        /// The request.
        req: u64,
        /// Its handle.
        target: T,
        /// The bytes.
        cursor: Cursor,
        /// How the stream ends.
        last: Last,
    },
    /// The operation moves by lending (`true`) or in band (`false`): for
    /// reports.
    Via {
        /// Its handle.
        target: T,
        /// Lent memory.
        lent: bool,
        /// The lane that lends it, where this side knows it (the source,
        /// or a destination whose lease named it); `None` in band, or
        /// until the lease comes.
        lane: Option<LaneId>,
    },
    /// Lend the target's memory to the peer (it stays lent until
    /// [`Action::GiveBack`](Action::GiveBack)).
    Lend {
        /// The request that lends it (the driver tells
        /// [`Session::lend_failed`](super::Session::lend_failed) if it
        /// cannot).
        req: u64,
        /// Its handle.
        target: T,
        /// The lane that lends it (the planner's answer).
        lane: LaneId,
    },
    /// Send a `Lease` of the target's memory for request `req`, by the
    /// lane that lent it.
    SendLease {
        /// The request.
        req: u64,
        /// Its handle.
        target: T,
        /// The lane that lent it ([`Action::Lend`]'s).
        lane: LaneId,
    },
    /// The peer no longer copies from the target's memory.
    GiveBack {
        /// Its handle.
        target: T,
    },
    /// Copy the lease into the target's memory, chunk by chunk through its
    /// region, seal it, then call [`Session::pull_ended`](super::Session::pull_ended).
    Pull {
        /// The request.
        req: u64,
        /// Its handle.
        target: T,
        /// The lane that lent it: the destination copies by that lane.
        lane: LaneId,
        /// The lease's segments, one per descriptor.
        segments: Vec<(u64, u64)>,
        /// The lease's backend key (empty for cross-memory attach).
        key: Vec<u8>,
    },
    /// A part other than 0 is done: count it in its stripe.
    PartDone {
        /// Its handle.
        target: T,
    },
    /// The destination has every byte (in-band destination: close the
    /// region if intact and seal, both under the region's lock, else a
    /// cancel is under way and tells the peer); or the source lent and the
    /// peer copied everything (seal under the region's lock, unless a
    /// cancel came first). Sealed, the outcome is decided: send `Finish {
    /// req }` as the confirmation, and end the operation as COMPLETE only
    /// once that frame is in the socket (ended with the connection's loss
    /// if it never gets there).
    ///
    /// This side reports COMPLETE *first*: the peer, sealed, waits for this
    /// confirmation and has no other way to learn the outcome (a close
    /// tells it nothing: the same close follows a cancel whose `Abort` was
    /// lost, or a process that died before it decided). So this side's
    /// COMPLETE must not be seen before the confirmation is beyond this
    /// process's reach: a process that exits, or drops its connector, as
    /// soon as it sees COMPLETE then still delivers it, and both sides
    /// agree whatever it does next.
    Commit {
        /// The request.
        req: u64,
        /// Its handle.
        target: T,
        /// The memory was lent (seal first) rather than received.
        lent: bool,
    },
    /// The peer confirmed an operation that is sealed here: end it as
    /// COMPLETE.
    Complete {
        /// Its handle.
        target: T,
    },
    /// The peer ended the request: end the operation with its reason.
    RemoteAbort {
        /// Its handle.
        target: T,
        /// Why.
        reason: AbortReason,
        /// The peer's detail.
        detail: String,
    },
}

/// The parameters of an active request.
#[derive(Debug, Clone)]
pub struct OpenParams {
    /// READ or WRITE.
    pub kind: OperationKind,
    /// The passive operation.
    pub op_id: u64,
    /// Its capability.
    pub token: Token,
    /// The descriptors' sizes.
    pub sizes: Vec<u64>,
    /// Move the bytes by lending (cross-memory attach).
    pub pull: bool,
    /// The lane that lends this side's memory where it is the source and
    /// `pull` (a WRITE): the planner's answer
    /// ([`Session::lane_for`](super::Session::lane_for)). A pulled WRITE
    /// without one moves in band.
    pub lane: Option<LaneId>,
    /// Which part of how many (`(0, 1)`: not striped).
    pub part: (u16, u16),
}

/// How an active request begins.
#[derive(Debug)]
pub enum Start {
    /// Send the `Open` (a READ: the bytes come back).
    Open(Message),
    /// Send the `Open` followed by a `Lease` of the memory by the lane
    /// (a pulled WRITE; the memory was lent by the queued
    /// [`Action::Lend`]).
    OpenAndLease(Message, LaneId),
    /// Send the `Open`, then stream the bytes (a WRITE in band).
    Stream {
        /// The `Open`.
        open: Message,
        /// The bytes.
        cursor: Cursor,
        /// How the stream ends.
        last: Last,
    },
}
