//! CUDA, loaded at run time: GPU memory support.
//!
//! Device memory is described with
//! [`Descriptor::from_cuda_ptr`](crate::Descriptor::from_cuda_ptr) (or a
//! [`CudaBuffer`] of one's own) and moves by CUDA IPC between two processes
//! of one host (GPU to GPU, GPU to host) where cross-memory attach was set
//! up, and in band everywhere else, each side staging its own GPU memory
//! through host memory (`stage`). Where this host has no CUDA, an operation
//! over it is refused with
//! [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) ([`status`]
//! says why); host and GPU memory mixed in one operation with
//! [`Error::NoDeviceTransport`](crate::Error::NoDeviceTransport). Here:
//! the driver API loaded from `libcuda` when present (no CUDA toolkit
//! needed to build, nothing fatal when it is missing), [`status`] and
//! [`available`] to say what was found, owned device memory, the IPC calls
//! (`ipc`), the staged copies (`stage`) and what an operation may mix
//! (`policy`). `docs/gpu.md` says what exists, what is verified and what
//! is not.
//!
//! The library is looked for, in order, at the path in `FERRY_CUDA_LIB`
//! ([`LIB_ENV`]) alone where it is set, else as `libcuda.so.1` then
//! `libcuda.so` through the dynamic loader.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use ferry_proto::{Device, DeviceKind};

mod buffer;
mod driver;
pub(crate) mod ipc;
mod memory;
mod pointer;
pub(crate) mod policy;
pub(crate) mod stage;

pub use buffer::CudaBuffer;
pub(crate) use driver::Driver;
pub(crate) use memory::{DeviceBuffer, PrimaryCtx};
pub use pointer::device_of;
pub(crate) use pointer::pointer_mismatch;
#[doc(hidden)]
pub use stage::{simulate_copy_failure, simulate_with_host_memory};

/// The environment variable that names the `libcuda` to load (a path).
pub const LIB_ENV: &str = driver::LIB_ENV;

/// Why a CUDA call could not be made or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA here: no `libcuda`, one that failed to initialise, or no
    /// device. The text says which, and what to install or set.
    #[error("CUDA unavailable: {0}")]
    Unavailable(String),
    /// A driver call returned an error.
    #[error("{call} failed: {name} ({code})")]
    Driver {
        /// The driver function (`cuMemAlloc_v2`).
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
        /// The driver's name for it (`CUDA_ERROR_OUT_OF_MEMORY`).
        name: String,
    },
    /// There is no `cuda:N` with this `N` here.
    #[error("no CUDA device cuda:{0} here")]
    InvalidDevice(u32),
    /// A byte range outside the memory it names.
    #[error("{len} bytes at offset {offset} do not fit in {size} bytes")]
    OutOfRange {
        /// Where the range starts.
        offset: usize,
        /// Its length.
        len: usize,
        /// The size of the memory.
        size: usize,
    },
    /// An address the driver does not take for device memory.
    #[error("not GPU memory: {0}")]
    NotDeviceMemory(String),
    /// A copy engine other than the driver failed (the host stand-in of
    /// the tests, or a copy refused after an earlier failure).
    #[error("copy failed: {0}")]
    Copy(String),
}

/// The process's CUDA driver, or why there is none. Loaded once, with
/// `cuInit(0)`, on first use.
pub(crate) fn driver() -> Result<&'static Driver, &'static str> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let lib = crate::config::process().cuda_lib.value.clone();
            let r = Driver::load_first(&driver::candidates(lib));
            match &r {
                Ok(d) => tracing::debug!("CUDA driver loaded: {}", d.path.display()),
                Err(why) => tracing::debug!("CUDA absent: {why}"),
            }
            r
        })
        .as_ref()
        .map_err(|s| s.as_str())
}

/// The process's driver as a [`CudaError`] where there is none.
pub(crate) fn driver_or_unavailable() -> Result<&'static Driver, CudaError> {
    driver().map_err(|why| CudaError::Unavailable(why.to_string()))
}

/// Whether CUDA is usable here: the driver loaded, `cuInit` succeeded, and
/// it sees at least one device ([`status`] says which, or why not).
///
/// This is what [`Connector::is_cuda_available`](crate::Connector::is_cuda_available)
/// answers: with CUDA, connectors move GPU memory (by CUDA IPC between
/// processes of one host, staged through host memory elsewhere). Also true
/// in a process that simulates a GPU (`simulate_with_host_memory`). Tests
/// that need a GPU skip where this is false.
pub fn available() -> bool {
    stage::simulated() || driver_sees_a_device()
}

/// Whether the CUDA driver itself is here and sees a device (what
/// [`available`] says, less a simulation).
/// Asked of the driver once: the answer is read on hot paths (every frame
/// of a staged transfer asks whether its memory moves in band).
fn driver_sees_a_device() -> bool {
    static SEES: OnceLock<bool> = OnceLock::new();
    *SEES.get_or_init(|| {
        driver()
            .ok()
            .and_then(|d| d.device_count().ok())
            .is_some_and(|n| n > 0)
    })
}

/// Whether this process may lend its device memory by CUDA IPC, and open
/// what a peer lends: the driver is here (not a simulation, whose "device
/// memory" is host memory that only the staged paths move).
pub(crate) fn lends_device_memory() -> bool {
    !stage::simulated() && driver_sees_a_device()
}

/// Set by [`simulate_ucx_cuda`].
static SIMULATE_UCX_CUDA: AtomicBool = AtomicBool::new(false);

/// In a process that simulates a GPU
/// ([`simulate_with_host_memory`]), makes it say that its UCX moves CUDA
/// memory (`true`), so that its "device memory" (host memory) is lent and
/// pulled through UCX like host memory: for tests of how device memory
/// takes the UCX path, on machines without a GPU. Without the
/// simulation it has no effect.
#[doc(hidden)]
pub fn simulate_ucx_cuda(on: bool) {
    SIMULATE_UCX_CUDA.store(on, Ordering::Release);
}

/// Whether [`simulate_ucx_cuda`] holds in a simulating process.
pub(crate) fn simulates_ucx_cuda() -> bool {
    stage::simulated() && SIMULATE_UCX_CUDA.load(Ordering::Acquire)
}

/// Set by [`simulate_cuda_ipc_offer`].
static IPC_OFFER_SIMULATED: AtomicBool = AtomicBool::new(false);

/// In a process that simulates a GPU (`simulate_with_host_memory`), makes
/// the connections it sets up from now on offer CUDA IPC in the attach
/// exchange (`offer`), as a process with a CUDA driver does, or not (the
/// default). Exporting and opening handles still needs the driver, so
/// every lend of its GPU memory by CUDA IPC then fails: for tests of what
/// a failed export falls back to. Without the simulation it has no effect.
#[doc(hidden)]
pub fn simulate_cuda_ipc_offer(offer: bool) {
    IPC_OFFER_SIMULATED.store(offer, Ordering::Release);
}

/// Whether this process offers CUDA IPC to its peers (the attach
/// exchange's `cuda_ipc`): it [lends device memory](lends_device_memory),
/// or a test made it pretend to ([`simulate_cuda_ipc_offer`]).
pub(crate) fn offers_cuda_ipc() -> bool {
    lends_device_memory() || (stage::simulated() && IPC_OFFER_SIMULATED.load(Ordering::Acquire))
}

/// Why a connector refuses descriptor `index`, on `device` (not host
/// memory): no CUDA on this host (with what [`status`] says). `None` where
/// CUDA is available: device memory then moves (by CUDA IPC or staged),
/// and [`policy`] checks that the operation does not mix memories.
pub(crate) fn refusal(index: usize, device: Device) -> Option<crate::Error> {
    if device.kind() != DeviceKind::Cuda {
        return Some(crate::Error::UnsupportedDevice { index, device });
    }
    if !available() {
        let reason = status()
            .err()
            .unwrap_or_else(|| "the CUDA driver sees no device".into());
        return Some(crate::Error::CudaUnavailable {
            index,
            device,
            reason,
        });
    }
    None
}

/// The CUDA driver this process loaded (library, driver version, devices
/// by name), or why there is none (no `libcuda`, a library that is not the
/// driver, `cuInit` failed, no device).
///
/// ```
/// match ferry::cuda::status() {
///     Ok(found) => println!("{found}"),
///     Err(why) => println!("no CUDA: {why}"),
/// }
/// ```
pub fn status() -> Result<String, String> {
    if stage::simulated() {
        return Ok("simulated: device memory is host memory in this process \
                   (ferry::cuda::simulate_with_host_memory)"
            .into());
    }
    let d = driver()?;
    describe(d).map_err(|e| format!("{}: {e}", d.path.display()))
}

fn describe(d: &Driver) -> Result<String, CudaError> {
    let n = d.device_count()?;
    if n == 0 {
        return Err(CudaError::Unavailable(
            "the driver loaded but sees no CUDA device".into(),
        ));
    }
    let mut names = Vec::new();
    for i in 0..n {
        names.push(format!("cuda:{i} {}", d.device_name(i)?));
    }
    Ok(format!(
        "{}, driver API {}.{}, {n} device{}: {}",
        d.path.display(),
        d.version / 1000,
        (d.version % 1000) / 10,
        if n == 1 { "" } else { "s" },
        names.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this process sees, checked for consistency either way: on a
    /// machine without CUDA (CI, this one) everything says so with a reason
    /// and nothing panics; on one with a GPU the same calls succeed.
    #[test]
    fn status_available_and_allocation_agree() {
        match driver() {
            Err(why) => {
                let s = status().unwrap_err();
                assert_eq!(s, why);
                assert!(s.contains(LIB_ENV), "no hint of what to set: {s}");
                match DeviceBuffer::new(0, 4096) {
                    Err(CudaError::Unavailable(w)) => assert_eq!(w, why),
                    other => panic!("expected Unavailable, got {other:?}"),
                }
            }
            Ok(d) => {
                let n = d.device_count().unwrap();
                assert_eq!(status().is_ok(), n > 0, "{:?}", status());
                match DeviceBuffer::new(n, 16) {
                    Err(CudaError::InvalidDevice(i)) if n > 0 => assert_eq!(i, n),
                    Err(CudaError::Unavailable(_)) if n == 0 => {}
                    other => panic!("cuda:{n} of {n} devices: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn errors_say_what_failed() {
        let e = CudaError::Driver {
            call: "cuMemAlloc_v2",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        };
        assert_eq!(
            e.to_string(),
            "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
        );
        assert_eq!(
            CudaError::InvalidDevice(3).to_string(),
            "no CUDA device cuda:3 here"
        );
    }
}
