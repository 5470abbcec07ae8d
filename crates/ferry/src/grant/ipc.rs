//! The CUDA IPC lane of grants: device memory between two processes of
//! one host.
//!
//! The owner exports the IPC handle of the allocation its device pool lies
//! in once, at [`Connector::grant`](crate::Connector::grant) ([`export`]),
//! and hands it in the grant's `cuda_ipc` section with the pool's offset in
//! the allocation and the GPU's UUID. The holder opens it once, at
//! [`Connector::open_grant`](crate::Connector::open_grant) ([`open`]:
//! `cuIpcOpenMemHandle`), keeps the mapping while the grant lives, and
//! closes it (`cuIpcCloseMemHandle`) when it learns of the revoke at its
//! next use, or when the [`RemoteGrant`](super::RemoteGrant) drops. Each
//! read or write is device-to-device copies (`cuMemcpyDtoDAsync`) on a
//! stream of the holder's GPU and one `cuStreamSynchronize`, inside the
//! fence of the grant's control page (the cross-memory attach section's:
//! revoke, retire, generations and notifications behave as on that lane).
//!
//! The handle is bound to the control page: the page keeps a hash of the
//! token *and* the `cuda_ipc` section, so metadata whose handle, offset or
//! size was changed is refused as forged before the driver sees it.
//!
//! Between a device pool on one side and host memory on the other a grant
//! copies nothing: refused with [`GrantError::NoLane`] (the per-operation
//! path, which stages, moves such pairs). Both pools must be on one GPU.
//!
//! Run against the fake CUDA driver (`crates/fake-cuda`,
//! `tests/grant_ipc.rs`); unverified on a GPU.

use std::sync::{Arc, Mutex};

use ferry_proto::grant::{BlockRef, CudaIpcGrant, GrantError, GrantMetadata};
use ferry_proto::{Device, DeviceKind, Token};

use super::copy;
use crate::cuda::ipc::{self, CopyStream, Dst, Opened};
use crate::cuda::CudaError;
use crate::{Pool, Result};

/// Exports the allocation under the device pool `pool` (one
/// `cuIpcGetMemHandle`): the grant's `cuda_ipc` section.
pub(super) fn export(pool: &Pool) -> Result<CudaIpcGrant> {
    let device = pool.device();
    if device.kind() != DeviceKind::Cuda {
        return Err(GrantError::NoLane(format!(
            "the pool is on {device}: grants cover host memory and CUDA memory"
        ))
        .into());
    }
    if !crate::cuda::lends_device_memory() {
        let why = crate::cuda::status().err().unwrap_or_else(|| {
            "this process simulates a GPU: its device memory is not lent".into()
        });
        return Err(GrantError::NoLane(format!(
            "a grant of {device} memory is lent by CUDA IPC, which needs the CUDA driver: {why}"
        ))
        .into());
    }
    let base = pool.base() as usize as u64;
    let e = ipc::export(device.id(), &[(base, pool.size() as u64)]).map_err(|e| {
        GrantError::NoLane(format!(
            "the pool's memory is not exported by CUDA IPC: {e}"
        ))
    })?;
    let (Some(&(handle, alloc_size)), Some(&(_, offset))) = (e.allocs.first(), e.at.first()) else {
        return Err(GrantError::NoLane("the driver exported no allocation".into()).into());
    };
    Ok(CudaIpcGrant {
        handle,
        alloc_size,
        offset,
        device_uuid: ipc::device_uuid(device.id()),
    })
}

/// What a grant's control page keeps of its secret: the token's hash
/// (`super::token_hash`), and with a CUDA IPC section, a hash of the token
/// and of the section, so that the handle cannot be changed apart from the
/// token.
pub(super) fn page_hash(token: &Token, lane: Option<&CudaIpcGrant>) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let Some(l) = lane else {
        return super::token_hash(token);
    };
    let mut h = Sha256::new();
    h.update(b"ferry-grant-cuda-ipc-v1\0");
    h.update(super::token_hash(token));
    h.update(l.handle);
    h.update(l.alloc_size.to_le_bytes());
    h.update(l.offset.to_le_bytes());
    h.update(l.device_uuid);
    h.finalize().into()
}

/// A refusal of the control page, said of the handle too where the grant
/// has one (the page's hash covers both).
pub(super) fn forged(e: GrantError, meta: &GrantMetadata) -> GrantError {
    match e {
        GrantError::Forged { what: "token" } if meta.cuda_ipc.is_some() => GrantError::Forged {
            what: "token or CUDA IPC handle",
        },
        e => e,
    }
}

/// The owner's allocation, mapped in this process while the grant lives.
pub(super) struct Mapped {
    /// `None` once closed (revoked).
    opened: Mutex<Option<Arc<Opened>>>,
    /// The device of the context it is mapped in, and of the copies.
    ordinal: u32,
    /// Where block 0 lies in the mapping.
    offset: u64,
    /// The granted bytes.
    size: u64,
    block_size: u64,
}

/// Opens the grant's handle (`cuIpcOpenMemHandle`) in the primary context
/// of the owner's GPU as this process sees it. Blocking.
pub(super) fn open(
    meta: &GrantMetadata,
    lane: &CudaIpcGrant,
    owner_pid: u32,
) -> Result<Mapped, GrantError> {
    if owner_pid == std::process::id() {
        return Err(GrantError::NoLane(
            "CUDA IPC does not open a handle of this very process: open the grant from \
             another process"
                .into(),
        ));
    }
    if !crate::cuda::lends_device_memory() {
        let why = crate::cuda::status()
            .err()
            .unwrap_or_else(|| "this process simulates a GPU".into());
        return Err(GrantError::NoLane(format!(
            "the grant is of {} memory, moved by CUDA IPC, and this process has no CUDA \
             driver: {why}",
            meta.device
        )));
    }
    let Some(ordinal) = ipc::ordinal_of(&lane.device_uuid) else {
        return Err(GrantError::NoLane(format!(
            "the owner's GPU ({}) is not visible to this process",
            meta.device
        )));
    };
    let opened = crate::cuda::context::primary_ctx(ordinal)
        .and_then(|ctx| Opened::open(&ctx, &lane.handle))
        .map_err(|e| GrantError::NoLane(format!("the grant's CUDA IPC handle: {e}")))?;
    let size = meta.size();
    if !lane
        .offset
        .checked_add(size)
        .is_some_and(|end| end <= opened.size())
    {
        return Err(GrantError::Forged {
            what: "CUDA IPC allocation size",
        });
    }
    Ok(Mapped {
        opened: Mutex::new(Some(Arc::new(opened))),
        ordinal,
        offset: lane.offset,
        size,
        block_size: meta.block_size,
    })
}

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    /// Granted blocks into local ones.
    Read,
    /// Local blocks into granted ones.
    Write,
}

impl Mapped {
    /// Closes the mapping (`cuIpcCloseMemHandle`, once the copy that may
    /// still use it ends): the grant was revoked.
    pub(super) fn close(&self) {
        let taken = self.opened.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(taken);
    }

    /// Refuses a local pool this lane does not copy with: host memory, or
    /// another GPU than the granted memory's.
    pub(super) fn check_local(&self, local: Device) -> Result<(), GrantError> {
        if local == Device::cuda(self.ordinal) {
            return Ok(());
        }
        Err(GrantError::NoLane(if local.is_cpu() {
            "the granted memory is GPU memory (CUDA IPC) and the local pool host memory: a \
             grant copies GPU to GPU; use a pool on the same GPU, or a per-operation \
             transfer, which stages"
                .into()
        } else {
            format!(
                "the local pool is on {local}, the granted memory on cuda:{} here: a grant \
                 copies within one GPU",
                self.ordinal
            )
        }))
    }

    /// Copies between the local blocks `local` (device addresses on this
    /// lane's GPU, a block each) and the granted blocks `remote`, pairwise,
    /// in the direction `dir`: queued on one stream, then waited for (also
    /// after a failure to queue, so no copy runs when this returns).
    /// Blocking. [`GrantError::Revoked`] if the mapping was closed.
    ///
    /// # Safety
    ///
    /// Every `local[i]` is device memory of `cuda:ordinal` valid for
    /// reads (and writes for a [`Dir::Read`]) of its length, which nothing
    /// else writes (nor reads, for a `Read`) until this returns.
    pub(super) unsafe fn copy(
        &self,
        dir: Dir,
        local: &[(*mut u8, usize)],
        remote: &[BlockRef],
    ) -> Result<(), CopyError> {
        let Some(opened) = self
            .opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return Err(CopyError::Grant(GrantError::Revoked));
        };
        let bs = self.block_size;
        // Each remote block inside the granted bytes, each local range a
        // block long: checked here again, as the copy's bounds rest on it.
        let mut ranges = Vec::with_capacity(remote.len());
        for r in remote {
            let at = u64::from(r.index).saturating_mul(bs);
            if at.saturating_add(bs) > self.size {
                return Err(CopyError::Grant(GrantError::OutOfRange {
                    index: r.index,
                    count: (self.size / bs.max(1)) as u32,
                }));
            }
            ranges.push((opened.base() + self.offset + at, bs));
        }
        if local.len() != remote.len() || local.iter().any(|l| l.1 as u64 != bs) {
            return Err(CopyError::Grant(GrantError::LengthMismatch {
                what: "block sizes",
                local: local.first().map_or(0, |l| l.1 as u64),
                remote: bs,
            }));
        }
        // SAFETY: the caller's contract; `ranges` checked above.
        unsafe { self.queue_all(&opened, dir, local, &ranges) }
    }

    /// Copies between the local ranges `local` and the byte ranges
    /// `remote` of granted blocks, pairwise, as [`copy`](Self::copy) does
    /// blocks.
    ///
    /// # Safety
    ///
    /// As [`copy`](Self::copy)'s, for each local range.
    pub(super) unsafe fn copy_ranges(
        &self,
        dir: Dir,
        local: &[(*mut u8, usize)],
        remote: &[ferry_proto::grant::BlockRange],
    ) -> Result<(), CopyError> {
        let Some(opened) = self
            .opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return Err(CopyError::Grant(GrantError::Revoked));
        };
        let bs = self.block_size;
        // Each range inside its block and the granted bytes, each local
        // range as long: checked here again, as the copy's bounds rest on
        // it.
        let mut ranges = Vec::with_capacity(remote.len());
        for (r, l) in remote.iter().zip(local) {
            let at = u64::from(r.block.index).saturating_mul(bs);
            let end = r.offset.saturating_add(r.len);
            if end > bs || at.saturating_add(bs) > self.size || l.1 as u64 != r.len {
                return Err(CopyError::Grant(GrantError::LengthMismatch {
                    what: "bytes",
                    local: l.1 as u64,
                    remote: r.len,
                }));
            }
            ranges.push((opened.base() + self.offset + at + r.offset, r.len));
        }
        if local.len() != remote.len() {
            return Err(CopyError::Grant(GrantError::LengthMismatch {
                what: "block counts",
                local: local.len() as u64,
                remote: remote.len() as u64,
            }));
        }
        // SAFETY: the caller's contract; `ranges` checked above.
        unsafe { self.queue_all(&opened, dir, local, &ranges) }
    }

    /// Queues the copies of `local` and the device ranges `ranges` of
    /// `opened` (which the caller keeps mapped; checked by the caller:
    /// inside the granted bytes, equal lengths pairwise) on one stream,
    /// then waits for them.
    ///
    /// # Safety
    ///
    /// As [`copy`](Self::copy)'s.
    unsafe fn queue_all(
        &self,
        _opened: &Opened,
        dir: Dir,
        local: &[(*mut u8, usize)],
        ranges: &[(u64, u64)],
    ) -> Result<(), CopyError> {
        let (l, r) = copy::pair(local, ranges);
        let (stream, _ctx) = CopyStream::take(self.ordinal)?;
        let _cur = stream.enter()?;
        let mut queued = Ok(());
        for ((lp, n), (ra, _)) in l.into_iter().zip(r) {
            let la = lp as usize as u64;
            let (dst, src) = match dir {
                Dir::Read => (Dst::Device(la), ra),
                Dir::Write => (Dst::Device(ra), la),
            };
            // SAFETY: the stream's context is current (`enter`). The
            // granted range lies inside the allocation opened in this
            // context (checked at `open`: offset + granted bytes within the
            // mapping; each range checked by the caller), and `opened` keeps it
            // mapped past the sync below. The local range is device memory
            // of this device, valid and untouched by others until we
            // return (this function's contract). Lengths are equal pairwise
            // (`pair` merges only neighbours on both sides).
            queued = unsafe { stream.queue(dst, src, n) };
            if queued.is_err() {
                break;
            }
        }
        let synced = stream.sync();
        queued.and(synced).map_err(CopyError::Cuda)
    }
}

/// Why a copy of this lane failed.
#[derive(Debug)]
pub(super) enum CopyError {
    /// Refused before any copy.
    Grant(GrantError),
    /// The driver failed a copy (nothing, or part, moved).
    Cuda(CudaError),
}

impl From<CudaError> for CopyError {
    fn from(e: CudaError) -> CopyError {
        CopyError::Cuda(e)
    }
}

/// Whether `pool` could be granted by this lane (device memory).
pub(super) fn is_device(pool: &Pool) -> bool {
    !pool.device().is_cpu()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_hash_binds_the_handle() {
        let t = Token::from_bytes([1; 16]);
        let lane = CudaIpcGrant {
            handle: [2; 64],
            alloc_size: 1 << 20,
            offset: 0,
            device_uuid: [3; 16],
        };
        assert_eq!(page_hash(&t, None), super::super::token_hash(&t));
        let h = page_hash(&t, Some(&lane));
        assert_ne!(h, page_hash(&t, None));
        let mut other = lane;
        other.handle[63] ^= 1;
        assert_ne!(h, page_hash(&t, Some(&other)));
        let mut other = lane;
        other.offset = 4096;
        assert_ne!(h, page_hash(&t, Some(&other)));
    }

    /// Without the driver (no FERRY_CUDA_LIB here), a device pool is not
    /// granted, with a reason.
    #[test]
    fn no_driver_no_device_grant() {
        if crate::cuda::lends_device_memory() {
            println!("skipped: a CUDA driver is loaded (tests/grant_ipc.rs covers it)");
            return;
        }
        // SAFETY: never dereferenced: nothing exports without a driver.
        let pool = unsafe {
            Pool::from_raw_parts(
                0x7f00_0000_0000 as *mut u8,
                8192,
                4096,
                Device::cuda(0),
                true,
                (),
            )
        }
        .unwrap();
        assert!(is_device(&pool));
        match export(&pool) {
            Err(crate::Error::Grant(GrantError::NoLane(why))) => {
                assert!(why.contains("CUDA IPC"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
}
