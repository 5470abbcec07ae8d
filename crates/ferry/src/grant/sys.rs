//! The system calls a grant's control page is built on: a `memfd` mapped
//! shared, and futexes on words of it (shared between processes: no
//! `FUTEX_PRIVATE_FLAG`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A fresh anonymous file of `len` zero bytes (`memfd_create`, close on
/// exec: a holder opens it through `/proc/<pid>/fd`, never inherits it).
#[cfg(target_os = "linux")]
pub(super) fn memfd(len: usize) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name and integer flags; the result is
    // checked, then owned.
    let fd = unsafe {
        libc::memfd_create(
            c"ferry-grant".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created here and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("page too large"))?;
    // SAFETY: an integer call on the descriptor just made.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Its size is fixed for good: a peer that maps it can never be made to
    // fault (SIGBUS) by the other side shrinking it.
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: an integer call on the descriptor just made.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Whether `fd` is a file whose size can no longer change (sealed against
/// shrinking and growing), so that mapping it cannot fault later.
#[cfg(target_os = "linux")]
pub(super) fn size_sealed(fd: &OwnedFd) -> bool {
    // SAFETY: an integer call on a descriptor this process holds.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    seals >= 0 && seals & need == need
}

#[cfg(not(target_os = "linux"))]
pub(super) fn size_sealed(_fd: &OwnedFd) -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
pub(super) fn memfd(_len: usize) -> io::Result<OwnedFd> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "grants need Linux",
    ))
}

/// The length of `fd`, a regular file (`None`: something else, such as a
/// pipe, socket or device).
pub(super) fn file_len(fd: &OwnedFd) -> io::Result<Option<usize>> {
    let f = std::fs::File::from(fd.try_clone()?);
    let m = f.metadata()?;
    if !m.is_file() {
        return Ok(None);
    }
    usize::try_from(m.len())
        .map(Some)
        .map_err(|_| io::Error::other("file too large"))
}

/// A shared read-write mapping of the first `len` bytes of `fd`, unmapped
/// on drop.
pub(super) struct Shared {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is memory owned by this value, only ever accessed
// through atomics (see `ControlPage`); moving or sharing it between threads
// moves or shares only those accesses and the right to unmap.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

impl Shared {
    pub(super) fn map(fd: &OwnedFd, len: usize) -> io::Result<Shared> {
        if len == 0 {
            return Err(io::Error::other("an empty control page"));
        }
        // SAFETY: a fresh shared mapping of a file this process holds open;
        // no existing memory is touched. The file may be shorter than `len`
        // (a hostile owner): callers map `file_len` bytes at most.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Shared { ptr, len })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of its length; nothing borrows
        // it past the owner's lifetime (accessors borrow `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout` (`None`: until
/// woken). Returns at once if it holds another value; spurious wake-ups
/// happen: callers loop.
#[cfg(target_os = "linux")]
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned 32-bit word (in a shared mapping,
    // hence no FUTEX_PRIVATE_FLAG) for the call; `tsp` is null or points to
    // a timespec in this frame. The kernel only reads both.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            tsp,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// Wakes every waiter on `word`.
#[cfg(target_os = "linux")]
pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit word for the call; waking
    // touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

#[cfg(not(target_os = "linux"))]
pub(super) fn futex_wait(_word: &AtomicU32, _expected: u32, timeout: Option<Duration>) {
    std::thread::sleep(timeout.unwrap_or(Duration::from_millis(1)));
}

#[cfg(not(target_os = "linux"))]
pub(super) fn futex_wake(_word: &AtomicU32) {}

/// Whether process `pid` is gone for good: no such process, a zombie, or
/// another process under its pid (its start time differs from `start`,
/// when `start` is known, i.e. not 0).
pub(super) fn process_gone(pid: u32, start: u64) -> bool {
    match process_start(pid) {
        None => true,
        Some(now) => start != 0 && now != start,
    }
}

/// The start time of live process `pid` (`/proc/<pid>/stat` field 22, in
/// clock ticks since boot); `None` if there is none, or it is a zombie.
pub(super) fn process_start(pid: u32) -> Option<u64> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?;
    if state == "Z" || state == "X" || state == "x" {
        return None;
    }
    // Field 3 was `state`; field 22 is the start time.
    f.nth(18)?.parse().ok()
}

/// This thread's id.
#[cfg(target_os = "linux")]
pub(super) fn gettid() -> u32 {
    // SAFETY: no arguments, no memory touched.
    unsafe { libc::gettid() as u32 }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn gettid() -> u32 {
    0
}

/// A descriptor of thread `tid` itself (`pidfd_open` with `PIDFD_THREAD`,
/// Linux 6.9): it never names another thread, whatever reuses the id, and
/// it polls readable once that thread has exited.
#[cfg(target_os = "linux")]
pub(super) fn thread_pidfd(tid: u32) -> io::Result<OwnedFd> {
    /// `PIDFD_THREAD` (`O_EXCL`): a descriptor of the thread, not of its
    /// thread group.
    const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;
    let tid = libc::pid_t::try_from(tid).map_err(|_| io::Error::other("tid out of range"))?;
    if tid <= 0 {
        return Err(io::Error::other("no thread"));
    }
    // SAFETY: integer arguments; the result is checked, then owned.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
    // SAFETY: `fd` was just opened here and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(not(target_os = "linux"))]
pub(super) fn thread_pidfd(_tid: u32) -> io::Result<OwnedFd> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "pidfds need Linux",
    ))
}

/// Whether the thread of `pidfd` (from [`thread_pidfd`]) still runs: a
/// poll that does not wait (a system call, well under a microsecond).
pub(super) fn thread_alive(pidfd: &OwnedFd) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one pollfd in this frame, valid for the call; no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(n == 0);
    }
}
