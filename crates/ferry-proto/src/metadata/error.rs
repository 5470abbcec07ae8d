//! Why metadata was refused.

use super::{
    MAX_ADDRESSES, MAX_DESCRIPTORS, MAX_DESCRIPTOR_SIZE, MAX_METADATA_JSON, MAX_NAME,
    MAX_TOTAL_SIZE, MAX_TRANSPORTS, MAX_TRANSPORT_BLOB, MAX_TRANSPORT_NAME, METADATA_VERSION,
};

/// Why metadata was refused. Every variant says which field is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// Not JSON, or JSON of the wrong shape (missing, unknown or mistyped fields).
    #[error("metadata is not valid RdmaMetadata JSON: {0}")]
    Json(String),
    /// The JSON is larger than [`MAX_METADATA_JSON`].
    #[error("metadata JSON is {len} bytes, more than the limit of {MAX_METADATA_JSON}")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// Written by a Ferry with another metadata format.
    #[error("metadata format version {found} is not supported (this build reads version {METADATA_VERSION}); upgrade both workers to the same Ferry")]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// `operation_kind` is not 1 (READ) or 2 (WRITE).
    #[error("operation_kind {0} is invalid: expected 1 (READ) or 2 (WRITE)")]
    InvalidKind(u8),
    /// The descriptor list is empty.
    #[error("metadata lists no descriptors")]
    NoDescriptors,
    /// More than [`MAX_DESCRIPTORS`] descriptors (counting each entry's
    /// `count`).
    #[error("metadata lists {0} descriptors or more, more than the limit of {MAX_DESCRIPTORS}")]
    TooManyDescriptors(usize),
    /// More than [`MAX_RUNS`](crate::runs::MAX_RUNS) entries in the
    /// descriptor list (neighbours of one device and size belong in one
    /// entry with a `count`).
    #[error(
        "metadata lists {0} descriptor entries, more than the limit of {max}",
        max = crate::runs::MAX_RUNS
    )]
    TooManyEntries(usize),
    /// A descriptor entry with `count` 0.
    #[error("the descriptor entry at descriptor {index} has count 0; a count is at least 1")]
    EmptyEntry {
        /// The index of the first descriptor the entry would describe.
        index: usize,
    },
    /// One descriptor is larger than 1 TiB.
    #[error(
        "descriptor {index} has size {size}, more than the limit of {MAX_DESCRIPTOR_SIZE} bytes"
    )]
    DescriptorTooLarge {
        /// Which descriptor.
        index: usize,
        /// Its size.
        size: u64,
    },
    /// The sizes add up to more than 256 TiB.
    #[error("the descriptors add up to more than {MAX_TOTAL_SIZE} bytes")]
    TotalTooLarge,
    /// `token` is not 32 hexadecimal digits.
    #[error("token is not 32 hexadecimal digits")]
    InvalidToken,
    /// No address to reach the worker at.
    #[error("metadata lists no address")]
    NoAddress,
    /// Too many addresses.
    #[error("metadata lists {0} addresses, more than the limit of {MAX_ADDRESSES}")]
    TooManyAddresses(usize),
    /// An address is not `ip:port`.
    #[error("address {0:?} is not of the form ip:port")]
    InvalidAddress(String),
    /// A name field is empty or too long.
    #[error("field {field} must be 1 to {MAX_NAME} characters long")]
    BadName {
        /// Which field.
        field: &'static str,
    },
    /// A transport name is not 1 to [`RdmaMetadata::MAX_TRANSPORT_NAME`](crate::RdmaMetadata::MAX_TRANSPORT_NAME)
    /// bytes of `[a-z][a-z0-9_-]*`.
    #[error(
        "transports: name {0:?} is not 1 to {MAX_TRANSPORT_NAME} characters of [a-z][a-z0-9_-]*"
    )]
    BadTransportName(
        /// The name (its first 64 characters).
        String,
    ),
    /// More than [`RdmaMetadata::MAX_TRANSPORTS`](crate::RdmaMetadata::MAX_TRANSPORTS) transport blobs.
    #[error("transports: {0} entries, more than the limit of {MAX_TRANSPORTS}")]
    TooManyTransports(
        /// How many (at least: a parse stops counting one past the limit).
        usize,
    ),
    /// A transport blob is larger than [`RdmaMetadata::MAX_TRANSPORT_BLOB`](crate::RdmaMetadata::MAX_TRANSPORT_BLOB).
    #[error("transports: the blob of {name:?} is {len} bytes, more than the limit of {MAX_TRANSPORT_BLOB}")]
    TransportBlobTooLarge {
        /// The transport's name.
        name: String,
        /// The blob's length in bytes (at least; half its hex digits, rounded up).
        len: usize,
    },
    /// A transport blob is not an even number of hexadecimal digits.
    #[error("transports: the blob of {0:?} is not an even number of hexadecimal digits")]
    InvalidTransportBlob(
        /// The transport's name.
        String,
    ),
    /// The same transport name twice.
    #[error("transports: name {0:?} appears twice")]
    DuplicateTransport(
        /// The name.
        String,
    ),
}
