//! Descriptors, and the memory they point into: the Python objects that own
//! the memory, kept alive until no operation uses it, with the operation's
//! claim on it (`claims.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ferry::Device;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::claims::{Claim, Range};
use crate::pool::Blocks;

/// A descriptor as the Python layer hands it over: address, size, device,
/// writable, and the object that keeps the memory alive (and, for buffers,
/// exported, so that it cannot be resized or freed).
pub(crate) type RawDescriptor = (usize, usize, String, bool, Py<PyAny>);

/// One of an operation's descriptors: raw memory, or blocks of a pool.
#[derive(FromPyObject)]
pub(crate) enum RawItem {
    /// Blocks of a `ferry.Pool` (a paged descriptor).
    Paged(Py<Blocks>),
    /// Raw memory.
    Plain(RawDescriptor),
}

/// What an operation's memory needs until the operation has let go of it:
/// the claim on the address ranges, and the Python objects that own them.
pub(crate) struct Owners {
    pub(crate) _claim: Claim,
    _keep: Vec<Py<PyAny>>,
}

/// Builds the Rust descriptors for an operation that `writes` into them (a
/// read, a writable) or only reads them, claims their memory, and returns
/// them with what must outlive every use of them.
#[allow(unsafe_code)]
pub(crate) fn descriptors(
    py: Python<'_>,
    raw: Vec<RawItem>,
    writes: bool,
) -> PyResult<(Vec<ferry::Descriptor<'static>>, Owners)> {
    let mut ranges = Vec::with_capacity(raw.len());
    for (index, item) in raw.iter().enumerate() {
        match item {
            RawItem::Plain((ptr, size, device, _, _)) => {
                if device == "cpu" && *size > 0 {
                    ranges.push(Range {
                        index,
                        start: *ptr,
                        end: ptr.saturating_add(*size),
                        pool: 0,
                    });
                }
            }
            RawItem::Paged(b) => {
                let b = b.get();
                if b.is_host() {
                    let (pool, start, end) = b.span();
                    ranges.push(Range {
                        index,
                        start,
                        end,
                        pool,
                    });
                }
            }
        }
    }
    let mut claim = Claim::new(ranges, writes)?;
    // `descs` is declared last so that it is dropped first on an early return.
    let mut keep = Vec::with_capacity(raw.len());
    let mut descs = Vec::with_capacity(raw.len());
    for (index, item) in raw.into_iter().enumerate() {
        let (ptr, size, device, writable, owner) = match item {
            RawItem::Plain(r) => r,
            RawItem::Paged(b) => {
                // The pool keeps its memory alive; the blocks are taken from
                // it until the descriptor is dropped (with the operation).
                descs.push(b.get().take(py, writes, &mut claim)?);
                keep.push(b.into_any());
                continue;
            }
        };
        let device: Device = device
            .parse()
            .map_err(|e: ferry::ParseDeviceError| PyValueError::new_err(e.to_string()))?;
        if ptr == 0 && size > 0 {
            return Err(PyValueError::new_err(format!(
                "descriptor {index} has a null pointer and a size of {size} bytes"
            )));
        }
        if isize::try_from(size).is_err() || ptr.checked_add(size).is_none() {
            return Err(PyValueError::new_err(format!(
                "descriptor {index}: {size} bytes at {ptr:#x} wrap around the address space"
            )));
        }
        // SAFETY: `from_raw_parts` needs the memory valid (and writable if
        // `writable`), not freed, and not accessed by others, for as long as
        // the descriptor or an operation holding it exists.
        // - Validity: the Python layer (`ferry/_descriptor.py`) takes
        //   `ptr`/`size` only from what the interpreter or the framework
        //   guarantees, never from a method an arbitrary object can define:
        //   a buffer export (address, size and the export itself from one
        //   `Py_buffer`), the storage of a `bytes` object (`bytes_address`,
        //   its C length, not `len()`), or torch's own C methods of a tensor
        //   whose type is exactly `torch.Tensor` or `torch.nn.Parameter`. It
        //   marks read-only memory (bytes, read-only buffers) not writable,
        //   and Ferry never writes into a descriptor that is not. The raw
        //   `(ptr, size, device, ref)` form is the caller's promise, exactly
        //   as in the reference API.
        // - Lifetime: `owner` is that object (with the buffer export that
        //   pins the memory: a bytearray cannot be resized while exported).
        //   It is kept next to the descriptor — in `KeepAlive` while an
        //   operation starts, then in `Holder` — and dropped only after the
        //   operation, whose drop closes its memory region so that no
        //   transport touches the memory afterwards (see `Holder`).
        // - Exclusivity: Python code must not use the memory while an
        //   operation is in progress, as with any buffer handed to native
        //   code (NIXL's, DMA engines'); the package documents it.
        // - Device memory (`cuda:N`) is never dereferenced on the host: the
        //   descriptor's `as_slice` is `None`, a region over it refuses
        //   every host access (`Denied::NotHostMemory`), and only the CUDA
        //   IPC puller copies it, with the driver. Claims cover host memory
        //   only, so two Python operations over one GPU tensor are not kept
        //   apart here: as with host memory, the caller must not use it
        //   twice at once.
        // - The descriptor holds a reference of its own to `owner`, so that
        //   an operation dropped while a copy into its memory is stalled by
        //   a same-host peer keeps the memory alive instead of waiting (with
        //   the GIL held) for the copy to return.
        let mine = owner.clone_ref(py);
        let d = unsafe {
            ferry::Descriptor::from_raw_parts_with_owner(
                ptr as *mut u8,
                size,
                device,
                writable,
                mine,
            )
        };
        descs.push(d);
        keep.push(owner);
    }
    Ok((
        descs,
        Owners {
            _claim: claim,
            _keep: keep,
        },
    ))
}

/// A future that owns the Python objects its descriptors point into, and
/// drops them only after the future itself: a `begin_*` future dropped
/// half-way (its asyncio future was cancelled) first fences its region, then
/// the memory is released.
pub(crate) struct KeepAlive<F> {
    // Field order is drop order.
    pub(crate) fut: Pin<Box<F>>,
    pub(crate) owners: Option<Owners>,
}

impl<F: Future> Future for KeepAlive<F> {
    type Output = (F::Output, Owners);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.fut.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready((v, this.owners.take().expect("polled after Ready"))),
            Poll::Pending => Poll::Pending,
        }
    }
}
