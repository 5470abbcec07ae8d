//! A fork of the test process, for same-host lanes' conformance backends:
//! a source whose memory sits at the same addresses and that can go away.

use std::io;

/// A fork of this process: the same memory at the same addresses
/// (copied on write), so a lease of ours is a lease of its memory too.
/// It waits to be killed, which dropping this does. Any same-host
/// lane's conformance backend may use it for a source that goes away.
pub(super) struct Twin(pub(super) libc::pid_t);

impl Twin {
    pub(super) fn fork() -> Twin {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: after the fork the child only makes system calls that
        // are async-signal-safe (`close_range`, `prctl`, `getppid`,
        // `pause`, `_exit`):
        // it never returns into Rust code, allocates nor takes a lock,
        // so the test process's other threads, absent in it, cannot
        // matter.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: async-signal-safe system calls only (see above).
            // The child closes what it inherited (so that a socket of
            // another test does not outlive its owner's close), dies
            // with the thread that forked it, and otherwise waits for
            // its SIGKILL.
            unsafe {
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            }
        }
        Twin(pid)
    }
}

impl Drop for Twin {
    fn drop(&mut self) {
        // SAFETY: system calls on our own child's pid, which stays ours
        // (unreaped) until `waitpid` returns.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}
