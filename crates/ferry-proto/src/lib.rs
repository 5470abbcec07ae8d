//! The IO-free core of Ferry.
//!
//! This crate holds everything about Ferry's protocol that can be decided
//! without touching a socket or a pointer: the public value types
//! ([`Device`], [`OperationKind`], [`OperationStatus`]), the
//! [`RdmaMetadata`] record one worker hands to another, the wire
//! [frames](wire) spoken between connectors, and the [`Cursor`] state machine
//! that checks that a transfer covers exactly the described bytes, in order.
//!
//! Every input that comes from another process is parsed here, and parsing
//! never panics: malformed input yields a typed error.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cursor;
mod device;
pub mod grant;
pub mod lane;
mod metadata;
pub mod runs;
pub mod session;
pub mod slots;
mod status;
pub mod wire;

pub use cursor::{Cursor, CursorError};
pub use device::{Device, DeviceKind, ParseDeviceError};
pub use metadata::{
    DescriptorInfo, MetadataError, RdmaMetadata, Token, MAX_ADDRESSES, MAX_DESCRIPTORS,
    MAX_METADATA_JSON, METADATA_VERSION,
};
pub use status::{OperationKind, OperationStatus};
