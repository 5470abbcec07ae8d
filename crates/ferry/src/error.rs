use std::sync::Arc;
use std::time::Duration;

use ferry_proto::session::Violation;
use ferry_proto::wire::{AbortReason, WireError};
use ferry_proto::{Device, MetadataError, OperationKind, ParseDeviceError};

/// Everything that can go wrong in Ferry.
///
/// The variants fall in four groups, which callers usually treat differently:
/// misuse of the API (fix the calling code), bad metadata (get fresh metadata
/// from the remote), remote failures (the transfer did not happen; retry or
/// give up), and timeouts.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- misuse ----
    /// An operation was given no descriptors.
    #[error("no descriptors given: an operation needs at least one")]
    NoDescriptors,
    /// An operation was given more descriptors than metadata can carry.
    #[error("{0} descriptors given; an operation takes at most {max}", max = ferry_proto::MAX_DESCRIPTORS)]
    TooManyDescriptors(usize),
    /// A read-only descriptor was given where bytes will be written into it.
    #[error("descriptor {index} is read-only, but a {op} writes into it: build it from mutable memory (Vec<u8>, BytesMut, &mut [u8])")]
    ReadOnlyDescriptor {
        /// Which descriptor.
        index: usize,
        /// The operation that would write into it.
        op: &'static str,
    },
    /// Memory on a device this build cannot move yet (a remote's
    /// descriptor outside host memory, or a device kind other than CUDA);
    /// local CUDA memory is [`CudaUnavailable`](Self::CudaUnavailable) or
    /// [`NoDeviceTransport`](Self::NoDeviceTransport).
    #[error(
        "descriptor {index} is on {device}: only cpu memory is supported in this version of Ferry"
    )]
    UnsupportedDevice {
        /// Which descriptor.
        index: usize,
        /// Its device.
        device: Device,
    },
    /// A descriptor of CUDA memory, on a host where CUDA is not available:
    /// no driver (`libcuda`), a driver that failed to initialise, or no
    /// device. `reason` is what [`cuda::status`](crate::cuda::status) says,
    /// with what to install or set.
    #[error(
        "descriptor {index} is on {device}, but CUDA is not available on this host: {reason}. \
         Ferry moves host (cpu) memory only here: copy the data to host memory and describe that"
    )]
    CudaUnavailable {
        /// Which descriptor.
        index: usize,
        /// Its device.
        device: Device,
        /// Why there is no CUDA, and what to install or set.
        reason: String,
    },
    /// A descriptor of CUDA memory, on a host where CUDA is available, but
    /// no transport of this connector carries it to or from this remote
    /// (`docs/gpu.md`): host and GPU memory mixed in one operation, or a
    /// transport that does not move device memory. `reason` says which.
    #[error(
        "descriptor {index} is on {device}, but no transport of this connector carries it \
         here: {reason}. Copy the data to host memory (e.g. tensor.cpu()) and describe that"
    )]
    NoDeviceTransport {
        /// Which descriptor.
        index: usize,
        /// Its device.
        device: Device,
        /// What is missing (mixed memory, a transport without device
        /// memory).
        reason: String,
    },
    /// A descriptor of CUDA memory that the CUDA driver does not take for
    /// memory of its device: memory of another GPU, host memory described
    /// as a GPU's, or a range whose last byte is not device memory of that
    /// GPU (its first and last byte are checked with
    /// `cuPointerGetAttribute` when the operation is created, where the
    /// driver is here).
    #[error(
        "descriptor {index} says {device}, but the CUDA driver disagrees: {reason}. Describe \
         allocated GPU memory with the device it is on (tensor.device)"
    )]
    NotDeviceMemory {
        /// Which descriptor.
        index: usize,
        /// The device it names.
        device: Device,
        /// What the driver says.
        reason: String,
    },
    /// A device string that does not parse.
    #[error(transparent)]
    InvalidDevice(#[from] ParseDeviceError),
    /// Metadata of a readable given to a write, or of a writable given to a read.
    #[error("a {active} needs the metadata of a {expected}, but this metadata comes from a {found}: pair READ with READABLE and WRITE with WRITABLE")]
    WrongPairing {
        /// The active operation attempted.
        active: &'static str,
        /// The passive operation it needs.
        expected: &'static str,
        /// The passive operation the metadata describes.
        found: &'static str,
    },
    /// Local and remote descriptor counts differ.
    #[error("{local} local descriptors but the remote exposes {remote}: counts must match")]
    CountMismatch {
        /// Local count.
        local: usize,
        /// Remote count.
        remote: usize,
    },
    /// A local and a remote descriptor differ in size.
    #[error("descriptor {index} is {local} bytes locally but {remote} bytes at the remote: sizes must match")]
    SizeMismatch {
        /// Which descriptor.
        index: usize,
        /// Local size.
        local: u64,
        /// Remote size.
        remote: u64,
    },
    /// The connector was configured wrongly (bad listen address, no transport left).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A knob (a [`ConnectorBuilder`](crate::ConnectorBuilder) setting or
    /// its `FERRY_*` variable) set to a value it cannot take: which, set
    /// where, and what is wrong (see [`config`](crate::config)).
    #[error("invalid configuration: {0}")]
    InvalidSetting(#[from] crate::config::SettingError),

    // ---- bad metadata ----
    /// The metadata does not parse or does not validate.
    #[error("bad metadata: {0}")]
    InvalidMetadata(#[from] MetadataError),
    /// The listener at the metadata's address belongs to another worker
    /// (it restarted, or the metadata is stale).
    #[error("the worker at {address} is {found:?}, not {expected:?}: the metadata is stale or meant for another worker")]
    WrongWorker {
        /// The address reached.
        address: String,
        /// The worker id in the metadata.
        expected: String,
        /// The worker id that answered.
        found: String,
    },

    // ---- remote failures ----
    /// No address in the metadata could be connected to.
    #[error("cannot reach worker {worker:?} at {addresses}: {cause}")]
    Unreachable {
        /// The worker id from the metadata.
        worker: String,
        /// The addresses tried.
        addresses: String,
        /// The last failure.
        cause: String,
    },
    /// The remote refused the operation.
    #[error("the remote refused the operation: {}{}", describe(*.reason), detail_suffix(.detail))]
    Rejected {
        /// Why, as the remote said.
        reason: AbortReason,
        /// The remote's detail text.
        detail: String,
    },
    /// The remote side cancelled (or dropped) its operation.
    #[error("the remote side cancelled the operation")]
    RemoteCancelled,
    /// The connection to the remote broke (the remote died, or the network failed).
    #[error("connection to worker {peer:?} lost: {cause}")]
    ConnectionLost {
        /// The remote worker id.
        peer: String,
        /// What happened.
        cause: String,
    },
    /// A copy between GPU memory and host memory failed on this side (the
    /// CUDA driver's error): the operation ended, and its peer was told.
    #[error("a copy to or from GPU memory failed: {reason}")]
    DeviceCopy {
        /// The driver's error.
        reason: String,
    },
    /// The end-to-end integrity check failed: the digest of the bytes that
    /// landed differs from the digest of the bytes the source sent or lent
    /// ([`ConnectorBuilder::digest`](crate::ConnectorBuilder::digest)).
    /// Both sides end the operation ERRORED with this error, whichever
    /// compared; the destination's memory does not hold what was sent.
    #[error(
        "the bytes that landed differ from the bytes sent (end-to-end digest mismatch): {detail}"
    )]
    DigestMismatch {
        /// Both digests, as the side that compared them saw them.
        detail: String,
    },
    /// The remote broke the protocol; the connection was closed.
    /// [`violation`](PeerMisbehaved) says how, typed: match on it.
    #[error("worker {peer:?} broke the Ferry protocol: {violation}")]
    Protocol {
        /// The remote worker id, or its address before the handshake.
        peer: String,
        /// What was wrong.
        violation: PeerMisbehaved,
    },
    /// The two workers could not prove to each other that they share the
    /// same secret (or only one of them has one).
    #[error("authentication with worker {peer:?} failed: {detail}; give both workers the same secret (FERRY_SECRET or ConnectorBuilder::secret)")]
    Unauthenticated {
        /// The remote worker id (empty if unknown).
        peer: String,
        /// What went wrong.
        detail: String,
    },
    /// This side cancelled (or dropped) the operation.
    #[error("the operation was cancelled")]
    Cancelled,
    /// The connector shut down while the operation was pending.
    #[error("the connector was shut down")]
    Shutdown,
    /// An I/O error outside any transfer (e.g. binding the listener).
    #[error("I/O error: {0}")]
    Io(Arc<std::io::Error>),

    // ---- grants ----
    /// A grant, or a one-sided operation on one, was refused (typed: match
    /// on the [`GrantError`](crate::grant::GrantError)).
    #[error(transparent)]
    Grant(#[from] ferry_proto::grant::GrantError),
    /// Blocks of a pool could not be taken (busy, out of range, a
    /// read-only pool written).
    #[error(transparent)]
    Pool(#[from] crate::PoolError),

    // ---- time ----
    /// A deadline passed before the operation ended. The operation goes on;
    /// drop or cancel it to stop it.
    #[error("the operation did not finish within {0:?}")]
    Timeout(Duration),
    /// Nothing at all arrived from the remote (no byte, no heartbeat) for
    /// the liveness bound while this operation was in progress
    /// ([`ConnectorBuilder::liveness`](crate::ConnectorBuilder::liveness)):
    /// the remote is stopped (a `SIGSTOP`, a long pause), wedged or
    /// unreachable. Every operation of that connection ended, the remote
    /// was told where it could still hear
    /// ([`AbortReason::PeerUnresponsive`], which it reports as
    /// [`Rejected`](Self::Rejected)), and the connection closed.
    #[error("worker {peer:?} sent nothing for {after:?} while an operation was in progress: taken for stopped or unreachable")]
    PeerUnresponsive {
        /// The remote worker id.
        peer: String,
        /// How long it had been silent.
        after: Duration,
    },
    /// The passive operation's expiry lapsed
    /// ([`ReadableOperation::expires_after`](crate::ReadableOperation::expires_after)):
    /// its memory was fenced and given back as on a cancel (status
    /// `CANCELLED`); a transfer in progress was aborted, and its remote
    /// told ([`AbortReason::Expired`], which it reports as
    /// [`Rejected`](Self::Rejected)), as is any remote that comes later.
    #[error("the operation expired after {after:?}")]
    Expired {
        /// The expiry it was created with.
        after: Duration,
    },
}

/// How a peer broke the Ferry protocol: what [`Error::Protocol`] carries.
///
/// ```
/// # fn f(e: ferry::Error) {
/// use ferry::{Error, PeerMisbehaved, Violation};
/// match e {
///     Error::Protocol { violation: PeerMisbehaved::Session(Violation::RequestNumberInUse(n)), .. } => {
///         eprintln!("the peer reused request number {n}")
///     }
///     Error::Protocol { violation, .. } => eprintln!("the peer broke the protocol: {violation}"),
///     other => eprintln!("{other}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerMisbehaved {
    /// It broke a rule of the request protocol (the session's: a frame
    /// out of turn, data past what was asked, a lease nobody asked for...).
    #[error(transparent)]
    Session(#[from] Violation),
    /// It sent bytes that do not decode as a frame, or a frame of a type
    /// not valid at that point of the conversation.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// It speaks another version of the protocol.
    #[error("protocol version {theirs} (this build speaks {ours})")]
    Version {
        /// The version it speaks.
        theirs: u16,
        /// The version this build speaks.
        ours: u16,
    },
    /// Its answer in the handshake was not the frame it must be.
    #[error("expected {0}")]
    Expected(&'static str),
    /// Its secure channel, or the bytes of a transfer, could not be taken
    /// as they must be (a message that fails authentication, a first
    /// frame larger than any hello, data outside the descriptors).
    #[error("{0}")]
    Channel(String),
}

fn detail_suffix(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(" ({d})")
    }
}

fn describe(r: AbortReason) -> &'static str {
    match r {
        AbortReason::Cancelled => "it was cancelled",
        AbortReason::UnknownOperation => "no operation that this token grants: the metadata is forged, for another connector, or for an operation that ended long ago",
        AbortReason::OperationEnded => "the operation has already ended (completed, cancelled or dropped); ask for fresh metadata",
        AbortReason::BadToken => "the token does not grant access to this operation (sent by older versions; now UnknownOperation)",
        AbortReason::WrongKind => "the operation is of the other kind (READ vs WRITE)",
        AbortReason::CountMismatch => "descriptor counts differ",
        AbortReason::SizeMismatch => "descriptor sizes differ",
        AbortReason::Busy => "another remote is already transferring this operation",
        AbortReason::Protocol => "protocol violation",
        AbortReason::ShuttingDown => "the remote connector is shutting down",
        AbortReason::Unauthenticated => "the peers do not share the same secret",
        AbortReason::PartFailed => "another part of this striped transfer failed",
        AbortReason::DeviceMemory => "the remote's GPU memory could not be moved: no path reaches it, or a copy to or from it failed (the detail says which)",
        AbortReason::DigestMismatch => "the bytes that landed differ from the bytes sent (end-to-end digest mismatch)",
        AbortReason::CopySlots => "the remote has no cross-memory copy slot free for this transfer now (peers may be stalling copies): retry, or move it in band",
        AbortReason::PeerUnresponsive => "the remote heard nothing from this side within its liveness bound (this process was stopped, paused or unreachable) and ended the transfer",
        AbortReason::Expired => "the remote's passive operation expired: its memory was given back to its owner; ask for fresh metadata",
        _ => "unknown reason",
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(Arc::new(e))
    }
}

impl Error {
    /// Whether this error is a misuse of the API (as opposed to a failure):
    /// the call could not succeed as made, and nothing was attempted. This
    /// includes memory that this connector cannot move here
    /// ([`UnsupportedDevice`](Self::UnsupportedDevice),
    /// [`CudaUnavailable`](Self::CudaUnavailable),
    /// [`NoDeviceTransport`](Self::NoDeviceTransport),
    /// [`NotDeviceMemory`](Self::NotDeviceMemory)).
    pub fn is_misuse(&self) -> bool {
        matches!(
            self,
            Error::NoDescriptors
                | Error::TooManyDescriptors(_)
                | Error::ReadOnlyDescriptor { .. }
                | Error::UnsupportedDevice { .. }
                | Error::CudaUnavailable { .. }
                | Error::NoDeviceTransport { .. }
                | Error::NotDeviceMemory { .. }
                | Error::InvalidDevice(_)
                | Error::WrongPairing { .. }
                | Error::CountMismatch { .. }
                | Error::SizeMismatch { .. }
                | Error::Config(_)
                | Error::InvalidSetting(_)
        )
    }

    pub(crate) fn wrong_pairing(active: OperationKind, found: OperationKind) -> Self {
        Error::WrongPairing {
            active: active.active_name(),
            expected: active.passive_name(),
            found: found.passive_name(),
        }
    }
}

/// Shorthand for `Result<T, ferry::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
