//! What a grant's owner hands to its holder: small, whatever the pool size.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::cuda_ipc::RawCudaIpc;
use super::ucx::{RawUcx, UcxGrant};
use super::{CudaIpcGrant, GrantError, GrantId, Rights};
use crate::{Device, Token};

/// The grant metadata format this build writes and reads.
pub const GRANT_VERSION: u32 = 1;
/// The longest grant metadata, encoded (JSON), in bytes: what
/// [`GrantMetadata::to_json`] never exceeds and [`GrantMetadata::from_json`]
/// refuses past.
pub const MAX_GRANT_JSON: usize = 1024;
/// The longest worker or host id a grant names.
const MAX_NAME: usize = 256;
/// The largest block (1 TiB) and the largest granted memory (256 TiB).
const MAX_BLOCK: u64 = 1 << 40;
const MAX_TOTAL: u64 = 1 << 48;

/// The cross-memory attach lane of a grant: where the holder finds the
/// owner's control page (`/proc/<pid>/fd/<control_fd>`), the random cookie
/// that page must show, and the address of block 0 in the owner's memory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CmaGrant {
    /// The owner's process id (in the owner's pid namespace; the holder
    /// proves it names the owner by the cookie).
    pub pid: u32,
    /// The descriptor of the owner's control page in the owner's process.
    pub control_fd: i32,
    /// 16 random bytes the control page starts with.
    pub cookie: [u8; 16],
    /// The address of block 0 in the owner's memory.
    pub base: u64,
}

impl fmt::Debug for CmaGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmaGrant")
            .field("pid", &self.pid)
            .field("control_fd", &self.control_fd)
            .field("base", &format_args!("{:#x}", self.base))
            .finish_non_exhaustive()
    }
}

/// The TCP lane of a grant: where the holder reaches the owner's
/// connector, which serves each request in its runtime (one round trip;
/// see [`serve`](super::serve)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpGrant {
    /// The owner connector's advertised addresses (1 to
    /// [`MAX_TCP_ADDRESSES`]).
    pub addresses: Vec<SocketAddr>,
}

/// The most addresses a grant's TCP lane carries.
pub const MAX_TCP_ADDRESSES: usize = 8;

/// What the owner of a grant hands to its holder, through any side
/// channel, like [`RdmaMetadata`](crate::RdmaMetadata): JSON of at most
/// [`MAX_GRANT_JSON`] (1 KiB) bytes whatever the pool size. It is a
/// capability (its `Debug` hides the token and cookie): treat it like a
/// password.
///
/// Parsing is total: any text gives a grant or a typed [`GrantError`].
///
/// ```
/// use ferry_proto::grant::{GrantError, GrantMetadata};
/// assert!(matches!(GrantMetadata::from_json("{}"), Err(GrantError::Malformed(_))));
/// assert!(matches!(
///     GrantMetadata::from_json(&"x".repeat(2000)),
///     Err(GrantError::TooLarge { .. })
/// ));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct GrantMetadata {
    /// The owner's worker id.
    pub owner: String,
    /// The owner's host (its boot id): same-host lanes need the holder's
    /// to match.
    pub host_id: String,
    /// The grant's name in the owner's process.
    pub grant: GrantId,
    /// The grant's secret.
    pub token: Token,
    /// The worker the grant is bound to; `None`: whoever holds it (bearer).
    pub holder: Option<String>,
    /// What the holder may do.
    pub rights: Rights,
    /// When the grant ends by itself (unix milliseconds), if ever.
    pub expires_at_ms: Option<u64>,
    /// Bytes per block.
    pub block_size: u64,
    /// How many blocks.
    pub block_count: u32,
    /// Where the memory lives.
    pub device: Device,
    /// The cross-memory attach lane, where the owner offers it (for device
    /// memory: the control page only, `base` the owner's device address).
    pub cma: Option<CmaGrant>,
    /// The CUDA IPC lane, for device memory.
    pub cuda_ipc: Option<CudaIpcGrant>,
    /// The TCP lane, where the owner offers it.
    pub tcp: Option<TcpGrant>,
    /// The UCX lane, where the owner offers it.
    pub ucx: Option<UcxGrant>,
}

impl fmt::Debug for GrantMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrantMetadata")
            .field("owner", &self.owner)
            .field("grant", &self.grant)
            .field("holder", &self.holder)
            .field("rights", &self.rights)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .field("device", &self.device)
            .field("cma", &self.cma)
            .field("cuda_ipc", &self.cuda_ipc)
            .field("tcp", &self.tcp)
            .field("ucx", &self.ucx)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    version: u32,
    owner: String,
    host_id: String,
    grant: u64,
    token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    rights: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<u64>,
    block_size: u64,
    block_count: u32,
    device: Device,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cma: Option<RawCma>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cuda_ipc: Option<RawCudaIpc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tcp: Option<Vec<SocketAddr>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ucx: Option<RawUcx>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCma {
    pid: u32,
    control_fd: i32,
    cookie: String,
    base: u64,
}

fn check_name(s: &str, field: &str) -> Result<(), GrantError> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err(GrantError::Malformed(format!(
            "{field} must be 1 to {MAX_NAME} bytes long"
        )));
    }
    Ok(())
}

impl GrantMetadata {
    /// Checks every field as [`from_json`](Self::from_json) does.
    pub fn validate(&self) -> Result<(), GrantError> {
        check_name(&self.owner, "owner")?;
        check_name(&self.host_id, "host_id")?;
        if let Some(h) = &self.holder {
            check_name(h, "holder")?;
        }
        if self.rights.is_empty() {
            return Err(GrantError::Malformed("a grant of no rights".into()));
        }
        if self.block_size == 0 || self.block_size > MAX_BLOCK {
            return Err(GrantError::Malformed(format!(
                "block size {} (1 to {MAX_BLOCK})",
                self.block_size
            )));
        }
        if self.block_count == 0 {
            return Err(GrantError::Malformed("a grant of no blocks".into()));
        }
        let total = self
            .block_size
            .checked_mul(u64::from(self.block_count))
            .filter(|&t| t <= MAX_TOTAL)
            .ok_or_else(|| GrantError::Malformed("more than 256 TiB granted".into()))?;
        if let Some(c) = &self.cma {
            if c.pid == 0 || c.control_fd < 0 {
                return Err(GrantError::Malformed(
                    "the cma lane names no process or descriptor".into(),
                ));
            }
            if c.base == 0 || c.base.checked_add(total).is_none() {
                return Err(GrantError::Malformed(
                    "the cma lane's memory does not fit the address space".into(),
                ));
            }
        }
        if let Some(c) = &self.cuda_ipc {
            c.validate(total)?;
        }
        if let Some(t) = &self.tcp {
            if t.addresses.is_empty() || t.addresses.len() > MAX_TCP_ADDRESSES {
                return Err(GrantError::Malformed(format!(
                    "the tcp lane must carry 1 to {MAX_TCP_ADDRESSES} addresses"
                )));
            }
        }
        if let Some(u) = &self.ucx {
            u.validate(total)?;
        }
        Ok(())
    }

    /// The bytes granted: `block_size * block_count`.
    pub fn size(&self) -> u64 {
        self.block_size.saturating_mul(u64::from(self.block_count))
    }

    /// Encodes the grant as JSON, of at most [`MAX_GRANT_JSON`] bytes
    /// ([`GrantError::TooLarge`] past it: worker ids with many characters
    /// that JSON escapes).
    pub fn to_json(&self) -> Result<String, GrantError> {
        self.validate()?;
        let raw = RawGrant {
            version: GRANT_VERSION,
            owner: self.owner.clone(),
            host_id: self.host_id.clone(),
            grant: self.grant.0,
            token: self.token.to_hex(),
            holder: self.holder.clone(),
            rights: self.rights.bits(),
            expires_at_ms: self.expires_at_ms,
            block_size: self.block_size,
            block_count: self.block_count,
            device: self.device,
            cma: self.cma.map(|c| RawCma {
                pid: c.pid,
                control_fd: c.control_fd,
                cookie: Token::from_bytes(c.cookie).to_hex(),
                base: c.base,
            }),
            cuda_ipc: self.cuda_ipc.as_ref().map(RawCudaIpc::from),
            tcp: self.tcp.as_ref().map(|t| t.addresses.clone()),
            ucx: self.ucx.as_ref().map(UcxGrant::to_raw),
        };
        let s = serde_json::to_string(&raw).map_err(|e| GrantError::Malformed(e.to_string()))?;
        if s.len() > MAX_GRANT_JSON {
            return Err(GrantError::TooLarge {
                len: s.len(),
                max: MAX_GRANT_JSON,
            });
        }
        Ok(s)
    }

    /// [`to_json`](Self::to_json) as bytes.
    pub fn encode(&self) -> Result<Vec<u8>, GrantError> {
        self.to_json().map(String::into_bytes)
    }

    /// Parses grant metadata: a grant, or a typed error for any input
    /// (never a panic).
    pub fn from_json(s: &str) -> Result<GrantMetadata, GrantError> {
        if s.len() > MAX_GRANT_JSON {
            return Err(GrantError::TooLarge {
                len: s.len(),
                max: MAX_GRANT_JSON,
            });
        }
        let raw: RawGrant = serde_json::from_str(s).map_err(|e| {
            let mut m = e.to_string();
            m.truncate(200);
            GrantError::Malformed(m)
        })?;
        if raw.version != GRANT_VERSION {
            return Err(GrantError::Malformed(format!(
                "version {} (this build reads {GRANT_VERSION})",
                raw.version
            )));
        }
        let token = Token::from_hex(&raw.token)
            .ok_or_else(|| GrantError::Malformed("the token is not 32 hex digits".into()))?;
        let rights = Rights::try_from(raw.rights)?;
        let cma = match raw.cma {
            None => None,
            Some(c) => Some(CmaGrant {
                pid: c.pid,
                control_fd: c.control_fd,
                cookie: *Token::from_hex(&c.cookie)
                    .ok_or_else(|| GrantError::Malformed("the cookie is not 32 hex digits".into()))?
                    .as_bytes(),
                base: c.base,
            }),
        };
        let m = GrantMetadata {
            owner: raw.owner,
            host_id: raw.host_id,
            grant: GrantId(raw.grant),
            token,
            holder: raw.holder,
            rights,
            expires_at_ms: raw.expires_at_ms,
            block_size: raw.block_size,
            block_count: raw.block_count,
            device: raw.device,
            cma,
            cuda_ipc: raw.cuda_ipc.map(CudaIpcGrant::try_from).transpose()?,
            tcp: raw.tcp.map(|addresses| TcpGrant { addresses }),
            ucx: raw.ucx.map(UcxGrant::from_raw).transpose()?,
        };
        m.validate()?;
        Ok(m)
    }

    /// [`from_json`](Self::from_json) of bytes (which must be UTF-8).
    pub fn decode(b: &[u8]) -> Result<GrantMetadata, GrantError> {
        if b.len() > MAX_GRANT_JSON {
            return Err(GrantError::TooLarge {
                len: b.len(),
                max: MAX_GRANT_JSON,
            });
        }
        let s = std::str::from_utf8(b)
            .map_err(|_| GrantError::Malformed("grant metadata is not UTF-8".into()))?;
        Self::from_json(s)
    }
}
