//! Standing grants: the owner of registered memory lets one remote worker
//! read or write blocks of it by index, one-sidedly, until it revokes.
//!
//! This is the IO-free part: the values a grant is made of ([`GrantId`],
//! [`Rights`], [`BlockRef`]), the metadata that travels to the holder
//! ([`GrantMetadata`], at most [`MAX_GRANT_JSON`] bytes whatever the pool
//! size), the typed errors ([`GrantError`]) and the pure checks every lane
//! makes before it moves a byte ([`check`]).
//!
//! ```
//! use ferry_proto::grant::{check, BlockRef, GrantError, Rights};
//! assert!(Rights::READ_WRITE.allows(Rights::WRITE));
//! let refs = [BlockRef { index: 3, generation: 0 }];
//! assert!(check::blocks(&refs, 4).is_ok());
//! assert_eq!(
//!     check::blocks(&refs, 3),
//!     Err(GrantError::OutOfRange { index: 3, count: 3 })
//! );
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

pub mod check;
pub mod claim;
mod cuda_ipc;
mod error;
mod metadata;
mod offer;
pub mod ranges;
pub mod serve;
mod ucx;

pub use cuda_ipc::{CudaIpcGrant, IPC_HANDLE_LEN};
pub use error::GrantError;
pub use metadata::{
    CmaGrant, GrantMetadata, TcpGrant, GRANT_VERSION, MAX_GRANT_JSON, MAX_TCP_ADDRESSES,
};
pub use offer::{OfferId, OfferMetadata, MAX_OFFER_JSON, OFFER_VERSION};
pub use ranges::BlockRange;
pub use ucx::{UcxGrant, MAX_UCX_ADDRESS, MAX_UCX_RKEY};

/// The largest notification payload a one-sided write may carry to the
/// owner (NIXL's `notif_msg`), in bytes.
pub const MAX_NOTIFICATION: usize = 256;

/// The most bytes one request of a grant served over TCP moves
/// ([`wire::GrantRequest`](crate::wire::GrantRequest)): 1 MiB. A larger
/// transfer is several requests ([`serve::chunks`]), so that one request
/// holds the connection's other frames back for no longer than a
/// megabyte takes.
pub const MAX_TCP_CHUNK: usize = 1 << 20;

/// The most blocks one request of a grant served over TCP names.
pub const MAX_TCP_BLOCKS: usize = 4096;

/// The name of a grant, unique within its owner's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GrantId(pub u64);

impl fmt::Display for GrantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "grant {}", self.0)
    }
}

/// What a grant lets its holder do: [`READ`](Self::READ) (1),
/// [`WRITE`](Self::WRITE) (2) or both ([`READ_WRITE`](Self::READ_WRITE), 3).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub struct Rights(u8);

impl Rights {
    /// Nothing (never granted; what a check needs when it needs nothing).
    pub const NONE: Rights = Rights(0);
    /// Read blocks of the owner's memory.
    pub const READ: Rights = Rights(1);
    /// Write blocks of the owner's memory.
    pub const WRITE: Rights = Rights(2);
    /// Both.
    pub const READ_WRITE: Rights = Rights(3);

    /// The rights of these bits; `None` for bits other than 1 and 2.
    pub const fn from_bits(bits: u8) -> Option<Rights> {
        if bits & !3 == 0 {
            Some(Rights(bits))
        } else {
            None
        }
    }

    /// The bits (1 READ, 2 WRITE).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether these rights include every right of `needed`.
    pub const fn allows(self, needed: Rights) -> bool {
        self.0 & needed.0 == needed.0
    }

    /// Whether no right at all.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Rights {
    type Output = Rights;
    fn bitor(self, rhs: Rights) -> Rights {
        Rights(self.0 | rhs.0)
    }
}

impl TryFrom<u8> for Rights {
    type Error = GrantError;
    fn try_from(b: u8) -> Result<Rights, GrantError> {
        Rights::from_bits(b).ok_or_else(|| GrantError::Malformed(format!("rights {b}")))
    }
}

impl From<Rights> for u8 {
    fn from(r: Rights) -> u8 {
        r.0
    }
}

impl fmt::Display for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            0 => "nothing",
            1 => "READ",
            2 => "WRITE",
            _ => "READ|WRITE",
        })
    }
}

impl fmt::Debug for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One block of granted memory as a transfer names it: its index and the
/// generation the holder believes it has. The owner bumps a block's
/// generation when it reuses the block ([`retire`](check::generations));
/// a transfer that names an older one is refused and moves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockRef {
    /// The block's index in the granted memory.
    pub index: u32,
    /// The generation the transfer expects.
    pub generation: u32,
}

impl BlockRef {
    /// Block `index` at `generation`.
    pub const fn new(index: u32, generation: u32) -> BlockRef {
        BlockRef { index, generation }
    }
}

#[cfg(test)]
mod tests;
