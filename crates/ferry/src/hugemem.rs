//! Host memory allocated as frameworks allocate large arrays: an anonymous
//! mapping, page-aligned, advised for transparent huge pages.

use std::io;

/// An anonymous private mapping, unmapped on drop.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving it to
// another thread moves only the right to unmap it.
unsafe impl Send for Mapping {}

impl Mapping {
    /// `len` zeroed bytes (at least one page), huge-page advised where the
    /// kernel supports it (the advice failing is not an error).
    #[cfg(target_os = "linux")]
    pub(crate) fn new(len: usize) -> io::Result<Mapping> {
        let len = len.max(1);
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: advice on the mapping just made, of its exact length.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// Elsewhere: a leaked, zeroed heap buffer owned by this value.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn new(len: usize) -> io::Result<Mapping> {
        let b = vec![0u8; len.max(1)].into_boxed_slice();
        let len = b.len();
        Ok(Mapping {
            ptr: Box::into_raw(b).cast(),
            len,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The mapping's bytes (at least one).
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is `len` initialized (zeroed) bytes owned by this
        // value until it is dropped; shared for the borrow of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The mapping's bytes, to write (at least one).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, borrowed exclusively with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping (or box) made in `new`, of its exact length,
        // released once; whoever used the memory held this value, so no
        // one uses it any more.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
        // SAFETY: as above, for the box leaked in `new`.
        #[cfg(not(target_os = "linux"))]
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.len,
            )));
        }
    }
}
