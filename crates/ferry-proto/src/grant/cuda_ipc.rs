//! The CUDA IPC lane of a grant over device memory: the IPC handle of the
//! allocation the pool lies in, exported once by the owner and opened once
//! by the holder (`cuIpcOpenMemHandle`), and where the pool lies in it.
//! The fence, the generations and the notification ring stay on the
//! control page the cross-memory attach section names.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::GrantError;

/// The bytes of a `CUipcMemHandle`.
pub const IPC_HANDLE_LEN: usize = 64;

/// The CUDA IPC lane of a grant (device memory on one host).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CudaIpcGrant {
    /// The allocation's `CUipcMemHandle` (a capability: it maps the whole
    /// allocation).
    pub handle: [u8; IPC_HANDLE_LEN],
    /// The allocation's size in bytes, as the owner's driver reports it.
    pub alloc_size: u64,
    /// Where the granted pool (block 0) starts in the allocation.
    pub offset: u64,
    /// The UUID of the GPU the memory is on (how the holder finds it among
    /// its own devices, whatever it numbers them).
    pub device_uuid: [u8; 16],
}

impl fmt::Debug for CudaIpcGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaIpcGrant")
            .field("alloc_size", &self.alloc_size)
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

impl CudaIpcGrant {
    /// Checks that `size` granted bytes lie inside the allocation.
    pub fn validate(&self, size: u64) -> Result<(), GrantError> {
        let end = self.offset.checked_add(size);
        if self.alloc_size == 0 || !end.is_some_and(|e| e <= self.alloc_size) {
            return Err(GrantError::Malformed(format!(
                "the cuda_ipc lane's {size} bytes at offset {} do not fit its allocation of {} bytes",
                self.offset, self.alloc_size
            )));
        }
        Ok(())
    }
}

/// The section as JSON carries it (hex for the bytes).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCudaIpc {
    handle: String,
    alloc_size: u64,
    offset: u64,
    device_uuid: String,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str, what: &str) -> Result<[u8; N], GrantError> {
    let bad = || GrantError::Malformed(format!("the cuda_ipc {what} is not {} hex digits", 2 * N));
    if s.len() != 2 * N || !s.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

impl From<&CudaIpcGrant> for RawCudaIpc {
    fn from(c: &CudaIpcGrant) -> RawCudaIpc {
        RawCudaIpc {
            handle: hex(&c.handle),
            alloc_size: c.alloc_size,
            offset: c.offset,
            device_uuid: hex(&c.device_uuid),
        }
    }
}

impl TryFrom<RawCudaIpc> for CudaIpcGrant {
    type Error = GrantError;
    fn try_from(r: RawCudaIpc) -> Result<CudaIpcGrant, GrantError> {
        Ok(CudaIpcGrant {
            handle: unhex(&r.handle, "handle")?,
            alloc_size: r.alloc_size,
            offset: r.offset,
            device_uuid: unhex(&r.device_uuid, "device UUID")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::{CmaGrant, GrantId, GrantMetadata, Rights, MAX_GRANT_JSON};
    use crate::{Device, Token};

    fn device_grant(owner: &str, holder: &str) -> GrantMetadata {
        GrantMetadata {
            owner: owner.into(),
            host_id: "0b1e5a9c-6a57-4e9b-9c3e-2f1f1a0c7e11".into(),
            grant: GrantId(u64::MAX),
            token: Token::from_bytes([0xab; 16]),
            holder: Some(holder.into()),
            rights: Rights::READ_WRITE,
            expires_at_ms: Some(u64::MAX),
            block_size: 1 << 21,
            block_count: 65536,
            device: Device::cuda(7),
            cma: Some(CmaGrant {
                pid: u32::MAX,
                control_fd: i32::MAX,
                cookie: [0x5c; 16],
                base: 0x7f00_0000_0000,
            }),
            cuda_ipc: Some(CudaIpcGrant {
                handle: [0xc3; IPC_HANDLE_LEN],
                alloc_size: u64::MAX,
                offset: u64::MAX - (1 << 37),
                device_uuid: [0x9d; 16],
            }),
            // A device grant has no TCP lane (the owner's runtime copies
            // with the CPU).
            tcp: None,
            ucx: None,
        }
    }

    #[test]
    fn a_device_grant_round_trips_within_a_kib() {
        let m = device_grant(&"o".repeat(128), &"h".repeat(128));
        let json = m.to_json().unwrap();
        assert!(json.len() <= MAX_GRANT_JSON, "{} bytes", json.len());
        assert_eq!(GrantMetadata::from_json(&json).unwrap(), m);
        // The handle is a capability: Debug does not show it.
        let dbg = format!("{m:?}");
        assert!(!dbg.contains("c3c3") && !dbg.contains("195"), "{dbg}");
        // Names that leave no room for the section: typed, never longer.
        let long = device_grant(&"o".repeat(256), &"h".repeat(256));
        assert!(matches!(long.to_json(), Err(GrantError::TooLarge { .. })));
    }

    #[test]
    fn a_bad_cuda_ipc_section_is_typed() {
        let json = device_grant("o", "h").to_json().unwrap();
        let handle = "c3".repeat(IPC_HANDLE_LEN);
        for bad in [
            json.replace(&handle, "c3"),
            json.replace(&handle, &"zz".repeat(IPC_HANDLE_LEN)),
            json.replace(&handle, &"é".repeat(IPC_HANDLE_LEN)),
            json.replace(&"9d".repeat(16), "9d"),
            json.replace("\"alloc_size\":18446744073709551615", "\"alloc_size\":0"),
            json.replace("\"alloc_size\":18446744073709551615", "\"alloc_size\":4096"),
            json.replace("\"offset\":", "\"offset\":1,\"x\":"),
        ] {
            assert_ne!(bad, json);
            match GrantMetadata::from_json(&bad) {
                Err(GrantError::Malformed(_)) | Err(GrantError::TooLarge { .. }) => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Past the end of the allocation, however it is said.
        let mut m = device_grant("o", "h");
        if let Some(c) = m.cuda_ipc.as_mut() {
            c.offset = u64::MAX;
        }
        assert!(matches!(m.to_json(), Err(GrantError::Malformed(_))));
    }
}
