//! Frame types, and which of them a receiver accepts at each point of the
//! handshake: a frame of another type is refused from its header.

use std::fmt;

use super::*;

/// The type of a frame, as its header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameType {
    /// [`Hello`].
    Hello,
    /// [`Open`].
    Open,
    /// [`Data`].
    Data,
    /// [`Message::Finish`].
    Finish,
    /// [`Abort`].
    Abort,
    /// [`Auth`].
    Auth,
    /// [`Lease`].
    Lease,
    /// [`Message::Release`].
    Release,
    /// [`Message::Ping`].
    Ping,
    /// [`Message::Pong`].
    Pong,
    /// [`Digest`].
    Digest,
    /// [`LaneOffer`].
    LaneOffer,
    /// [`GrantRequest`].
    GrantRequest,
    /// [`GrantReply`].
    GrantReply,
    /// [`OfferClaim`].
    OfferClaim,
    /// [`OfferReply`].
    OfferReply,
}

impl FrameType {
    /// Every frame type.
    pub const ALL: [FrameType; 16] = [
        FrameType::Hello,
        FrameType::Open,
        FrameType::Data,
        FrameType::Finish,
        FrameType::Abort,
        FrameType::Auth,
        FrameType::Lease,
        FrameType::Release,
        FrameType::Ping,
        FrameType::Pong,
        FrameType::Digest,
        FrameType::LaneOffer,
        FrameType::GrantRequest,
        FrameType::GrantReply,
        FrameType::OfferClaim,
        FrameType::OfferReply,
    ];

    /// The type with wire number `ty` (checked by [`decode_header`]).
    pub(super) fn of(ty: u8) -> Option<Self> {
        Some(match ty {
            T_HELLO => FrameType::Hello,
            T_OPEN => FrameType::Open,
            T_DATA => FrameType::Data,
            T_FINISH => FrameType::Finish,
            T_ABORT => FrameType::Abort,
            T_AUTH => FrameType::Auth,
            T_LEASE => FrameType::Lease,
            T_RELEASE => FrameType::Release,
            T_PING => FrameType::Ping,
            T_PONG => FrameType::Pong,
            T_DIGEST => FrameType::Digest,
            T_LANE_OFFER => FrameType::LaneOffer,
            super::grant::T_GRANT_REQUEST => FrameType::GrantRequest,
            super::grant::T_GRANT_REPLY => FrameType::GrantReply,
            super::offer::T_OFFER_CLAIM => FrameType::OfferClaim,
            super::offer::T_OFFER_REPLY => FrameType::OfferReply,
            _ => return None,
        })
    }

    /// The wire number.
    pub fn code(self) -> u8 {
        match self {
            FrameType::Hello => T_HELLO,
            FrameType::Open => T_OPEN,
            FrameType::Data => T_DATA,
            FrameType::Finish => T_FINISH,
            FrameType::Abort => T_ABORT,
            FrameType::Auth => T_AUTH,
            FrameType::Lease => T_LEASE,
            FrameType::Release => T_RELEASE,
            FrameType::Ping => T_PING,
            FrameType::Pong => T_PONG,
            FrameType::Digest => T_DIGEST,
            FrameType::LaneOffer => T_LANE_OFFER,
            FrameType::GrantRequest => super::grant::T_GRANT_REQUEST,
            FrameType::GrantReply => super::grant::T_GRANT_REPLY,
            FrameType::OfferClaim => super::offer::T_OFFER_CLAIM,
            FrameType::OfferReply => super::offer::T_OFFER_REPLY,
        }
    }

    /// Whether the body of a frame of this type starts with its request
    /// number (a `u64`): a receiver that refuses it may still name the
    /// request in its answer (see [`Header::req`]).
    pub fn starts_with_req(self) -> bool {
        matches!(
            self,
            FrameType::Open
                | FrameType::Data
                | FrameType::Finish
                | FrameType::Abort
                | FrameType::Lease
                | FrameType::Release
                | FrameType::Digest
                | FrameType::GrantRequest
                | FrameType::GrantReply
                | FrameType::OfferClaim
                | FrameType::OfferReply
        )
    }
}

impl fmt::Display for FrameType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            FrameType::Hello => "hello",
            FrameType::Open => "open",
            FrameType::Data => "data",
            FrameType::Finish => "finish",
            FrameType::Abort => "abort",
            FrameType::Auth => "auth",
            FrameType::Lease => "lease",
            FrameType::Release => "release",
            FrameType::Ping => "ping",
            FrameType::Pong => "pong",
            FrameType::Digest => "digest",
            FrameType::LaneOffer => "lane offer",
            FrameType::GrantRequest => "grant request",
            FrameType::GrantReply => "grant reply",
            FrameType::OfferClaim => "offer claim",
            FrameType::OfferReply => "offer reply",
        };
        f.write_str(name)
    }
}

/// The frame types a receiver accepts at one point of a conversation. A
/// frame of another type is refused from its header ([`Expect::check`]),
/// before a byte of its body is read or decoded: during the handshake,
/// whoever has not proven anything yet can make the receiver decode only
/// the one frame it waits for.
///
/// | where | accepted |
/// |---|---|
/// | a connection's first frame, either side | [`HELLO`](Self::HELLO) |
/// | passive side with a secret, after the hellos | [`AUTH`](Self::AUTH) |
/// | active side with a secret, after the hellos | [`AUTH_ANSWER`](Self::AUTH_ANSWER) |
/// | active side, each answer of a lane's set-up | [`LANE_ANSWER`](Self::LANE_ANSWER) |
/// | after the handshake | [`ANY`](Self::ANY) (the session refuses what it must) |
///
/// ```
/// use ferry_proto::wire::{Expect, FrameType};
/// assert!(Expect::AUTH.allows(FrameType::Auth));
/// assert!(!Expect::AUTH.allows(FrameType::Lease));
/// assert!(Expect::LANE_ANSWER.allows(FrameType::Abort));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect(u16);

impl Expect {
    /// Any frame.
    pub const ANY: Expect = Expect(u16::MAX);
    /// The first frame of a connection, in either direction.
    pub const HELLO: Expect = Expect::only(&[FrameType::Hello]);
    /// The passive side with a secret, after the hellos: the active side's
    /// handshake message.
    pub const AUTH: Expect = Expect::only(&[FrameType::Auth]);
    /// The active side with a secret, after the hellos: the passive side's
    /// answer, or its refusal.
    pub const AUTH_ANSWER: Expect = Expect::only(&[FrameType::Auth, FrameType::Abort]);
    /// The active side, during a lane's set-up ([`LaneOffer`]).
    pub const LANE_ANSWER: Expect = Expect::only(&[FrameType::LaneOffer, FrameType::Abort]);

    /// Exactly `types`.
    pub const fn only(types: &[FrameType]) -> Expect {
        let mut mask = 0u16;
        let mut i = 0;
        while i < types.len() {
            mask |= 1 << types[i] as u16;
            i += 1;
        }
        Expect(mask)
    }

    /// Whether a frame of type `t` is accepted.
    pub fn allows(self, t: FrameType) -> bool {
        self.0 & (1 << t as u16) != 0
    }

    /// Checks a frame's header: `Err(Unexpected)` for a type that is not
    /// accepted here.
    pub fn check(self, h: &Header) -> Result<(), WireError> {
        let t = h.frame_type();
        if self.allows(t) {
            Ok(())
        } else {
            Err(WireError::Unexpected(t))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_own_bit_and_code() {
        for (i, t) in FrameType::ALL.into_iter().enumerate() {
            assert_eq!(FrameType::of(t.code()), Some(t));
            assert!(Expect::ANY.allows(t));
            assert_eq!(Expect::HELLO.allows(t), t == FrameType::Hello);
            assert_eq!(Expect::AUTH.allows(t), t == FrameType::Auth);
            for (j, u) in FrameType::ALL.into_iter().enumerate() {
                assert_eq!(Expect::only(&[t]).allows(u), i == j);
            }
        }
        assert_eq!(FrameType::of(0), None);
        assert_eq!(FrameType::of(8), None);
        assert_eq!(FrameType::of(10), None);
        assert_eq!(FrameType::of(19), None);
    }
}
