//! Device memory for the bench: `CudaBuffer`s on `cuda:N`, or host memory
//! standing in for a GPU (`sim`) in processes that simulate one.
// Describing host memory as device memory for the simulation is the one
// `unsafe` here, each with its argument.
#![allow(unsafe_code)]

use ferry::{Descriptor, Device};

use crate::peer::host_buffer;

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
/// [`device_buffer`] do (device `sim`; `cuda:N` is refused while
/// simulating, and so is every `CudaBuffer`), and the caller makes no
/// other.
pub unsafe fn simulate_gpu() {
    // SAFETY: the caller's promise is `simulate_with_host_memory`'s.
    unsafe { ferry::cuda::simulate_with_host_memory() };
}

/// The device a `--device` string names: `sim` is `cuda:0`.
pub fn device_of(device: &str) -> std::io::Result<Device> {
    if device == "sim" {
        return Ok(Device::cuda(0));
    }
    device
        .parse::<Device>()
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// `len` bytes of device memory for the bench, written once: a
/// `CudaBuffer` on `cuda:N`, or for `sim` (only in a process simulating a
/// GPU, see [`simulate_gpu_if_asked`]) a [`host_buffer`] described as
/// `cuda:0`.
pub fn device_buffer(device: &str, len: usize) -> std::io::Result<Descriptor<'static>> {
    let simulated = ferry::cuda::status().is_ok_and(|s| s.starts_with("simulated"));
    if device == "sim" {
        if !simulated {
            return Err(std::io::Error::other(
                "device sim needs a process that simulates a GPU",
            ));
        }
        let mut host = host_buffer(len)?;
        let ptr = host
            .as_mut_slice()
            .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr());
        // SAFETY: in a simulated process device memory is host memory; this
        // is `host`'s, which the descriptor owns (and so keeps alive and
        // unaliased) for its whole life.
        return Ok(unsafe {
            Descriptor::from_raw_parts_with_owner(ptr, len, Device::cuda(0), true, host)
        });
    }
    if simulated {
        return Err(std::io::Error::other(format!(
            "{device}: this process simulates a GPU; use --device sim"
        )));
    }
    let d = device_of(device)?;
    if d.is_cpu() {
        return host_buffer(len);
    }
    let mut b = ferry::cuda::CudaBuffer::new(d.id(), len).map_err(std::io::Error::other)?;
    b.copy_from_host(&vec![1u8; len])
        .map_err(std::io::Error::other)?;
    Ok(b.into_descriptor())
}
