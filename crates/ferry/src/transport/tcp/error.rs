//! What can end a connection.

use std::io;

use ferry_proto::session::Violation;
use ferry_proto::wire::{AbortReason, FrameType, WireError};

use crate::{Error, PeerMisbehaved};

/// What went wrong on a connection; it is closed afterwards.
pub(super) enum ConnError {
    Io(io::Error),
    Wire(WireError),
    /// The peer broke the request protocol.
    Violation(Violation),
    /// A frame or the secure channel could not be read as it must be.
    Channel(String),
    /// A frame of a type not valid at this point of the handshake, refused
    /// from its header (its body unread); for an `Open`, the request it
    /// names.
    Unexpected(FrameType, Option<u64>),
    Closed(Error),
}

impl From<Violation> for ConnError {
    fn from(v: Violation) -> Self {
        ConnError::Violation(v)
    }
}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(e)
    }
}
impl From<WireError> for ConnError {
    fn from(e: WireError) -> Self {
        ConnError::Wire(e)
    }
}

impl ConnError {
    pub(super) fn into_error(self, peer: &str) -> Error {
        match self {
            ConnError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => Error::ConnectionLost {
                peer: peer.to_string(),
                cause: "the remote closed the connection (did the remote process exit?)".into(),
            },
            ConnError::Io(e) => Error::ConnectionLost {
                peer: peer.to_string(),
                cause: e.to_string(),
            },
            ConnError::Wire(e) => Error::Protocol {
                peer: peer.to_string(),
                violation: PeerMisbehaved::Wire(e),
            },
            ConnError::Violation(v) => Error::Protocol {
                peer: peer.to_string(),
                violation: PeerMisbehaved::Session(v),
            },
            ConnError::Channel(d) => Error::Protocol {
                peer: peer.to_string(),
                violation: PeerMisbehaved::Channel(d),
            },
            ConnError::Unexpected(ty, _) => Error::Protocol {
                peer: peer.to_string(),
                violation: PeerMisbehaved::Wire(WireError::Unexpected(ty)),
            },
            ConnError::Closed(e) => e,
        }
    }
}

/// The error an operation ends with when the remote aborts it.
pub(super) fn remote_error(reason: AbortReason, detail: String) -> Error {
    match reason {
        AbortReason::Cancelled => Error::RemoteCancelled,
        AbortReason::Unauthenticated => Error::Unauthenticated {
            peer: String::new(),
            detail,
        },
        AbortReason::PartFailed => Error::ConnectionLost {
            peer: String::new(),
            cause: format!(
                "another stream of this striped transfer failed at the remote: {detail}"
            ),
        },
        AbortReason::DigestMismatch => Error::DigestMismatch { detail },
        reason => Error::Rejected { reason, detail },
    }
}
