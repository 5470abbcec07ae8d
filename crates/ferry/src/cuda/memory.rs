//! Owned CUDA memory: device buffers, pinned host buffers and streams, each
//! made in a device's primary context (`context`) and freed on drop.
//!
//! Written against the driver API's documentation without a GPU; verified
//! on one H100 on 2026-11-24 (the `cuda` unit tests and the GPU integration
//! tests, `docs/gpu.md`). What is tested everywhere is that every entry
//! point fails cleanly ([`CudaError::Unavailable`]) where there is no CUDA;
//! the tests that exercise the real driver run only where
//! [`available`](super::available) is true.

// Nothing outside the tests uses these until device memory reaches the
// transports (`docs/gpu.md`).
#![cfg_attr(not(test), allow(dead_code))]

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use super::context::PrimaryCtx;
use super::driver::{CuDevicePtr, CuStream, CU_MEMHOSTALLOC_PORTABLE, CU_STREAM_NON_BLOCKING};
use super::CudaError;

/// `len` bytes of memory on one GPU (`cuda:N`), allocated through the
/// device's primary context and freed on drop.
///
/// Verified on one H100 on 2026-11-24 (`docs/gpu.md`). Without CUDA
/// [`new`](Self::new) is `Err(CudaError::Unavailable(..))`.
pub(crate) struct DeviceBuffer {
    ctx: Arc<PrimaryCtx>,
    /// 0 for an empty buffer (nothing allocated).
    ptr: CuDevicePtr,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer(cuda:{}, {:#x}, {} bytes)",
            self.ctx.ordinal(),
            self.ptr,
            self.len
        )
    }
}

impl DeviceBuffer {
    /// Allocates `len` bytes (uninitialised) on `cuda:device`.
    pub(crate) fn new(device: u32, len: usize) -> Result<DeviceBuffer, CudaError> {
        let ctx = PrimaryCtx::retain(device)?;
        let mut ptr: CuDevicePtr = 0;
        if len > 0 {
            let _cur = ctx.make_current()?;
            // SAFETY: `ptr` is writable; the device's context is current.
            let r = unsafe { (ctx.drv.api.mem_alloc)(&mut ptr, len) };
            ctx.drv.check("cuMemAlloc_v2", r)?;
        }
        Ok(DeviceBuffer { ctx, ptr, len })
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The `N` of the `cuda:N` it lives on.
    pub(crate) fn device(&self) -> u32 {
        self.ctx.ordinal()
    }

    /// Its device address (0 when empty). Valid while `self` lives.
    pub(crate) fn as_device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Whether `len` bytes at `offset` lie inside the buffer.
    pub(crate) fn check_range(&self, offset: usize, len: usize) -> Result<(), CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(CudaError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copies `src` into the start of the buffer (synchronous).
    pub(crate) fn copy_from_host(&mut self, src: &[u8]) -> Result<(), CudaError> {
        self.check_range(0, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let _cur = self.ctx.make_current()?;
        // SAFETY: the destination range lies inside this allocation
        // (checked), the source is a live slice of that length, and the
        // synchronous copy has read all of it when it returns.
        let r = unsafe {
            (self.ctx.drv.api.memcpy_htod)(self.ptr, src.as_ptr().cast::<c_void>(), src.len())
        };
        self.ctx.drv.check("cuMemcpyHtoD_v2", r)
    }

    /// Copies the start of the buffer into `dst` (synchronous).
    pub(crate) fn copy_to_host(&self, dst: &mut [u8]) -> Result<(), CudaError> {
        self.check_range(0, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let _cur = self.ctx.make_current()?;
        // SAFETY: the source range lies inside this allocation (checked),
        // `dst` is a live, exclusively borrowed slice of that length, and
        // the synchronous copy has finished writing it when it returns.
        let r = unsafe {
            (self.ctx.drv.api.memcpy_dtoh)(dst.as_mut_ptr().cast::<c_void>(), self.ptr, dst.len())
        };
        self.ctx.drv.check("cuMemcpyDtoH_v2", r)
    }

    /// Copies all of `src` into the start of the buffer
    /// (`cuMemcpyDtoD_v2`, then a wait for the legacy stream it runs on:
    /// device-to-device copies do not wait on their own).
    pub(crate) fn copy_from_device(&mut self, src: &DeviceBuffer) -> Result<(), CudaError> {
        self.check_range(0, src.len())?;
        if src.len() == 0 {
            return Ok(());
        }
        let _cur = self.ctx.make_current()?;
        let api = &self.ctx.drv.api;
        // SAFETY: both ranges lie inside live allocations (`src` whole,
        // the destination checked above), distinct ones (`&mut self` and
        // `&src` cannot be the same buffer), and the wait below ends the
        // copy before either borrow does.
        let r = unsafe { (api.memcpy_dtod)(self.ptr, src.ptr, src.len()) };
        self.ctx.drv.check("cuMemcpyDtoD_v2", r)?;
        // SAFETY: the null stream is the context's legacy stream, on which
        // the copy above was queued.
        let r = unsafe { (api.stream_synchronize)(std::ptr::null_mut()) };
        self.ctx.drv.check("cuStreamSynchronize", r)
    }

    /// Whether the driver agrees that its address is device memory of its
    /// device (`cuPointerGetAttribute`): a self-check for a real GPU.
    pub(crate) fn verify_attributes(&self) -> Result<bool, CudaError> {
        if self.len == 0 {
            return Ok(true);
        }
        let api = &self.ctx.drv.api;
        let _cur = self.ctx.make_current()?;
        let (kind, ordinal) = super::pointer::attributes_here(self.ctx.drv, self.ptr)?;
        let mut base: CuDevicePtr = 0;
        let mut size: usize = 0;
        // SAFETY: both out pointers are writable; the address is live.
        let r = unsafe { (api.mem_get_address_range)(&mut base, &mut size, self.ptr) };
        self.ctx.drv.check("cuMemGetAddressRange_v2", r)?;
        Ok(kind == super::driver::CU_MEMORYTYPE_DEVICE
            && ordinal == self.ctx.ordinal() as c_int
            && base == self.ptr
            && size >= self.len)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let r = self.ctx.make_current().and_then(|_cur| {
            // SAFETY: `ptr` came from `cuMemAlloc_v2` and is freed once;
            // every copy into or out of it through this type was
            // synchronous, and the staging pipelines wait for their copies
            // before the borrow of the buffer they hold ends.
            let r = unsafe { (self.ctx.drv.api.mem_free)(self.ptr) };
            self.ctx.drv.check("cuMemFree_v2", r)
        });
        if let Err(e) = r {
            tracing::warn!("{self:?} not freed: {e}");
        }
    }
}

// SAFETY: the buffer is a device address owned by this value and a
// reference-counted context (itself `Send + Sync`); the driver API may be
// called from any thread once the context is current, which every method
// does first.
unsafe impl Send for DeviceBuffer {}
// SAFETY: `&DeviceBuffer` only reads device memory (`copy_to_host`);
// writes need `&mut`.
unsafe impl Sync for DeviceBuffer {}

/// Page-locked host memory from `cuMemHostAlloc` (portable), which the GPU
/// reads and writes by DMA: the staging buffers of the pipelines. Zeroed at
/// allocation; freed on drop.
pub(crate) struct PinnedBuf {
    ctx: Arc<PrimaryCtx>,
    ptr: NonNull<u8>,
    len: usize,
}

impl PinnedBuf {
    /// `len` zeroed bytes of pinned memory.
    pub(crate) fn new(ctx: &Arc<PrimaryCtx>, len: usize) -> Result<PinnedBuf, CudaError> {
        if len == 0 {
            return Ok(PinnedBuf {
                ctx: ctx.clone(),
                ptr: NonNull::dangling(),
                len,
            });
        }
        let _cur = ctx.make_current()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is writable; the context is current.
        let r = unsafe { (ctx.drv.api.mem_host_alloc)(&mut p, len, CU_MEMHOSTALLOC_PORTABLE) };
        ctx.drv.check("cuMemHostAlloc", r)?;
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(CudaError::Copy("cuMemHostAlloc returned null".into()));
        };
        // SAFETY: `len` writable bytes were just allocated at `ptr`;
        // zeroing them makes every later `&[u8]` over them initialised.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(PinnedBuf {
            ctx: ctx.clone(),
            ptr,
            len,
        })
    }
}

impl AsRef<[u8]> for PinnedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation) owned by
        // `self`; a dangling, aligned pointer for `len == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for PinnedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_ref`, borrowed exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let r = self.ctx.make_current().and_then(|_cur| {
            // SAFETY: allocated by `cuMemHostAlloc`, freed once; every copy
            // from or into it is synchronous and borrows it (as the bytes of
            // a `HostBuf` that the staging task owns until the copy has
            // returned), so none is running when it drops.
            let r = unsafe { (self.ctx.drv.api.mem_free_host)(self.ptr.as_ptr().cast()) };
            self.ctx.drv.check("cuMemFreeHost", r)
        });
        if let Err(e) = r {
            tracing::warn!("pinned buffer of {} bytes not freed: {e}", self.len);
        }
    }
}

// SAFETY: owned memory and a `Send + Sync` context, as `DeviceBuffer`.
unsafe impl Send for PinnedBuf {}
// SAFETY: `&PinnedBuf` only reads; writes need `&mut`.
unsafe impl Sync for PinnedBuf {}

/// A non-blocking stream of its own in one context: drained and destroyed
/// on drop (the staging engine's and the CUDA IPC puller's).
pub(crate) struct Stream {
    ctx: Arc<PrimaryCtx>,
    raw: CuStream,
}

impl Stream {
    /// A new stream in `ctx`.
    pub(crate) fn new(ctx: &Arc<PrimaryCtx>) -> Result<Stream, CudaError> {
        let _cur = ctx.make_current()?;
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: `raw` is writable; the context is current.
        let r = unsafe { (ctx.drv.api.stream_create)(&mut raw, CU_STREAM_NON_BLOCKING) };
        ctx.drv.check("cuStreamCreate", r)?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The context the stream belongs to.
    pub(crate) fn ctx(&self) -> &Arc<PrimaryCtx> {
        &self.ctx
    }

    /// The driver's handle, for calls that queue work on the stream; live
    /// as long as `self`.
    pub(crate) fn raw(&self) -> CuStream {
        self.raw
    }

    /// Waits until everything queued so far has finished (or failed).
    pub(crate) fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: a live stream of this context.
        let r = unsafe { (self.ctx.drv.api.stream_synchronize)(self.raw) };
        self.ctx.drv.check("cuStreamSynchronize", r)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let api = &self.ctx.drv.api;
        let r = self.ctx.make_current().and_then(|_cur| {
            // SAFETY: a live stream; its users wait for their own work
            // (each copy owns what it uses and is waited for), so this only
            // drains what is left.
            let r = unsafe { (api.stream_synchronize)(self.raw) };
            self.ctx.drv.check("cuStreamSynchronize", r)?;
            // SAFETY: created in `new`, destroyed once, now idle.
            let r = unsafe { (api.stream_destroy)(self.raw) };
            self.ctx.drv.check("cuStreamDestroy_v2", r)
        });
        if let Err(e) = r {
            tracing::warn!("cuda:{} stream not destroyed: {e}", self.ctx.ordinal());
        }
    }
}

// SAFETY: a stream handle of a retained context (kept alive by `ctx`); the
// driver API is thread safe, and a stream may be used from any thread once
// its context is current.
unsafe impl Send for Stream {}
// SAFETY: see `Send`; `&Stream` only hands the handle to the driver.
unsafe impl Sync for Stream {}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine with a GPU: a byte-for-byte round trip through device
    /// memory, and the driver's own view of the allocation. Skipped (passes
    /// at once) where there is no CUDA.
    #[test]
    fn device_buffer_round_trip_where_there_is_a_gpu() {
        if !super::super::available() {
            println!("skipped: needs a GPU: {:?}", crate::cuda::status());
            return;
        }
        let src: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut buf = DeviceBuffer::new(0, src.len()).unwrap();
        assert_eq!(buf.len(), src.len());
        assert_eq!(buf.device(), 0);
        assert_ne!(buf.as_device_ptr(), 0);
        assert!(buf.verify_attributes().unwrap());
        buf.copy_from_host(&src).unwrap();
        let mut back = vec![0u8; src.len()];
        buf.copy_to_host(&mut back).unwrap();
        assert!(back == src);
        let mut too_long = vec![0u8; src.len() + 1];
        assert!(matches!(
            buf.copy_to_host(&mut too_long),
            Err(CudaError::OutOfRange { .. })
        ));
        let empty = DeviceBuffer::new(0, 0).unwrap();
        assert_eq!(empty.as_device_ptr(), 0);
    }
}
