//! The control plane's errors.

use std::time::Duration;

use ferry_proto::MetadataError;

/// What went wrong while handing metadata over. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key cannot name metadata: use 1 to 128 characters from
    /// `A-Z a-z 0-9 _ -` (it becomes a NATS subject token and a URL segment).
    #[error(
        "invalid metadata key {key:?}: {reason}; use 1 to 128 characters from A-Z a-z 0-9 _ -"
    )]
    InvalidKey {
        /// The key, cut to 64 characters.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The NATS subject prefix is not dot-separated tokens of `A-Z a-z 0-9 _ -`.
    #[error(
        "invalid NATS subject prefix {prefix:?}: use tokens of A-Z a-z 0-9 _ - separated by dots"
    )]
    InvalidPrefix {
        /// The prefix.
        prefix: String,
    },
    /// A value to store is longer than a store takes.
    #[error(
        "a value of {len} bytes is more than the {max} a store takes: store less under one key"
    )]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// This publisher already publishes metadata under this key: withdraw the
    /// first (drop its [`Publication`](crate::Publication)) or use another key.
    #[error("metadata is already published under key {key:?} here")]
    AlreadyPublished {
        /// The key.
        key: String,
    },
    /// Nobody publishes metadata under this key (until the deadline, for a
    /// fetch): the exposing worker has not published it yet, has withdrawn
    /// it, or uses another key, server or subject prefix.
    #[error("no metadata is published under key {key:?} (waited {waited:?})")]
    NotFound {
        /// The key.
        key: String,
        /// How long the fetch kept asking.
        waited: Duration,
    },
    /// No server answered at this address: start it, or check the address.
    #[error("no control-plane server at {endpoint}: {detail}")]
    NoServer {
        /// The address or URL.
        endpoint: String,
        /// The system's reason (connection refused, ...).
        detail: String,
    },
    /// The server closed the connection (or restarted) before it answered,
    /// and did not come back before the deadline: retry with a later deadline,
    /// or check that the server runs.
    #[error("the control-plane server at {endpoint} went away before answering: {detail}")]
    ServerGone {
        /// The address or URL.
        endpoint: String,
        /// What happened.
        detail: String,
    },
    /// The deadline passed with no answer (nor any more precise cause).
    #[error("no answer within {waited:?} while {during}")]
    Timeout {
        /// How long it waited.
        waited: Duration,
        /// What it was doing.
        during: &'static str,
    },
    /// The server answered with something that is not a metadata reply (not
    /// HTTP, an oversized body, ...): it is not a Ferry control-plane server,
    /// or it is broken.
    #[error("bad reply from {endpoint}: {detail}")]
    BadReply {
        /// The address or URL.
        endpoint: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The reply was not valid metadata (malformed, from another Ferry
    /// version, or too large): nothing was granted; check both sides' versions.
    #[error("the reply is not valid metadata: {0}")]
    InvalidMetadata(#[from] MetadataError),
    /// The server refused the request (an HTTP status other than 200 and 404).
    #[error("the control-plane server at {endpoint} refused the request: {status} {reason}")]
    Refused {
        /// The address or URL.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The server's reason (its body, cut to 200 bytes).
        reason: String,
    },
    /// The HTTP server could not listen on this address: pick another
    /// address or port (0 picks a free one).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// The NATS client failed in a way not listed above (subscribing, say):
    /// the message is the client's.
    #[error("NATS: {0}")]
    Nats(String),
    /// An answer was refused because it does not prove that its sender
    /// holds the deployment's secret: forged, replayed from another request,
    /// sealed for another key, altered, or from a publisher without the
    /// secret. A fetch with a secret goes on waiting for the real answer
    /// until its deadline, and reports this if none came.
    #[error(
        "an answer from {endpoint} was refused: {detail}; a fetch with a secret accepts only \
         metadata sealed with the same secret for its own request (give the publisher the same \
         secret: FERRY_SECRET or Config::secret)"
    )]
    Forged {
        /// The address, URL or subject.
        endpoint: String,
        /// What is wrong with the answer.
        detail: String,
    },
    /// The publisher requires the deployment's secret and this fetcher has
    /// none, or another one: give both the same secret (`FERRY_SECRET` or
    /// [`Config::secret`](crate::Config::secret)).
    #[error("the publisher at {endpoint} requires the deployment's secret: {detail}; give this side the same secret (FERRY_SECRET or Config::secret)")]
    SecretRequired {
        /// The address, URL or subject.
        endpoint: String,
        /// What the publisher said, or what came back.
        detail: String,
    },
    /// The server refused this side's credentials: a missing or wrong HTTP
    /// bearer token (`FERRY_CONTROL_TOKEN`), or NATS credentials the server
    /// does not accept (`FERRY_NATS_*`).
    #[error("the control-plane server at {endpoint} refused the credentials: {detail}")]
    Unauthorized {
        /// The address or URL.
        endpoint: String,
        /// What the server said.
        detail: String,
    },
    /// Without a secret, whoever reaches the control plane can take the
    /// capabilities it hands over, so it serves only on loopback unless the
    /// network is declared trusted.
    #[error(
        "refusing to serve metadata without a secret at {addr}, which other hosts can reach: \
         whoever reaches it could take the capabilities. Give the control plane the \
         deployment's secret (FERRY_SECRET or Config::secret), use a loopback address \
         (127.0.0.1), or declare the network trusted ({env}=1 or Config::trusted_network)"
    )]
    UntrustedNetwork {
        /// The address that other hosts can reach.
        addr: String,
        /// The environment variable that declares the network trusted.
        env: &'static str,
    },
    /// The configuration is invalid (a short secret, conflicting NATS
    /// credentials, an unreadable credentials file, ...).
    #[error("invalid control-plane configuration: {0}")]
    Config(String),
    /// The etcd key prefix is not `/` followed by `/`-separated segments
    /// of `A-Z a-z 0-9 _ -` (`/ferry/metadata`, say).
    #[error(
        "invalid etcd key prefix {prefix:?}: use / then segments of A-Z a-z 0-9 _ - separated by /"
    )]
    InvalidEtcdPrefix {
        /// The prefix, cut to 64 characters.
        prefix: String,
    },
}

impl Error {
    /// Whether asking again before the deadline may succeed: the key was not
    /// published yet, the server was away, or an answer was refused as not
    /// sealed with the secret (the real one may still come).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::NotFound { .. }
                | Error::NoServer { .. }
                | Error::ServerGone { .. }
                | Error::Timeout { .. }
                | Error::Forged { .. }
        )
    }

    /// Whether the error describes an answer that came back (rather than
    /// the absence of one, or this side's own configuration). A fetch with
    /// a secret trusts no answer that is not sealed, refusals included, so
    /// it asks again after any of these until its deadline.
    pub(crate) fn is_unauthenticated_answer(&self) -> bool {
        matches!(
            self,
            Error::BadReply { .. }
                | Error::InvalidMetadata(_)
                | Error::Refused { .. }
                | Error::Forged { .. }
                | Error::SecretRequired { .. }
                | Error::Unauthorized { .. }
        )
    }
}

/// The control plane's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
