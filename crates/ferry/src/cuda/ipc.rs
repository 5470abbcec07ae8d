//! The driver calls of CUDA IPC: exporting the allocations under device
//! memory (`cuMemGetAddressRange`, `cuIpcGetMemHandle`), opening a peer's
//! handles (`cuIpcOpenMemHandle_v2`, closed on drop), and a copy stream
//! (`cuMemcpyDtoDAsync_v2` / `cuMemcpyDtoHAsync_v2`, `cuStreamSynchronize`).
//! The puller that uses them is `transport::pull::cuda_ipc`.
//!
//! Written from `cuda.h` and the driver API's documentation without a
//! GPU; verified on one H100 on 2026-11-24 (`tests/cuda_ipc.rs`: GPU to GPU
//! and GPU to host memory between two processes, 1 byte to 1 GiB). Not yet
//! run: two GPUs in one host (peer access). Without CUDA every entry point
//! is `CudaError::Unavailable`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use super::context::PrimaryCtx;
use super::driver::{CuDevicePtr, IpcMemHandle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS};
use super::CudaError;

/// An IPC handle's bytes (a `CUipcMemHandle`).
pub(crate) type Handle = [u8; 64];

fn to_handle(h: &IpcMemHandle) -> Handle {
    h.reserved.map(|c| c as u8)
}

fn from_handle(h: &Handle) -> IpcMemHandle {
    IpcMemHandle {
        reserved: h.map(|b| b as std::ffi::c_char),
    }
}

/// What a source exports of its device memory: each allocation (its handle
/// and size), and for each segment its allocation and offset in it
/// (`u32::MAX`, 0 for an empty segment, which lies in none).
pub(crate) struct Exported {
    pub(crate) allocs: Vec<(Handle, u64)>,
    pub(crate) at: Vec<(u32, u64)>,
}

/// Exports the segments `(device address, length)` of memory on
/// `cuda:ordinal`: one `cuIpcGetMemHandle` per distinct allocation (found
/// with `cuMemGetAddressRange`). A segment that does not lie inside one
/// allocation is `OutOfRange`.
pub(crate) fn export(ordinal: u32, segs: &[(u64, u64)]) -> Result<Exported, CudaError> {
    let ctx = PrimaryCtx::retain(ordinal)?;
    let _cur = ctx.make_current()?;
    let api = &ctx.drv.api;
    let mut allocs: Vec<(Handle, u64)> = Vec::new();
    let mut by_base: HashMap<CuDevicePtr, u32> = HashMap::new();
    let mut at = Vec::with_capacity(segs.len());
    // The allocation of the previous segment: (index, base, size).
    let mut last: Option<(u32, u64, u64)> = None;
    for &(addr, len) in segs {
        if len == 0 {
            at.push((u32::MAX, 0));
            continue;
        }
        let inside = |base: u64, size: u64| {
            addr >= base
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= base.saturating_add(size))
        };
        if let Some((idx, base, size)) = last.filter(|&(_, b, s)| inside(b, s)) {
            at.push((idx, addr - base));
            last = Some((idx, base, size));
            continue;
        }
        let (mut base, mut size): (CuDevicePtr, usize) = (0, 0);
        // SAFETY: both out pointers are writable; the context is current;
        // the driver only reads its own tables for `addr`.
        let r = unsafe { (api.mem_get_address_range)(&mut base, &mut size, addr) };
        ctx.drv.check("cuMemGetAddressRange_v2", r)?;
        let size = size as u64;
        if !inside(base, size) {
            return Err(CudaError::OutOfRange {
                offset: addr.saturating_sub(base) as usize,
                len: len as usize,
                size: size as usize,
            });
        }
        let idx = match by_base.get(&base) {
            Some(&i) => i,
            None => {
                let mut h = IpcMemHandle { reserved: [0; 64] };
                // SAFETY: `h` is writable; `base` is the start of a live
                // allocation of the current context's device (the driver
                // just said so).
                let r = unsafe { (api.ipc_get_mem_handle)(&mut h, base) };
                ctx.drv.check("cuIpcGetMemHandle", r)?;
                let i = u32::try_from(allocs.len()).unwrap_or(u32::MAX - 1);
                allocs.push((to_handle(&h), size));
                by_base.insert(base, i);
                i
            }
        };
        at.push((idx, addr - base));
        last = Some((idx, base, size));
    }
    Ok(Exported { allocs, at })
}

/// The UUID of each device this process sees, by ordinal (zeros where the
/// driver does not say), asked once.
fn uuids() -> &'static [[u8; 16]] {
    static SEEN: OnceLock<Vec<[u8; 16]>> = OnceLock::new();
    SEEN.get_or_init(|| {
        let Ok(d) = super::driver_or_unavailable() else {
            return Vec::new();
        };
        let n = d.device_count().unwrap_or(0);
        (0..n)
            .map(|i| d.device_uuid(i).unwrap_or_default())
            .collect()
    })
}

/// The UUID of `cuda:ordinal` (zeros where the driver does not say), for
/// a lease to name its device by.
pub(crate) fn device_uuid(ordinal: u32) -> [u8; 16] {
    uuids().get(ordinal as usize).copied().unwrap_or_default()
}

/// Which device of this process has the UUID `uuid`, if it sees it (none
/// for zeros, or a GPU hidden from this process).
pub(crate) fn ordinal_of(uuid: &[u8; 16]) -> Option<u32> {
    if *uuid == [0; 16] {
        return None;
    }
    uuids().iter().position(|u| u == uuid).map(|i| i as u32)
}

/// A peer's allocation opened in one context (`cuIpcOpenMemHandle_v2`),
/// closed (`cuIpcCloseMemHandle`) when dropped: whoever copies from it
/// holds an `Arc`, so it is never closed under a copy.
pub(crate) struct Opened {
    ctx: Arc<PrimaryCtx>,
    base: CuDevicePtr,
    /// How many bytes the driver mapped at `base` (what the source's
    /// lease may name, whatever size it claims).
    size: u64,
}

// SAFETY: a device address mapped in a primary context (a process-wide
// driver object, itself `Send + Sync`); the driver API is thread safe, and
// every call here makes the context current first.
unsafe impl Send for Opened {}
// SAFETY: see `Send`; `&Opened` only reads the address.
unsafe impl Sync for Opened {}

impl Opened {
    /// Opens `handle` in `ctx`, enabling peer access lazily where the
    /// memory lives on another device.
    pub(crate) fn open(ctx: &Arc<PrimaryCtx>, handle: &Handle) -> Result<Opened, CudaError> {
        let _cur = ctx.make_current()?;
        let mut base: CuDevicePtr = 0;
        // SAFETY: `base` is writable; the handle is passed by value (64
        // bytes, as `cuda.h` declares it); the driver validates it (a
        // handle of a freed allocation, or of this very process, is an
        // error, not undefined behaviour).
        let r = unsafe {
            (ctx.drv.api.ipc_open_mem_handle)(
                &mut base,
                from_handle(handle),
                CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
            )
        };
        ctx.drv.check("cuIpcOpenMemHandle_v2", r)?;
        let mut opened = Opened {
            ctx: ctx.clone(),
            base,
            size: 0,
        };
        // The mapping's real size: a lease that claims a larger allocation
        // is refused against it (a copy past the mapping would fault the
        // context, which the application shares). Closed by `drop` if this
        // fails.
        let (mut start, mut size): (CuDevicePtr, usize) = (0, 0);
        // SAFETY: both out pointers are writable; the context is current
        // (`make_current` above); the driver only reads its own tables.
        let r = unsafe { (ctx.drv.api.mem_get_address_range)(&mut start, &mut size, base) };
        ctx.drv.check("cuMemGetAddressRange_v2", r)?;
        if start != base {
            return Err(CudaError::OutOfRange {
                offset: base.saturating_sub(start) as usize,
                len: 0,
                size,
            });
        }
        opened.size = size as u64;
        Ok(opened)
    }

    /// How many bytes are mapped at [`base`](Self::base).
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Where the allocation is mapped in this process.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        let r = self.ctx.make_current().and_then(|_cur| {
            // SAFETY: opened once by `open`, closed once here; nobody
            // copies from it any more (copiers hold an `Arc` of `self`).
            let r = unsafe { (self.ctx.drv.api.ipc_close_mem_handle)(self.base) };
            self.ctx.drv.check("cuIpcCloseMemHandle", r)
        });
        if let Err(e) = r {
            tracing::warn!("a peer's CUDA allocation not closed: {e}");
        }
    }
}

/// Where a copy lands.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dst {
    /// Device memory of the stream's device.
    Device(u64),
    /// Host memory.
    Host(*mut u8),
}

/// A non-blocking stream of one device, for copies out of opened IPC
/// memory (taken from the device's idle streams, and given back after
/// its last wait, see [`pooled_stream`](super::stage::pooled_stream)).
pub(crate) struct CopyStream {
    stream: super::stage::PooledStream,
}

impl CopyStream {
    /// A stream of its own on `cuda:ordinal`, and the device's primary
    /// context, which the stream's copies run in.
    pub(crate) fn take(ordinal: u32) -> Result<(CopyStream, Arc<PrimaryCtx>), CudaError> {
        let stream = super::stage::pooled_stream(ordinal)?;
        let ctx = stream.stream().ctx().clone();
        Ok((CopyStream { stream }, ctx))
    }

    /// Makes the stream's context current on this thread (once per thread
    /// that queues copies).
    pub(crate) fn enter(&self) -> Result<crate::cuda::context::Current<'_>, CudaError> {
        self.stream.stream().ctx().make_current()
    }

    /// Queues a copy of `n` bytes from `src` to `dst`. It may still run
    /// when this returns: [`sync`](Self::sync) waits for it.
    ///
    /// # Safety
    ///
    /// The stream's context is current on this thread ([`enter`](Self::enter));
    /// `src..src + n` lies inside an allocation opened in that context
    /// (an [`Opened`] kept alive until `sync` returns); `dst` is valid for
    /// `n` bytes of writes (device memory of the context's device, or host
    /// memory), and nothing else accesses it until `sync` returns.
    pub(crate) unsafe fn queue(&self, dst: Dst, src: u64, n: usize) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let (ctx, stream) = (self.stream.stream().ctx(), self.stream.stream().raw());
        let api = &ctx.drv.api;
        let (r, call) = match dst {
            // SAFETY: the caller's contract: both ranges are valid for the
            // copy, in the current context, until the stream is synced.
            Dst::Device(d) => (
                unsafe { (api.memcpy_dtod_async)(d, src, n, stream) },
                "cuMemcpyDtoDAsync_v2",
            ),
            // SAFETY: as above, `dst` is host memory valid for `n` bytes.
            Dst::Host(p) => (
                unsafe { (api.memcpy_dtoh_async)(p.cast::<c_void>(), src, n, stream) },
                "cuMemcpyDtoHAsync_v2",
            ),
        };
        ctx.drv.check(call, r)
    }

    /// Waits until every copy queued so far has finished (or failed).
    pub(crate) fn sync(&self) -> Result<(), CudaError> {
        self.stream.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeros name no device; without the driver no UUID is known. With a
    /// GPU, each device's UUID leads back to it.
    #[test]
    fn a_device_is_found_by_its_uuid() {
        assert_eq!(ordinal_of(&[0; 16]), None);
        let Ok(d) = crate::cuda::driver_or_unavailable() else {
            assert_eq!(device_uuid(0), [0; 16], "nothing known without a driver");
            assert_eq!(ordinal_of(&[1; 16]), None);
            return;
        };
        for i in 0..d.device_count().unwrap_or(0) {
            let u = device_uuid(i);
            assert_ne!(u, [0; 16], "cuda:{i} has a UUID");
            assert_eq!(ordinal_of(&u), Some(i));
        }
    }
}
