//! The buffers the bench and the peer move: host memory allocated as NumPy
//! allocates large arrays, and device memory on `cuda:N` (or host memory
//! standing in for a GPU, device `sim`, in processes that simulate one:
//! see [`gpu`](crate::gpu)).
// Describing host memory as device memory for the simulation is the one
// `unsafe` here, with its argument.
#![allow(unsafe_code)]

use ferry::{Descriptor, Device};

/// A buffer of `len` bytes for the benchmark, allocated as NumPy allocates
/// large arrays (page-aligned, advised for transparent huge pages: see
/// [`Descriptor::allocate`]) and written once, so that its pages are real
/// (a never-written buffer reads from the shared zero page, which flatters
/// a READ).
pub fn host_buffer(len: usize) -> std::io::Result<Descriptor<'static>> {
    let mut d = Descriptor::allocate(len)?;
    if let Some(b) = d.as_mut_slice() {
        b.fill(1);
    }
    Ok(d)
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
/// GPU, see [`simulate_gpu_if_asked`](crate::gpu::simulate_gpu_if_asked)) a [`host_buffer`] described as
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
