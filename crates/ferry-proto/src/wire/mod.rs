//! Frames spoken between two connectors over a byte stream.
//!
//! Every frame starts with an 8-byte header: the frame type (1 byte), three
//! zero bytes, and the body length (u32, little endian). The body follows. A
//! `Data` frame's body is followed by `len` payload bytes, which are not part
//! of the body: the receiver moves them straight into the destination memory.
//!
//! A conversation: the active side connects and both sides send [`Hello`].
//! The active side then sends [`Open`] for each operation. For a READ, the
//! passive side answers with `Data` frames, then `Finish`; the active side
//! confirms with `Finish`. For a WRITE, the active side sends `Data` frames
//! and `Finish`; the passive side confirms with `Finish`. Either side may send
//! `Abort` at any time; `Data` for an aborted request is skipped.
//!
//! A standing grant held over TCP needs no operation: the active side
//! (the grant's holder) sends a [`GrantRequest`], the passive side (the
//! grant's owner) checks and serves it and answers with one
//! [`GrantReply`] (protocol 15; see [`grant::serve`](crate::grant::serve)).
//! A worker that has an offer's metadata claims a grant of its own with an
//! [`OfferClaim`], answered by one [`OfferReply`] (protocol 16; see
//! [`grant::claim`](crate::grant::claim)).
//!
//! With a shared secret, the two `Hello`s are followed by two [`Auth`]
//! frames carrying a Noise handshake (active side first). From then on every
//! byte of the connection, in both directions, travels inside Noise
//! transport messages, each a 2-byte big-endian length (at most 65,535)
//! followed by that many bytes of ciphertext; the frames above are the
//! plaintext stream they carry, cut at arbitrary points.
//!
//! Decoding never panics, and what it allocates and the steps it takes
//! follow the bytes received, at most a small constant times them: a
//! header is checked against its type's largest body before a byte of the
//! body is read, and lists sent as runs stay runs ([`Runs`], [`Segments`])
//! until they are checked against a grant this side holds; only then are
//! they expanded, at that grant's size. A receiver that accepts only some
//! frame types at a point of the conversation ([`Expect`]) refuses any
//! other from its header, before its body is read.

pub use crate::lane::LaneId;
use crate::runs::{Runs, MAX_RUNS};
use crate::{OperationKind, Token, MAX_DESCRIPTORS};

mod decode;
mod encode;
mod expect;
mod grant;
mod offer;
mod segments;

pub use decode::{decode_body, decode_frame, decode_header, Header};
pub use expect::{Expect, FrameType};
pub use grant::{GrantAnswer, GrantReply, GrantRequest};
pub use offer::{OfferAnswer, OfferClaim, OfferReply};
pub use segments::Segments;

/// The protocol version carried in `Hello`. 7: a [`Data`] frame may run
/// on past the end of its descriptor into the ones that follow. 8: a
/// [`Lease`] may send its addresses as runs of segments that follow each
/// other. 9: an `Attach` says whether its sender offers CUDA IPC. 10:
/// an `Rdma` frame says whether its sender's UCX reaches CUDA memory.
/// 11: a [`Lease`] names the lane that lent it.
/// 12: heartbeats ([`Message::Ping`], [`Message::Pong`]) on a connection
/// that carries an operation in progress, and the abort reasons
/// [`AbortReason::PeerUnresponsive`] and [`AbortReason::Expired`].
/// 13: a [`Digest`] frame (type 14) may precede a `Finish` (opt-in
/// end-to-end integrity), and `Abort` has reason 17, `DigestMismatch`.
/// 14: a lane sets itself up with [`LaneOffer`] frames (type 11),
/// replacing `Attach` (8) and `Rdma` (10).
/// 15: standing grants served over TCP: [`GrantRequest`] (type 15) and
/// [`GrantReply`] (type 16).
/// 16: offers: a worker claims a grant of its own with [`OfferClaim`]
/// (type 17), answered by [`OfferReply`] (type 18).
pub const PROTOCOL_VERSION: u16 = 16;
/// The bytes that open every `Hello` body.
pub const MAGIC: [u8; 6] = *b"FERRY\0";
/// The length of a frame header.
pub const HEADER_LEN: usize = 8;
/// The largest body of any frame but a [`Lease`] and the grant frames
/// ([`GrantRequest`], [`GrantReply`]: a megabyte of bytes, at most).
pub const MAX_BODY: u32 = 256 * 1024;
/// The largest body of a [`Lease`]: eight bytes for each of up to
/// [`MAX_LEASE_SEGMENTS`] addresses, their lengths as up to
/// [`MAX_RUNS`] runs, a key of up to [`MAX_LEASE_KEY`] bytes, and the
/// fixed fields.
pub const MAX_LEASE_BODY: u32 =
    (MAX_LEASE_SEGMENTS * 8 + MAX_RUNS * 12 + MAX_LEASE_KEY + 21) as u32;
/// The longest backend key a [`Lease`] carries (UCX: packed remote keys).
pub const MAX_LEASE_KEY: usize = 1024 * 1024;
/// The longest offer a [`LaneOffer`] frame carries (a UCX worker address
/// and a few bytes more).
pub const MAX_LANE_OFFER: usize = 64 * 1024 + 64;

/// The largest body of an [`Open`]: its fixed fields and [`MAX_RUNS`] runs.
const MAX_OPEN_BODY: u32 = (OPEN_FIXED + 4 + MAX_RUNS * 12) as u32;
/// The fixed fields of an `Open`, before its runs.
const OPEN_FIXED: usize = 8 + 8 + 16 + 1 + 1 + 2 + 2;

/// The largest body a frame of type `ty` may have: the largest valid one,
/// so that a header that announces more is refused before its body is read.
fn max_body(ty: u8) -> u32 {
    match ty {
        T_HELLO => MAX_HELLO_BODY,
        T_OPEN => MAX_OPEN_BODY,
        T_DATA => 8 + 4 + 8 + 4,
        T_FINISH | T_RELEASE => 8,
        T_ABORT => (8 + 1 + 2 + MAX_DETAIL) as u32,
        T_AUTH => (2 + MAX_HANDSHAKE) as u32,
        T_LEASE => MAX_LEASE_BODY,
        T_PING | T_PONG => 0,
        T_DIGEST => DIGEST_BODY,
        T_LANE_OFFER => (1 + 1 + 4 + MAX_LANE_OFFER) as u32,
        grant::T_GRANT_REQUEST => grant::MAX_REQUEST_BODY,
        grant::T_GRANT_REPLY => grant::MAX_REPLY_BODY,
        offer::T_OFFER_CLAIM => offer::CLAIM_BODY,
        offer::T_OFFER_REPLY => offer::MAX_OFFER_REPLY_BODY,
        _ => 0,
    }
}
/// The largest payload of one `Data` frame.
pub const MAX_CHUNK: u32 = 16 * 1024 * 1024;
/// The longest detail text of an `Abort`.
pub const MAX_DETAIL: usize = 1024;
const MAX_WORKER_ID: usize = 256;
/// The largest body of a valid [`Hello`] (one with the longest worker id):
/// a receiver may refuse a larger first frame before buffering any of it.
pub const MAX_HELLO_BODY: u32 = (MAGIC.len() + 2 + 2 + MAX_WORKER_ID) as u32;
/// The longest handshake message an [`Auth`] frame may carry.
pub const MAX_HANDSHAKE: usize = 1024;

/// Why a stream cannot be decoded. The connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Unknown frame type.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// Reserved header bytes are not zero.
    #[error("reserved header bytes are not zero")]
    Reserved,
    /// The body length is beyond the largest valid body of the frame's
    /// type (at most [`MAX_BODY`]; a `Lease`: [`MAX_LEASE_BODY`]).
    #[error("frame body of {0} bytes is larger than any valid frame of its type")]
    BodyTooLarge(u32),
    /// The body is shorter than its fields.
    #[error("frame body is truncated")]
    Truncated,
    /// The body has bytes after its last field.
    #[error("frame body has {0} trailing bytes")]
    Trailing(usize),
    /// The `Hello` does not start with the magic bytes.
    #[error("the peer does not speak the Ferry protocol")]
    BadMagic,
    /// A field has a value outside its range.
    #[error("invalid field {0}")]
    InvalidField(&'static str),
    /// A frame of a type that is not valid at this point of the
    /// conversation, refused from its header (see [`Expect`]).
    #[error("a {0} frame is not valid at this point of the conversation")]
    Unexpected(FrameType),
}

/// Why an operation was aborted, as carried on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AbortReason {
    /// The sender cancelled (or dropped) its side of the operation.
    Cancelled,
    /// No operation that the presented token grants: never exposed, ended
    /// (to anyone without its token), or exposed under another token. The
    /// one refusal of every request without a valid token, so that it
    /// tells nothing.
    UnknownOperation,
    /// The operation existed but has ended (completed, cancelled or dropped).
    OperationEnded,
    /// The token does not grant access to the operation. No longer sent
    /// (a wrong token is refused as [`UnknownOperation`](Self::UnknownOperation));
    /// its code stays reserved.
    BadToken,
    /// The operation is of the other kind (READ against a writable or the reverse).
    WrongKind,
    /// Descriptor count differs.
    CountMismatch,
    /// A descriptor size differs.
    SizeMismatch,
    /// Another remote is already transferring this operation.
    Busy,
    /// The peer broke the protocol.
    Protocol,
    /// The sender is shutting down.
    ShuttingDown,
    /// The peers do not share the same secret (or one has none).
    Unauthenticated,
    /// Another part of a striped transfer failed (its connection was lost,
    /// say); the detail says how.
    PartFailed,
    /// The memory of the operation is device (GPU) memory, and the request
    /// would move it in band (`Data` frames, striped or not): device memory
    /// moves only by lending (CUDA IPC, between processes of one host), and
    /// this request asked for no lease, or this connection cannot lend. The
    /// detail says which. A build that does not know it reads it as
    /// `Other(13)`, so it needs no new protocol version.
    DeviceMemory,
    /// The remote would copy the memory lent for this request by
    /// cross-memory attach (or RDMA), and has no copy slot free for it now:
    /// the peer's share, or the process's, is in use (copies that a peer
    /// may be stalling). Refused at once, never queued; the detail says
    /// which bound. A build that does not know it reads it as `Other(14)`.
    CopySlots,
    /// The sender heard nothing at all from the receiver (no frame, not
    /// even a heartbeat) for its liveness bound while this request was in
    /// progress: it takes the receiver for stopped or unreachable, ends
    /// every operation of the connection and closes it. The detail gives
    /// the bound.
    PeerUnresponsive,
    /// The passive operation's expiry lapsed (its owner created it with
    /// one): its memory was fenced and given back to its owner, and no
    /// request may transfer it any more.
    Expired,
    /// The digest of the bytes that landed differs from the digest the
    /// source computed over the bytes it sent or lent (see [`Digest`]):
    /// the destination's memory does not hold what was sent. The detail
    /// gives both digests. A build that does not know it reads it as
    /// `Other(17)`.
    DigestMismatch,
    /// A reason this build does not know.
    Other(u8),
}

impl AbortReason {
    /// The wire number.
    pub fn code(self) -> u8 {
        match self {
            Self::Cancelled => 1,
            Self::UnknownOperation => 2,
            Self::OperationEnded => 3,
            Self::BadToken => 4,
            Self::WrongKind => 5,
            Self::CountMismatch => 6,
            Self::SizeMismatch => 7,
            Self::Busy => 8,
            Self::Protocol => 9,
            Self::ShuttingDown => 10,
            Self::Unauthenticated => 11,
            Self::PartFailed => 12,
            Self::DeviceMemory => 13,
            Self::CopySlots => 14,
            Self::PeerUnresponsive => 15,
            Self::Expired => 16,
            Self::DigestMismatch => 17,
            Self::Other(n) => n,
        }
    }

    /// The reason with wire number `n`.
    pub fn from_code(n: u8) -> Self {
        match n {
            1 => Self::Cancelled,
            2 => Self::UnknownOperation,
            3 => Self::OperationEnded,
            4 => Self::BadToken,
            5 => Self::WrongKind,
            6 => Self::CountMismatch,
            7 => Self::SizeMismatch,
            8 => Self::Busy,
            9 => Self::Protocol,
            10 => Self::ShuttingDown,
            11 => Self::Unauthenticated,
            12 => Self::PartFailed,
            13 => Self::DeviceMemory,
            14 => Self::CopySlots,
            15 => Self::PeerUnresponsive,
            16 => Self::Expired,
            17 => Self::DigestMismatch,
            n => Self::Other(n),
        }
    }
}

/// First frame in each direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub version: u16,
    /// The sender's worker id.
    pub worker_id: String,
}

/// The active side asks to start an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    /// The active side's number for this request, unique on the connection.
    pub req: u64,
    /// The passive operation, from its metadata.
    pub op_id: u64,
    /// The capability, from the metadata.
    pub token: Token,
    /// READ or WRITE.
    pub kind: OperationKind,
    /// The active side's descriptor (block) sizes; must equal the exposed
    /// ones. On the wire: runs of equal sizes (see [`crate::runs`]), at
    /// most [`MAX_RUNS`] runs and [`MAX_DESCRIPTORS`] sizes in all. Kept
    /// as runs until they are checked against the grant
    /// ([`Runs::first_difference`]).
    pub sizes: Runs,
    /// The bytes should move by cross-memory attach: for a READ the active
    /// side asks for a [`Lease`] instead of `Data`; for a WRITE a `Lease`
    /// follows this frame. The passive side may still answer a READ with
    /// `Data` (the fallback).
    pub pull: bool,
    /// Which part of a striped transfer this request carries (see
    /// [`part_range`]); 0 when not striped.
    pub part: u16,
    /// Into how many parts the transfer is split, each on its own
    /// connection; 1 when not striped. At most [`MAX_PARTS`]; a striped
    /// request never uses `pull`.
    pub parts: u16,
}

/// The most parts (connections) one striped transfer may use.
pub const MAX_PARTS: u16 = 16;

/// The flat byte range `[start, end)` of part `part` of `parts` of a
/// transfer of `total` bytes: contiguous, in order, covering every byte once,
/// as even as the division allows. Both sides compute it, so it never
/// travels.
///
/// ```
/// use ferry_proto::wire::part_range;
/// assert_eq!(part_range(10, 0, 3), (0, 3));
/// assert_eq!(part_range(10, 1, 3), (3, 6));
/// assert_eq!(part_range(10, 2, 3), (6, 10));
/// ```
pub fn part_range(total: u64, part: u16, parts: u16) -> (u64, u64) {
    let parts = u128::from(parts.max(1));
    let at = |i: u128| (u128::from(total) * i / parts) as u64;
    let part = u128::from(part).min(parts);
    (at(part), at((part + 1).min(parts)))
}

/// The most segments one [`Lease`] may carry: one per descriptor (block)
/// of the largest operation.
pub const MAX_LEASE_SEGMENTS: usize = MAX_DESCRIPTORS;

/// The source side of request `req` lets the destination copy its bytes by
/// cross-memory attach: segment `i` (address in the source process, length)
/// holds descriptor `i`. Only sent to a peer whose identity was verified by
/// its lane's exchange ([`LaneOffer`]); the lease ends with the
/// destination's `Finish` or `Abort`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The request.
    pub req: u64,
    /// The lane that lent the memory, and by which the destination copies
    /// it (one byte on the wire; an id the destination does not have ends
    /// the request there, not the frame).
    pub lane: LaneId,
    /// `(address, length)` per descriptor, at most [`MAX_LEASE_SEGMENTS`].
    /// On the wire: the lengths as runs (at most [`MAX_RUNS`]), then the
    /// addresses, in whichever of two forms is shorter: one `u64` per
    /// segment (form 0), or runs of segments that each start where the one
    /// before ends, as a count (u32) and `(first address u64, segments
    /// u32)` per run (form 1; blocks of a pool that follow each other in
    /// memory: 262,144 blocks in 4,096 runs are 48 KiB instead of 2 MiB).
    /// Kept in that form ([`Segments`]) until the lease is checked against
    /// the request it answers.
    pub segments: Segments,
    /// What the lending backend needs besides addresses, at most
    /// [`MAX_LEASE_KEY`] bytes: empty for cross-memory attach, the remote
    /// keys of the lent memory for RDMA.
    pub key: Vec<u8>,
}

/// One step of a lane's set-up on a connection, right after the handshake
/// (see [`lane`](crate::lane)): the active side sends round 0, the passive
/// side answers with round 1, and so on, alternately, until the lane's
/// exchange ends. What `bytes` say is the lane's own business (cross-memory
/// attach: a pid, a nonce and where a cookie lies; UCX: a worker address):
/// the core checks whose turn it is ([`Session`](crate::session::Session)),
/// never what a lane offers, so a new lane adds no frame type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneOffer {
    /// The lane being set up (one byte).
    pub lane: LaneId,
    /// Its step: even from the active side, odd from the passive side.
    pub round: u8,
    /// The lane's offer, at most [`MAX_LANE_OFFER`] bytes.
    pub bytes: Vec<u8>,
}

/// Header of a run of payload bytes starting in descriptor `desc` at
/// `offset`: the descriptors' bytes taken as one flat sequence, in order,
/// the run may go on past the end of `desc` into the descriptors that
/// follow (many small blocks in one frame). It must start exactly where
/// the transfer stands and end at most where it ends (see
/// [`Cursor`](crate::Cursor)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Data {
    /// The request.
    pub req: u64,
    /// Descriptor index.
    pub desc: u32,
    /// Byte offset within that descriptor.
    pub offset: u64,
    /// Payload length that follows the frame (at most [`MAX_CHUNK`]).
    pub len: u32,
}

/// Ends a request, or the other side's part of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abort {
    /// The request.
    pub req: u64,
    /// Why.
    pub reason: AbortReason,
    /// Human-readable detail (at most [`MAX_DETAIL`] bytes).
    pub detail: String,
}

/// One message of the Noise handshake that authenticates a connection with
/// a shared secret, right after the `Hello`s: the active side sends the
/// first, the passive side answers with the second; every later byte is
/// encrypted (see the module documentation and `docs/security.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    /// The handshake message, at most [`MAX_HANDSHAKE`] bytes.
    pub handshake: Vec<u8>,
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// See [`Hello`].
    Hello(Hello),
    /// See [`Open`].
    Open(Open),
    /// See [`Data`]; its payload follows on the stream.
    Data(Data),
    /// All bytes of the sender's part of request `req` are sent (or received, as a confirmation).
    Finish {
        /// The request.
        req: u64,
    },
    /// See [`Abort`].
    Abort(Abort),
    /// See [`Auth`].
    Auth(Auth),
    /// See [`Lease`].
    Lease(Lease),
    /// See [`Digest`].
    Digest(Digest),
    /// See [`LaneOffer`].
    LaneOffer(LaneOffer),
    /// The destination of request `req` no longer copies from the source's
    /// lent memory (it stopped after the source's `Abort`, or the request
    /// had ended here). Ends the lease only, never an operation.
    Release {
        /// The request.
        req: u64,
    },
    /// A heartbeat (empty body): sent by a side that has an operation in
    /// progress on the connection and has sent nothing for a while. The
    /// receiver answers with [`Message::Pong`] at once, whatever it has
    /// in progress itself (see `session::liveness`).
    Ping,
    /// The answer to a [`Message::Ping`] (empty body). Like any frame, it
    /// tells the receiver that the sender is alive; it asks for nothing.
    Pong,
    /// See [`GrantRequest`] (protocol 15).
    GrantRequest(GrantRequest),
    /// See [`GrantReply`] (protocol 15).
    GrantReply(GrantReply),
    /// See [`OfferClaim`] (protocol 16).
    OfferClaim(OfferClaim),
    /// See [`OfferReply`] (protocol 16).
    OfferReply(OfferReply),
}

const T_HELLO: u8 = 1;
const T_OPEN: u8 = 2;
const T_DATA: u8 = 3;
const T_FINISH: u8 = 4;
const T_ABORT: u8 = 5;
const T_AUTH: u8 = 6;
const T_LEASE: u8 = 7;
// 8 and 10 were `Attach` and `Rdma` (protocol 11 and before).
const T_RELEASE: u8 = 9;
const T_LANE_OFFER: u8 = 11;
const T_PING: u8 = 12;
const T_PONG: u8 = 13;
const T_DIGEST: u8 = 14;

/// The body of a [`Digest`]: the request, the algorithm, the value.
const DIGEST_BODY: u32 = 8 + 1 + 4;
/// [`Digest::crc32`] absent: the sender could not read the bytes.
const DIGEST_NONE: u8 = 0;
/// [`Digest::crc32`] present: CRC-32 (IEEE).
const DIGEST_CRC32: u8 = 1;

/// The digest of every byte of request `req` as its sender saw them: sent
/// right before the sender's first `Finish` of the request (not a
/// confirmation) by a sender whose integrity check is on. An in-band
/// source digests what it sent (its part's range, striped); a destination
/// that copied from lent memory digests what landed. The receiver
/// compares it with its own digest of the same bytes (what landed; what
/// it lent) before the request completes: a difference ends the request
/// on both sides with [`AbortReason::DigestMismatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    /// The request.
    pub req: u64,
    /// CRC-32 (IEEE) of the bytes, in descriptor order; `None` where the
    /// sender could not read them (device memory that the CPU never
    /// touches): the request is then not checked.
    pub crc32: Option<u32>,
}

/// Lease address forms (see [`Lease::segments`]).
const ADDRESSES_EACH: u8 = 0;
const ADDRESSES_RUNS: u8 = 1;

#[cfg(test)]
mod tests;
