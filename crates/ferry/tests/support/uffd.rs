//! userfaultfd, by hand (the `libc` crate has the system call, not the
//! ABI): memory whose pages never arrive until this process serves them,
//! for tests of peers that stall a copy or a probe (`support::uffd`).
#![allow(dead_code)]

use std::io;

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xC020_AA04;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
pub const EVENT_PAGEFAULT: u8 = 0x12;

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
struct Range {
    start: u64,
    len: u64,
}
#[repr(C)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct Zeropage {
    range: Range,
    mode: u64,
    zeropage: i64,
}

/// A userfaultfd over `len` bytes of fresh anonymous memory, in missing
/// mode: every first touch of a page waits for this process to serve it.
pub struct Stall {
    pub fd: libc::c_int,
    pub base: *mut u8,
    pub len: usize,
}

impl Stall {
    pub fn new(len: usize) -> io::Result<Stall> {
        // Not UFFD_USER_MODE_ONLY: the faults to stall come from the kernel
        // (another process's `process_vm_readv`).
        // SAFETY: a system call with no pointer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = fd as libc::c_int;
        let mut api = Api {
            api: UFFD_API,
            features: 0,
            ioctls: 0,
        };
        // SAFETY: `api` is a valid `struct uffdio_api` for the call.
        if unsafe { libc::ioctl(fd, UFFDIO_API, &mut api) } < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: closing the descriptor opened above, used by nothing else.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: a fresh private anonymous mapping; no memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: as above.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut reg = Register {
            range: Range {
                start: base as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: `reg` is a valid `struct uffdio_register` naming the
        // mapping made above.
        if unsafe { libc::ioctl(fd, UFFDIO_REGISTER, &mut reg) } < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping the mapping made above, never touched, and
            // closing the descriptor opened above.
            unsafe {
                libc::munmap(base, len);
                libc::close(fd);
            }
            return Err(e);
        }
        Ok(Stall {
            fd,
            base: base.cast(),
            len,
        })
    }

    /// Waits for the next page fault; its address.
    pub fn next_fault(fd: libc::c_int) -> io::Result<u64> {
        loop {
            let mut msg = [0u8; 32];
            // SAFETY: reads at most 32 bytes into `msg`.
            let n = unsafe { libc::read(fd, msg.as_mut_ptr().cast(), msg.len()) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 32 && msg[0] == EVENT_PAGEFAULT {
                return Ok(u64::from_ne_bytes(msg[16..24].try_into().unwrap()));
            }
        }
    }

    /// Serves every missing page of `start..start + len` with zeros,
    /// waking whoever waits for them.
    pub fn serve(fd: libc::c_int, start: u64, len: u64) {
        let mut z = Zeropage {
            range: Range { start, len },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: `z` is a valid `struct uffdio_zeropage` for the call;
        // pages already present make it fail with EEXIST, which is fine.
        unsafe { libc::ioctl(fd, UFFDIO_ZEROPAGE, &mut z) };
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this value made and closing its
        // descriptor; a thread still reading the descriptor gets an error,
        // and a process still copying from the mapping an EFAULT.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
            libc::close(self.fd);
        }
    }
}
