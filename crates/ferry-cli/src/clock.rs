//! The host's monotonic clock as a number, so that two processes of one host
//! can time one operation together (the benchmark's end-to-end latency runs
//! from the target creating the passive side to both sides seeing the end).
#![allow(unsafe_code)]

/// Nanoseconds of `CLOCK_MONOTONIC`: the same clock in every process of
/// this host (0 if it cannot be read).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` on this stack frame for
    // the whole call; `clock_gettime` writes only into it.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn advances() {
        let a = super::monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::monotonic_ns();
        assert!(a > 0 && b >= a + 2_000_000, "{a} {b}");
    }
}
