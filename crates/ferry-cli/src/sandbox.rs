//! `ferry peer --deny-cma`: make this process refuse cross-memory attach the
//! way a default Docker seccomp profile does, so that tests can show the
//! fallback to TCP on a machine where the kernel would otherwise permit it.

/// Installs, for every thread of this process, a seccomp filter under which
/// `process_vm_readv` and `process_vm_writev` fail with `EPERM`.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn deny_cross_memory_attach() -> std::io::Result<()> {
    use libc::{sock_filter, sock_fprog};
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let stmt = |code: u32, k: u32| sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let deny = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let filter = [
        // seccomp_data.arch: other ABIs pass untouched.
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        jeq(AUDIT_ARCH_X86_64, 0, 3),
        // seccomp_data.nr
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jeq(libc::SYS_process_vm_readv as u32, 2, 0),
        jeq(libc::SYS_process_vm_writev as u32, 1, 0),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(libc::BPF_RET | libc::BPF_K, deny),
    ];
    let prog = sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut sock_filter,
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `filter`, a valid array of `len` instructions
    // that outlives the call (the kernel copies it); every jump stays within
    // the program and every path ends in a return, so the kernel's verifier
    // accepts it. TSYNC applies it to every thread of the process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const sock_fprog,
        )
    };
    match r {
        0 => Ok(()),
        // With TSYNC, a thread that could not be synchronized is named.
        tid if tid > 0 => Err(std::io::Error::other(format!(
            "seccomp: thread {tid} could not take the filter"
        ))),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
pub fn deny_cross_memory_attach() -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "--deny-cma is built for Linux on x86-64 only",
    ))
}
