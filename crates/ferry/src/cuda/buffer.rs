//! [`CudaBuffer`]: owned device memory that becomes a [`Descriptor`], for
//! tests and benchmarks.

use ferry_proto::Device;

use super::{CudaError, DeviceBuffer};
use crate::descriptor::Descriptor;

/// `len` bytes of memory on one GPU (`cuda:N`), allocated through the
/// device's primary context and freed on drop: device memory for tests and
/// benchmarks, which becomes a [`Descriptor`] with
/// [`into_descriptor`](Self::into_descriptor) (and comes back from it with
/// [`Descriptor::into_owner`]).
///
/// Without CUDA (no driver, or no device) [`new`](Self::new) is
/// `Err(CudaError::Unavailable(..))`, saying why and what to install or
/// set; [`status`](super::status) says the same.
///
/// Verified on one H100 on 2026-11-24: allocated, filled and read back
/// through the driver, and moved by CUDA IPC, staged and through UCX
/// (`docs/gpu.md`).
///
/// ```
/// match ferry::cuda::CudaBuffer::new(0, 1 << 20) {
///     Ok(buf) => {
///         let d = buf.into_descriptor();
///         assert_eq!(d.device(), ferry::Device::cuda(0));
///         assert!(d.as_slice().is_none(), "device memory is never read on the host");
///     }
///     Err(e) => println!("no GPU here: {e}"),
/// }
/// ```
#[derive(Debug)]
pub struct CudaBuffer(DeviceBuffer);

impl CudaBuffer {
    /// Allocates `len` bytes (uninitialised) on `cuda:device`.
    ///
    /// `CudaError::Unavailable` where there is no CUDA,
    /// `CudaError::InvalidDevice` for a device number this host does not
    /// have, `CudaError::Driver` if the allocation fails.
    pub fn new(device: u32, len: usize) -> Result<CudaBuffer, CudaError> {
        DeviceBuffer::new(device, len).map(CudaBuffer)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// The device it lives on (`cuda:N`).
    pub fn device(&self) -> Device {
        Device::cuda(self.0.device())
    }

    /// Its device address (0 when empty), valid while `self` lives.
    pub fn device_ptr(&self) -> u64 {
        self.0.as_device_ptr()
    }

    /// Copies `src` into the start of the buffer (synchronous).
    /// `CudaError::OutOfRange` if it does not fit.
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<(), CudaError> {
        self.0.copy_from_host(src)
    }

    /// Copies the start of the buffer into `dst` (synchronous).
    /// `CudaError::OutOfRange` if `dst` is longer than the buffer.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<(), CudaError> {
        self.0.copy_to_host(dst)
    }

    /// Copies all of `src` into the start of this buffer, device to device
    /// (`cuMemcpyDtoD`), and waits for the copy. `CudaError::OutOfRange` if
    /// it does not fit.
    pub fn copy_from(&mut self, src: &CudaBuffer) -> Result<(), CudaError> {
        self.0.copy_from_device(&src.0)
    }

    /// A writable descriptor of the whole buffer, which owns it (freed when
    /// the descriptor, and any operation it was given to, is dropped).
    pub fn into_descriptor(self) -> Descriptor<'static> {
        let (ptr, len, device) = (self.device_ptr(), self.len(), self.device());
        // The buffer moves into the descriptor; its device allocation does
        // not move, so `ptr` stays valid for as long as the descriptor
        // holds it.
        Descriptor::on_device(ptr, len, device, true, Some(Box::new(self)))
    }
}

impl From<CudaBuffer> for Descriptor<'static> {
    fn from(b: CudaBuffer) -> Self {
        b.into_descriptor()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without CUDA the constructor says why, with what `status` says; on a
    /// GPU, the buffer becomes a device descriptor and comes back from it.
    #[test]
    fn cuda_buffer_is_unavailable_here_or_becomes_a_descriptor() {
        if !super::super::available() {
            let why = super::super::status().unwrap_err();
            match CudaBuffer::new(0, 4096) {
                Err(CudaError::Unavailable(w)) => {
                    assert!(why.contains(&w) || w.contains("no device"), "{w} / {why}");
                    println!("skipped the GPU half: CUDA unavailable: {why}");
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
            return;
        }
        let mut buf = CudaBuffer::new(0, 1 << 16).unwrap();
        let src: Vec<u8> = (0..1u32 << 16).map(|i| (i * 31) as u8).collect();
        buf.copy_from_host(&src).unwrap();
        let ptr = buf.device_ptr();
        let mut d = buf.into_descriptor();
        assert_eq!(
            (d.device(), d.size(), d.device_ptr(), d.is_writable()),
            (Device::cuda(0), 1 << 16, Some(ptr), true)
        );
        assert!(d.as_slice().is_none() && d.as_mut_slice().is_none());
        let mut buf: CudaBuffer = d.into_owner().unwrap();
        let mut back = vec![0u8; src.len()];
        buf.copy_to_host(&mut back).unwrap();
        assert!(back == src);
        // Device to device, into a larger buffer's start.
        let mut other = CudaBuffer::new(0, 1 << 17).unwrap();
        other.copy_from(&buf).unwrap();
        let mut again = vec![0u8; src.len()];
        other.copy_to_host(&mut again).unwrap();
        assert!(again == src);
        assert!(matches!(
            buf.copy_from(&other),
            Err(CudaError::OutOfRange { .. })
        ));
    }
}
