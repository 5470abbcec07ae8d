//! The [`CopyEngine`]s: [`CudaEngine`], the driver's (pinned staging
//! buffers, one stream, asynchronous copies and events), and, for tests,
//! `HostEngine`, whose "device memory" is a host buffer copied on a worker
//! thread, with injected delays and failures.

// Nothing outside the tests uses these until staging is wired into the
// transports (`docs/gpu.md`).
#![cfg_attr(not(test), allow(dead_code))]

use std::ffi::c_void;
use std::sync::Arc;

use super::driver::{CuEvent, CUDA_ERROR_NOT_READY, CUDA_SUCCESS, CU_EVENT_DISABLE_TIMING};
use super::memory::{DeviceBuffer, PinnedBuf, PrimaryCtx, Stream};
use super::staging::CopyEngine;
use super::CudaError;

#[cfg(test)]
pub(crate) use host::{Faults, HostEngine, HostMem};

/// The driver as a [`CopyEngine`] for one device: staging buffers from
/// `cuMemHostAlloc`, copies with `cuMemcpy{DtoH,HtoD}Async_v2` on one
/// non-blocking stream (so they run in the order started), each followed by
/// an event that [`poll`](CopyEngine::poll) queries and
/// [`wait`](CopyEngine::wait) synchronises.
///
/// **Unverified on real hardware** (developed without a GPU; its test runs
/// only where CUDA is available).
pub(crate) struct CudaEngine {
    ctx: Arc<PrimaryCtx>,
    stream: Stream,
}

impl CudaEngine {
    /// An engine on `cuda:device`, with a stream of its own.
    pub(crate) fn new(device: u32) -> Result<CudaEngine, CudaError> {
        let ctx = PrimaryCtx::retain(device)?;
        let stream = Stream::new(&ctx)?;
        Ok(CudaEngine { ctx, stream })
    }

    /// Records an event after the work queued so far on the stream.
    fn record(&self) -> Result<CuEvent, CudaError> {
        let api = &self.ctx.drv.api;
        let mut ev: CuEvent = std::ptr::null_mut();
        // SAFETY: `ev` is writable; the context is current (callers).
        let r = unsafe { (api.event_create)(&mut ev, CU_EVENT_DISABLE_TIMING) };
        self.ctx.drv.check("cuEventCreate", r)?;
        // SAFETY: a live event and a live stream of the current context.
        let r = unsafe { (api.event_record)(ev, self.stream.raw()) };
        if let Err(e) = self.ctx.drv.check("cuEventRecord", r) {
            // SAFETY: the event was created above and is used nowhere else.
            unsafe { (api.event_destroy)(ev) };
            return Err(e);
        }
        Ok(ev)
    }

    /// Queues the copy `issue` describes, then its event; on an error after
    /// the copy may have been queued, waits for the stream so that no copy
    /// touches `staging` once it is given back.
    fn start(
        &self,
        mem: &DeviceBuffer,
        offset: usize,
        staging: PinnedBuf,
        len: usize,
        issue: impl FnOnce(&mut PinnedBuf, u64) -> i32,
        call: &'static str,
    ) -> Result<CudaPending, (PinnedBuf, CudaError)> {
        let mut staging = staging;
        let checks = mem
            .check_range(offset, len)
            .and_then(|()| {
                if staging.as_ref().len() < len {
                    Err(CudaError::OutOfRange {
                        offset: 0,
                        len,
                        size: staging.as_ref().len(),
                    })
                } else if mem.device() != self.ctx.ordinal() {
                    Err(CudaError::InvalidDevice(mem.device()))
                } else {
                    Ok(())
                }
            })
            .and_then(|()| self.ctx.make_current());
        // Current until the copy is queued and its event recorded.
        let _cur = match checks {
            Ok(cur) => cur,
            Err(e) => return Err((staging, e)),
        };
        if len > 0 {
            let r = issue(&mut staging, mem.as_device_ptr() + offset as u64);
            if let Err(e) = self.ctx.drv.check(call, r) {
                return Err((staging, e));
            }
        }
        match self.record() {
            Ok(event) => Ok(CudaPending {
                event: Event {
                    ctx: self.ctx.clone(),
                    event,
                    waited: false,
                },
                staging,
            }),
            Err(e) => {
                // Waits for the copy just queued.
                let _ = self.stream.sync();
                Err((staging, e))
            }
        }
    }
}

/// A copy queued on a [`CudaEngine`]'s stream: its event, and the staging
/// buffer it uses, given back by `wait`. Dropped without `wait`, it waits
/// for the event before the buffer is freed (fields drop in order).
pub(crate) struct CudaPending {
    event: Event,
    staging: PinnedBuf,
}

/// An event recorded after a copy; destroyed on drop, after waiting for
/// the copy unless that was done.
struct Event {
    ctx: Arc<PrimaryCtx>,
    event: CuEvent,
    waited: bool,
}

// SAFETY: an event handle is usable from any thread once its context is
// current, which every use makes it.
unsafe impl Send for Event {}

impl Event {
    fn synchronize(&mut self) -> Result<(), CudaError> {
        let _cur = self.ctx.make_current()?;
        // SAFETY: a live event, recorded after the copy.
        let r = unsafe { (self.ctx.drv.api.event_synchronize)(self.event) };
        // An error here is the copy's own (or an earlier one on the stream,
        // which poisons the context): either way the driver has stopped
        // using the staging buffer when the call returns.
        self.waited = true;
        self.ctx.drv.check("cuEventSynchronize", r)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if !self.waited {
            if let Err(e) = self.synchronize() {
                tracing::warn!("staging copy dropped: {e}");
            }
        }
        // SAFETY: created by `record`, destroyed once (the driver defers
        // the release of an event whose work is still pending).
        let r = unsafe { (self.ctx.drv.api.event_destroy)(self.event) };
        if let Err(e) = self.ctx.drv.check("cuEventDestroy_v2", r) {
            tracing::warn!("{e}");
        }
    }
}

impl CopyEngine for CudaEngine {
    type Mem = DeviceBuffer;
    type Staging = PinnedBuf;
    type Pending = CudaPending;

    fn mem_len(mem: &DeviceBuffer) -> usize {
        mem.len()
    }

    fn alloc_staging(&self, len: usize) -> Result<PinnedBuf, CudaError> {
        PinnedBuf::new(&self.ctx, len)
    }

    unsafe fn start_d2h(
        &self,
        mem: &DeviceBuffer,
        offset: usize,
        staging: PinnedBuf,
        len: usize,
    ) -> Result<CudaPending, (PinnedBuf, CudaError)> {
        let api = &self.ctx.drv.api;
        self.start(
            mem,
            offset,
            staging,
            len,
            |buf, src| {
                // SAFETY: `len` bytes of pinned memory owned by the pending
                // copy until it ends (checked length); the source range lies
                // inside `mem` (checked), which the caller keeps allocated
                // until the copy ends (this function's contract).
                unsafe {
                    (api.memcpy_dtoh_async)(
                        buf.as_mut_ptr().cast::<c_void>(),
                        src,
                        len,
                        self.stream.raw(),
                    )
                }
            },
            "cuMemcpyDtoHAsync_v2",
        )
    }

    unsafe fn start_h2d(
        &self,
        staging: PinnedBuf,
        len: usize,
        mem: &DeviceBuffer,
        offset: usize,
    ) -> Result<CudaPending, (PinnedBuf, CudaError)> {
        let api = &self.ctx.drv.api;
        self.start(
            mem,
            offset,
            staging,
            len,
            |buf, dst| {
                // SAFETY: as in `start_d2h`, the other way round: the
                // pinned source stays owned by the pending copy, and the
                // caller keeps the destination range allocated and
                // untouched until the copy ends.
                unsafe {
                    (api.memcpy_htod_async)(
                        dst,
                        buf.as_mut_ptr().cast::<c_void>().cast_const(),
                        len,
                        self.stream.raw(),
                    )
                }
            },
            "cuMemcpyHtoDAsync_v2",
        )
    }

    fn poll(&self, pending: &mut CudaPending) -> Result<bool, CudaError> {
        let ev = &pending.event;
        let _cur = ev.ctx.make_current()?;
        // SAFETY: a live event recorded after the copy.
        let r = unsafe { (ev.ctx.drv.api.event_query)(ev.event) };
        match r {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            _ => ev.ctx.drv.check("cuEventQuery", r).map(|()| true),
        }
    }

    fn wait(&self, pending: CudaPending) -> (PinnedBuf, Result<(), CudaError>) {
        let CudaPending { mut event, staging } = pending;
        let r = event.synchronize();
        (staging, r)
    }
}

#[cfg(test)]
mod host;
