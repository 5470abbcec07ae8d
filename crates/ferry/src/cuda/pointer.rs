//! What the driver says of a device address: whether it is device memory,
//! and of which device (`cuPointerGetAttribute`). A `cuda:N` descriptor is
//! checked against it when an operation is created, so that memory on
//! another GPU, host memory described as a GPU's, or a range running off
//! its allocation is refused as misuse before any copy.
//!
//! Verified on one H100 on 2026-11-24: a device buffer and a range inside
//! it pass, host memory and a device the host does not have are refused,
//! and `device_of` names the buffer's device. Memory that lies on a
//! second GPU has not been tried (one GPU). Without a GPU the checks do
//! not run (they need the driver, and a simulated GPU's addresses are host
//! memory).

use std::ffi::{c_int, c_uint, c_void};

use super::driver::{
    CU_MEMORYTYPE_DEVICE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
};
use super::{CudaError, Driver};

/// What the driver says `ptr` is: its memory type (`CUmemorytype`) and
/// the ordinal of its device, asked in the context current on this thread.
pub(super) fn attributes_here(drv: &Driver, ptr: u64) -> Result<(c_uint, c_int), CudaError> {
    let api = &drv.api;
    let mut kind: c_uint = 0;
    // SAFETY: the attribute is a `CUmemorytype` (an unsigned int) and the
    // out pointer is writable; the driver only looks the address up in its
    // own tables (an address it does not know is an error, not a read).
    let r = unsafe {
        (api.pointer_get_attribute)(
            (&mut kind as *mut c_uint).cast::<c_void>(),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    drv.check("cuPointerGetAttribute", r)?;
    let mut ordinal: c_int = -1;
    // SAFETY: the attribute is an `int`; as above.
    let r = unsafe {
        (api.pointer_get_attribute)(
            (&mut ordinal as *mut c_int).cast::<c_void>(),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    drv.check("cuPointerGetAttribute", r)?;
    Ok((kind, ordinal))
}

/// Why `len` bytes at `ptr` are not device memory of `cuda:ordinal` as the
/// driver sees it (their first and their last byte), or `None` where they
/// are; asked in the device's primary context, kept for the process. A
/// range over allocations that lie end to end passes, on purpose: a tensor
/// of PyTorch's expandable segments spans several VMM allocations. CUDA
/// IPC never lends such a range (the export refuses a segment outside one
/// allocation; it moves staged). Asked only where this process has the
/// driver ([`lends_device_memory`](super::lends_device_memory)); elsewhere
/// `None` (a simulated GPU's addresses are host memory).
pub(crate) fn pointer_mismatch(ordinal: u32, ptr: u64, len: usize) -> Option<String> {
    if len == 0 || !super::lends_device_memory() {
        return None;
    }
    let ctx = match super::context::primary_ctx(ordinal) {
        Ok(c) => c,
        Err(e) => return Some(e.to_string()),
    };
    let last = match ptr.checked_add(len as u64 - 1) {
        Some(l) => l,
        None => {
            return Some(format!(
                "{len} bytes at {ptr:#x} pass the end of the address space"
            ))
        }
    };
    let _current = match ctx.make_current() {
        Ok(c) => c,
        Err(e) => return Some(e.to_string()),
    };
    for (what, at) in [("its first byte", ptr), ("its last byte", last)] {
        match attributes_here(ctx.drv, at) {
            Err(e) => {
                return Some(format!(
                    "the driver does not know {what} ({at:#x}) as GPU memory: {e}"
                ))
            }
            Ok((kind, _)) if kind != CU_MEMORYTYPE_DEVICE => {
                return Some(format!(
                    "{what} ({at:#x}) is not device memory (CUmemorytype {kind})"
                ))
            }
            Ok((_, dev)) if dev != ordinal as c_int => {
                return Some(format!("{what} ({at:#x}) is memory of cuda:{dev}"))
            }
            Ok(_) => {}
        }
    }
    None
}

/// The CUDA device whose memory `ptr` is, as the driver says
/// (`cuPointerGetAttribute`): for memory whose owner does not say which
/// GPU it is on (a `__cuda_array_interface__` without a device).
///
/// `Err` where there is no driver (also in a process that simulates a
/// GPU), or where the driver does not know the address as device memory.
///
/// ```
/// // Without a GPU there is nothing to ask.
/// if !ferry::cuda::available() {
///     assert!(ferry::cuda::device_of(0x7000_0000).is_err());
/// }
/// ```
pub fn device_of(ptr: u64) -> Result<u32, CudaError> {
    if !super::lends_device_memory() {
        return Err(CudaError::Unavailable(match super::status() {
            Ok(_) => "this process simulates a GPU: the driver is not asked".into(),
            Err(why) => why,
        }));
    }
    let drv = super::driver_or_unavailable()?;
    // In the context current on this thread where there is one (the
    // framework's that made the memory), else `cuda:0`'s, kept for the
    // process: no context is made or retained per call.
    match super::context::on_any_device(|| attributes_here(drv, ptr))? {
        (CU_MEMORYTYPE_DEVICE, dev) if dev >= 0 => Ok(dev as u32),
        (kind, _) => Err(CudaError::NotDeviceMemory(format!(
            "{ptr:#x} is memory of type {kind} (CUmemorytype), not device memory"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::DeviceBuffer;

    /// Without the driver (this machine, CI) nothing is asked: every range
    /// passes and `device_of` says why it cannot answer. With a GPU, a
    /// buffer's own range passes, and a range off its end, on another
    /// device, or at a host address does not.
    #[test]
    fn the_driver_says_what_an_address_is() {
        let mismatch = pointer_mismatch;
        if !crate::cuda::lends_device_memory() {
            assert_eq!(mismatch(0, 0x7000_0000, 4096), None);
            assert!(matches!(
                device_of(0x7000_0000),
                Err(CudaError::Unavailable(_))
            ));
            return;
        }
        let b = DeviceBuffer::new(0, 1 << 20).unwrap();
        let p = b.as_device_ptr();
        assert_eq!(mismatch(0, p, b.len()), None);
        assert_eq!(mismatch(0, p + 4096, 4096), None);
        assert_eq!(device_of(p).unwrap(), 0);
        assert!(mismatch(1, p, 16).is_some(), "another device");
        let host = [0u8; 64];
        assert!(
            mismatch(0, host.as_ptr() as u64, 64).is_some(),
            "host memory"
        );
        assert_eq!(mismatch(0, p, 0), None, "nothing to check");
    }
}
