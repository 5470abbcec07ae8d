//! A GPU simulated with host memory, for the bench and the peer: the
//! switch that turns it on in a process (device `sim`; the buffers
//! themselves are made in [`buffers`](crate::buffers)).
// Turning the simulation on is the one `unsafe` here, with its argument.
#![allow(unsafe_code)]

/// The environment variable that makes a `ferry peer` (and `ferry bench`
/// with `--device sim`) simulate a GPU with host memory
/// (`ferry::cuda::simulate_with_host_memory`): device buffers of device
/// `sim` are then host memory described as `cuda:0`.
pub const SIMULATED_GPU_ENV: &str = "FERRY_BENCH_SIMULATED_GPU";

/// Turns the simulation on where [`SIMULATED_GPU_ENV`] is `1`; true if so.
///
/// # Safety
///
/// As for [`simulate_gpu`].
pub unsafe fn simulate_gpu_if_asked() -> bool {
    let asked = std::env::var(SIMULATED_GPU_ENV).as_deref() == Ok("1");
    if asked {
        // SAFETY: the caller's promise.
        unsafe { simulate_gpu() };
    }
    asked
}

/// Makes this process simulate a GPU with host memory, for good.
///
/// # Safety
///
/// No device descriptor exists in the process when this is called, and
/// every one made afterwards describes host memory: those of
/// [`device_buffer`](crate::buffers::device_buffer) do (device `sim`; `cuda:N` is refused while
/// simulating, and so is every `CudaBuffer`), and the caller makes no
/// other.
pub unsafe fn simulate_gpu() {
    // SAFETY: the caller's promise is `simulate_with_host_memory`'s.
    unsafe { ferry::cuda::simulate_with_host_memory() };
}
