//! Device memory in band: synchronous copies between host bytes and device
//! addresses, for the transports that carry bytes through the host (TCP
//! frames, the copy within one process) where no direct path reaches the
//! memory (another host, no cross-memory attach, host memory into GPU
//! memory).
//!
//! The transports call [`to_device`] and [`from_device`] inside
//! `Region::device_span`, under the region's lock, and each returns only
//! once its copy has finished on the device (the copy is queued on a stream
//! of its own and the stream synchronized): once `Region::close` has
//! returned, no staged byte lands any more. That is the same fence the
//! region keeps for host memory. The TCP transport overlaps these copies
//! with the socket by running them on blocking threads, one buffer ahead
//! (`transport/tcp/staged.rs`), from and into [`HostBuf`]s: pinned memory
//! where the driver is here, which its copy engine reaches directly.
//!
//! `simulate_with_host_memory` (tests of processes without a GPU) makes
//! "device memory" host memory copied with `memcpy`, so that the staged
//! paths run end to end everywhere.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::context::primary_ctx;
use super::context::{simulated, PrimaryCtx};
use super::memory::{PinnedBuf, Stream};
use super::CudaError;

/// The simulated device range whose copies fail, if any
/// ([`simulate_copy_failure`]).
static FAILING: Mutex<Option<std::ops::Range<u64>>> = Mutex::new(None);

/// In a process that simulates a GPU ([`simulate_with_host_memory`](super::simulate_with_host_memory)),
/// makes every staged copy that touches `range` (device addresses) fail
/// as the driver's would (`CudaError::Copy`), or none with `None`: for
/// tests of how a failed device copy ends an operation. Without the
/// simulation it has no effect.
#[doc(hidden)]
pub fn simulate_copy_failure(range: Option<std::ops::Range<u64>>) {
    *FAILING.lock().unwrap_or_else(|p| p.into_inner()) = range;
}

/// `Err` if a simulated copy of `pieces` must fail.
fn simulated_failure(pieces: &[(u64, usize)]) -> Result<(), CudaError> {
    let failing = FAILING.lock().unwrap_or_else(|p| p.into_inner());
    let Some(r) = failing.as_ref() else {
        return Ok(());
    };
    let hit = pieces
        .iter()
        .any(|&(a, n)| n > 0 && a < r.end && a.saturating_add(n as u64) > r.start);
    if hit {
        return Err(CudaError::Copy(
            "simulated failure of a device copy (simulate_copy_failure)".into(),
        ));
    }
    Ok(())
}

/// How many streams of one device wait idle for the next copy, at most
/// (more are made while more copies run at once, and destroyed after).
const IDLE_STREAMS: usize = 8;

/// The device copies of one device: its primary context, and streams that
/// wait idle. Each copy takes a stream of its own ([`pooled_stream`]), so
/// that the copies of concurrent operations (a striped transfer's parts,
/// several connections, CUDA IPC pulls) run side by side on the device's
/// copy engines rather than one at a time, without a stream made and
/// destroyed per copy.
struct Staging {
    ctx: Arc<PrimaryCtx>,
    idle: Mutex<Vec<Stream>>,
}

/// The device copies of `cuda:device`, set up on first use and kept for
/// the process.
fn staging(device: u32) -> Result<Arc<Staging>, CudaError> {
    static ALL: OnceLock<Mutex<HashMap<u32, Arc<Staging>>>> = OnceLock::new();
    let all = ALL.get_or_init(Default::default);
    let mut map = all.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = map.get(&device) {
        return Ok(s.clone());
    }
    let ctx = primary_ctx(device)?;
    let s = Arc::new(Staging {
        ctx,
        idle: Mutex::new(Vec::new()),
    });
    map.insert(device, s.clone());
    Ok(s)
}

/// A stream of one device for the copies of one caller, back among the
/// idle ones when dropped, unless a wait on it failed (then destroyed: a
/// stream the driver failed is not handed to the next copy).
pub(crate) struct PooledStream {
    from: Arc<Staging>,
    stream: Option<Stream>,
    failed: AtomicBool,
}

/// An idle stream of `cuda:device`, or a new one.
pub(crate) fn pooled_stream(device: u32) -> Result<PooledStream, CudaError> {
    let from = staging(device)?;
    let idle = from.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let stream = match idle {
        Some(s) => s,
        None => Stream::new(&from.ctx)?,
    };
    Ok(PooledStream {
        from,
        stream: Some(stream),
        failed: AtomicBool::new(false),
    })
}

impl PooledStream {
    /// The stream (present until drop).
    pub(crate) fn stream(&self) -> &Stream {
        self.stream.as_ref().expect("present until drop")
    }

    /// Waits for everything queued on the stream; a failure keeps the
    /// stream from being used again.
    pub(crate) fn sync(&self) -> Result<(), CudaError> {
        let r = self.stream().sync();
        if r.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        r
    }
}

impl Drop for PooledStream {
    fn drop(&mut self) {
        let Some(s) = self.stream.take() else { return };
        if self.failed.load(Ordering::Acquire) {
            return;
        }
        let mut idle = self.from.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_STREAMS {
            idle.push(s);
        }
    }
}

/// A host buffer for bytes on their way to or from device memory: pinned
/// (`cuMemHostAlloc`) where the driver is here, so that the device copies
/// it without a bounce through the driver's own buffers; plain memory in a
/// simulated process, or where pinning failed.
pub(crate) enum HostBuf {
    Plain(Vec<u8>),
    Pinned(PinnedBuf),
}

impl HostBuf {
    /// `len` zeroed bytes, pinned for `cuda:device` where that works.
    pub(crate) fn new(device: u32, len: usize) -> HostBuf {
        if !simulated() {
            match staging(device).and_then(|s| PinnedBuf::new(&s.ctx, len)) {
                Ok(p) => return HostBuf::Pinned(p),
                Err(e) => tracing::debug!("staging through unpinned memory: {e}"),
            }
        }
        HostBuf::Plain(vec![0; len])
    }

    /// Whether the copy engine reaches it directly.
    #[cfg(test)]
    fn is_pinned(&self) -> bool {
        matches!(self, HostBuf::Pinned(_))
    }
}

impl Deref for HostBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            HostBuf::Plain(v) => v,
            HostBuf::Pinned(p) => p.as_ref(),
        }
    }
}

impl DerefMut for HostBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            HostBuf::Plain(v) => v,
            HostBuf::Pinned(p) => p.as_mut(),
        }
    }
}

/// Runs `issue` for each `(device address, length, offset into the host
/// bytes)` on a stream of `device` of its own, then waits for it: on
/// return (also after an error) no copy queued here runs any more.
fn on_stream(
    device: u32,
    pieces: &[(u64, usize)],
    call: &'static str,
    issue: impl Fn(u64, usize, usize, &Stream) -> i32,
) -> Result<(), CudaError> {
    let stream = pooled_stream(device)?;
    let ctx = stream.stream().ctx().clone();
    let _cur = ctx.make_current()?;
    let mut at = 0;
    let mut queued = Ok(());
    for &(addr, len) in pieces {
        if len > 0 {
            queued = ctx.drv.check(call, issue(addr, len, at, stream.stream()));
            if queued.is_err() {
                break;
            }
        }
        at += len;
    }
    // Waited for even after a failure to queue: copies queued before it may
    // still be running.
    let synced = stream.sync();
    queued.and(synced)
}

/// Total length of `pieces`, checked against the host bytes' `len`.
fn check_len(pieces: &[(u64, usize)], len: usize) -> Result<(), CudaError> {
    let total = pieces.iter().map(|p| p.1).sum::<usize>();
    if total != len {
        return Err(CudaError::OutOfRange {
            offset: 0,
            len: total,
            size: len,
        });
    }
    Ok(())
}

/// Copies `src` into the device memory `dst` (device addresses and
/// lengths, laid end to end: their lengths add up to `src.len()`) of
/// `cuda:device`, and returns once the bytes are on the device.
///
/// # Safety
///
/// Each `(address, length)` of `dst` must be device memory of `cuda:device`
/// (host memory where [`simulate_with_host_memory`](super::simulate_with_host_memory) was called) valid for
/// writes of that length, which nothing else accesses until this returns.
pub(crate) unsafe fn to_device(
    device: u32,
    dst: &[(u64, usize)],
    src: &[u8],
) -> Result<(), CudaError> {
    check_len(dst, src.len())?;
    if simulated() {
        simulated_failure(dst)?;
        let mut at = 0;
        for &(addr, len) in dst {
            // SAFETY: in a simulated process device addresses are host
            // memory (`simulate_with_host_memory`'s contract), valid for
            // `len` bytes of writes and unaliased (this function's); `src`
            // holds `at + len` bytes (checked by `check_len`).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(at), addr as *mut u8, len) };
            at += len;
        }
        return Ok(());
    }
    on_stream(
        device,
        dst,
        "cuMemcpyHtoDAsync_v2",
        |addr, len, at, stream| {
            // SAFETY: `addr..addr + len` is device memory of this device
            // (the caller's contract); `src[at..at + len]` is in bounds
            // (`check_len`) and outlives the copy, which `on_stream` waits
            // for before returning.
            unsafe {
                (stream.ctx().drv.api.memcpy_htod_async)(
                    addr,
                    src.as_ptr().add(at).cast::<c_void>(),
                    len,
                    stream.raw(),
                )
            }
        },
    )
}

/// Copies the device memory `src` (laid end to end) of `cuda:device` into
/// `dst`, and returns once the bytes are there.
///
/// # Safety
///
/// Each `(address, length)` of `src` must be device memory of `cuda:device`
/// (host memory where [`simulate_with_host_memory`](super::simulate_with_host_memory) was called) valid for
/// reads of that length until this returns, and written by nothing
/// meanwhile.
pub(crate) unsafe fn from_device(
    device: u32,
    src: &[(u64, usize)],
    dst: &mut [u8],
) -> Result<(), CudaError> {
    check_len(src, dst.len())?;
    if simulated() {
        simulated_failure(src)?;
        let mut at = 0;
        for &(addr, len) in src {
            // SAFETY: as in `to_device`, the other way round: host memory
            // valid for reads of `len` bytes (the contracts), into `dst`'s
            // bounds (`check_len`); `dst` is a unique borrow, so the two
            // do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr().add(at), len)
            };
            at += len;
        }
        return Ok(());
    }
    let out = dst.as_mut_ptr();
    on_stream(
        device,
        src,
        "cuMemcpyDtoHAsync_v2",
        |addr, len, at, stream| {
            // SAFETY: as in `to_device`, the other way round: `dst` is
            // borrowed mutably until `on_stream` has waited for the copy.
            unsafe {
                (stream.ctx().drv.api.memcpy_dtoh_async)(
                    out.add(at).cast::<c_void>(),
                    addr,
                    len,
                    stream.raw(),
                )
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_that_do_not_add_up_are_refused_before_any_copy() {
        // Null addresses: a copy would crash, so reaching one fails the test.
        let pieces = [(0u64, 4usize), (0, 4)];
        // SAFETY: refused before any address is used.
        let e = unsafe { to_device(0, &pieces, &[0u8; 7]) }.unwrap_err();
        assert!(
            matches!(
                e,
                CudaError::OutOfRange {
                    len: 8,
                    size: 7,
                    ..
                }
            ),
            "{e}"
        );
        let mut dst = [0u8; 9];
        // SAFETY: as above.
        let e = unsafe { from_device(0, &pieces, &mut dst) }.unwrap_err();
        assert!(
            matches!(
                e,
                CudaError::OutOfRange {
                    len: 8,
                    size: 9,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_host_buffer_is_pinned_where_the_driver_is() {
        let b = HostBuf::new(0, 4096);
        assert_eq!(b.len(), 4096);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(b.is_pinned(), super::super::lends_device_memory());
    }

    #[test]
    fn without_cuda_a_copy_says_why() {
        if simulated() || super::super::driver().is_ok() {
            return println!("skipped: CUDA (or its simulation) is here");
        }
        let mut dst = [0u8; 4];
        // SAFETY: no driver: refused before any address is used.
        let e = unsafe { from_device(0, &[(0x1000, 4)], &mut dst) }.unwrap_err();
        assert!(matches!(e, CudaError::Unavailable(_)), "{e}");
    }
}
