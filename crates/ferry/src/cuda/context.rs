//! The context device memory is reached through: each device's primary
//! context, retained once for the process and entered around every driver
//! call on whichever thread makes it, or none at all in a process that
//! simulates a GPU with host memory ([`simulate_with_host_memory`]).
//!
//! Owned memory (`memory`), the pointer checks (`pointer`), the staged
//! copies (`stage`), CUDA IPC (`ipc`) and UCX's CUDA transports all enter
//! a context through here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::driver::{CuContext, CuDevice};
use super::{driver_or_unavailable, CudaError, Driver};

/// Set once by [`simulate_with_host_memory`]; never cleared.
static SIMULATED: AtomicBool = AtomicBool::new(false);

/// Makes this process treat device memory as host memory: every "device"
/// address Ferry is given is copied with `memcpy`, CUDA is reported
/// available ([`available`](super::available)), the driver is never used
/// (every call that needs a context fails, so `CudaBuffer::new` is
/// `Unavailable`), and this side does not offer CUDA IPC, so device
/// memory never moves by it (unless a test also calls
/// `simulate_cuda_ipc_offer(true)`, whose exports then fail). For tests of the staged paths on machines without a GPU;
/// never in a program that has real device memory.
///
/// # Safety
///
/// Every device descriptor that exists when this is called, or is made
/// afterwards for the rest of the process
/// ([`Descriptor::from_cuda_ptr`], a `CudaBuffer` made before), must
/// describe host memory that satisfies `from_cuda_ptr`'s contract as if it
/// were device memory: valid for reads (and writes, if writable) of its
/// size for the descriptor's life, and used by nothing else meanwhile.
/// Real device addresses would be dereferenced on the host.
///
/// [`Descriptor::from_cuda_ptr`]: crate::Descriptor::from_cuda_ptr
#[doc(hidden)]
pub unsafe fn simulate_with_host_memory() {
    SIMULATED.store(true, Ordering::Release);
}

/// Whether [`simulate_with_host_memory`] was called in this process.
pub(crate) fn simulated() -> bool {
    SIMULATED.load(Ordering::Acquire)
}

/// A retained primary context of one device, released on drop. Every call
/// that needs a context makes this one current on its thread first
/// ([`make_current`](Self::make_current)), so any thread may use it.
pub(crate) struct PrimaryCtx {
    pub(crate) drv: &'static Driver,
    dev: CuDevice,
    ordinal: u32,
    ctx: CuContext,
}

// SAFETY: a primary context is a process-wide driver object; the driver
// API is thread safe and a context may be made current on any thread
// (`cuCtxSetCurrent`), which every use here does first.
unsafe impl Send for PrimaryCtx {}
// SAFETY: see `Send`; `&PrimaryCtx` only reads the handle.
unsafe impl Sync for PrimaryCtx {}

impl PrimaryCtx {
    /// Retains the primary context of `cuda:ordinal`.
    pub(crate) fn retain(ordinal: u32) -> Result<Arc<PrimaryCtx>, CudaError> {
        if simulated() {
            // Every driver use goes through a context: none in a process
            // whose "device memory" is host memory, so no real device
            // memory is made there (`CudaBuffer::new` fails) and nothing
            // hands a host address to the driver.
            return Err(CudaError::Unavailable(
                "this process simulates a GPU with host memory: the CUDA driver is not used".into(),
            ));
        }
        let drv = driver_or_unavailable()?;
        let n = drv.device_count()?;
        if n == 0 {
            return Err(CudaError::Unavailable(
                "the CUDA driver sees no device".into(),
            ));
        }
        let dev = drv.device(ordinal)?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: `ctx` is writable; `dev` came from `cuDeviceGet`.
        let r = unsafe { (drv.api.primary_ctx_retain)(&mut ctx, dev) };
        drv.check("cuDevicePrimaryCtxRetain", r)?;
        Ok(Arc::new(PrimaryCtx {
            drv,
            dev,
            ordinal,
            ctx,
        }))
    }

    /// Makes this context current on the calling thread until the guard
    /// drops, which restores the context that was current before: Ferry's
    /// calls may run on a caller's thread (an active WRITE lends from the
    /// thread that called `begin_write`), whose framework (PyTorch's
    /// current device) must find its own context afterwards.
    pub(crate) fn make_current(&self) -> Result<Current<'_>, CudaError> {
        let mut prev: CuContext = std::ptr::null_mut();
        // SAFETY: `prev` is writable; the call only reads this thread's
        // context stack.
        let r = unsafe { (self.drv.api.ctx_get_current)(&mut prev) };
        self.drv.check("cuCtxGetCurrent", r)?;
        if prev != self.ctx {
            // SAFETY: the context is retained (alive) until `self` drops,
            // which the guard's borrow outlives.
            let r = unsafe { (self.drv.api.ctx_set_current)(self.ctx) };
            self.drv.check("cuCtxSetCurrent", r)?;
        }
        Ok(Current {
            drv: self.drv,
            prev: (prev != self.ctx).then_some(prev),
            _ctx: std::marker::PhantomData,
        })
    }

    /// The `N` of `cuda:N`.
    pub(crate) fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

/// This thread's current context while a [`PrimaryCtx`] is entered; the one
/// before is current again when this drops.
#[must_use = "the context is current only while the guard lives"]
pub(crate) struct Current<'a> {
    drv: &'static Driver,
    /// The context to restore (possibly none: null), if it was changed.
    prev: Option<CuContext>,
    _ctx: std::marker::PhantomData<&'a PrimaryCtx>,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            // SAFETY: `prev` was current on this thread when the guard was
            // made (or null: none); a context a caller made current stays
            // alive while it is current, as the driver requires of it.
            let r = unsafe { (self.drv.api.ctx_set_current)(prev) };
            if let Err(e) = self.drv.check("cuCtxSetCurrent", r) {
                tracing::warn!("the caller's CUDA context not restored: {e}");
            }
        }
    }
}

impl Drop for PrimaryCtx {
    fn drop(&mut self) {
        // SAFETY: releases the one reference `retain` took.
        let r = unsafe { (self.drv.api.primary_ctx_release)(self.dev) };
        if let Err(e) = self.drv.check("cuDevicePrimaryCtxRelease_v2", r) {
            tracing::warn!("cuda:{}: {e}", self.ordinal);
        }
    }
}

/// Runs `f` with `cuda:device`'s primary context current on this thread,
/// the context that was current before restored afterwards: for a library
/// that calls CUDA on Ferry's threads and expects a context there (UCX's
/// CUDA transports, when they register, get and progress device memory).
/// Where none can be entered (no driver, a simulated GPU), `f` runs as it
/// is, and the library reports what it misses.
pub(crate) fn on_device<R>(device: u32, f: impl FnOnce() -> R) -> R {
    if simulated() {
        return f();
    }
    let ctx = match primary_ctx(device) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("cuda:{device}: no context to enter: {e}");
            return f();
        }
    };
    in_ctx(&ctx, f)
}

/// Runs `f` with `ctx` current on this thread, the context before current
/// again afterwards (`f` runs as it is where `ctx` cannot be entered).
fn in_ctx<R>(ctx: &PrimaryCtx, f: impl FnOnce() -> R) -> R {
    let _current = ctx
        .make_current()
        .map_err(|e| tracing::debug!("cuda:{}: context not entered: {e}", ctx.ordinal()))
        .ok();
    f()
}

/// Whether some CUDA context is current on this thread.
fn has_current(drv: &Driver) -> bool {
    let mut current: CuContext = std::ptr::null_mut();
    // SAFETY: `current` is writable; the call only reads this thread's
    // context stack.
    let r = unsafe { (drv.api.ctx_get_current)(&mut current) };
    drv.check("cuCtxGetCurrent", r).is_ok() && !current.is_null()
}

/// Runs `f` with a CUDA context current on this thread: the one current
/// already, if any (a pull's, entered with [`on_device`]), else
/// `cuda:0`'s primary context ([`on_device`]). For work that is not tied
/// to one device's memory, such as progressing a UCX worker.
pub(crate) fn on_any_device<R>(f: impl FnOnce() -> R) -> R {
    if simulated() {
        return f();
    }
    match driver_or_unavailable() {
        Ok(drv) if !has_current(drv) => on_device(0, f),
        _ => f(),
    }
}

/// [`on_any_device`] with `ctx` as the context entered where none is
/// current: for a caller that keeps one (a UCX worker's progress, which
/// runs at every wake-up), without the lookup of [`on_device`].
pub(crate) fn on_any_device_with<R>(ctx: &PrimaryCtx, f: impl FnOnce() -> R) -> R {
    if has_current(ctx.drv) {
        f()
    } else {
        in_ctx(ctx, f)
    }
}

/// The primary context of `cuda:device`, retained once for the process.
pub(crate) fn primary_ctx(device: u32) -> Result<Arc<PrimaryCtx>, CudaError> {
    static ALL: OnceLock<Mutex<HashMap<u32, Arc<PrimaryCtx>>>> = OnceLock::new();
    let all = ALL.get_or_init(Default::default);
    let mut map = all.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = map.get(&device) {
        return Ok(c.clone());
    }
    let ctx = PrimaryCtx::retain(device)?;
    map.insert(device, ctx.clone());
    Ok(ctx)
}
