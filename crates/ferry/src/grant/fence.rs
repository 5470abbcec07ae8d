//! The fence between a grant's holder and its owner, on the control page.
//!
//! The holder counts each operation in flight ([`enter`]) in the counter of
//! the current *phase*, confirms the phase did not change meanwhile, then
//! checks the grant's state and the generations of the blocks it names,
//! copies, and leaves ([`Entered`]'s drop). The owner revokes by storing
//! the state, or retires blocks by bumping their generations, and then
//! [`drain`]s: it flips the phase and waits until the old phase's counter
//! is zero. Every operation that confirmed the old phase is waited for;
//! every other confirmed the new phase after the flip, hence after the
//! store, and sees it: no operation that checked the old state or the old
//! generation is still copying when the drain returns. Waiting per phase
//! rather than for "nothing in flight" means a steady stream of operations
//! on other blocks cannot keep a retire waiting.
//!
//! All of it is cooperative between Ferry processes: a holder has the
//! kernel's permission to read and write the owner's memory anyway.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::grant::GrantError;

use super::control::{ControlPage, LIVE};
use super::sys;

/// One operation in flight through the fence: leaves it on drop.
pub(super) struct Entered {
    page: Arc<ControlPage>,
    phase: u32,
}

/// Enters the fence, or [`GrantError::Revoked`] if the grant is revoked.
pub(super) fn enter(page: &Arc<ControlPage>) -> Result<Entered, GrantError> {
    loop {
        let phase = page.phase().load(SeqCst) & 1;
        page.inflight(phase).fetch_add(1, SeqCst);
        let entered = Entered {
            page: page.clone(),
            phase,
        };
        if page.phase().load(SeqCst) & 1 != phase {
            // A drain flipped it meanwhile: count in the new one instead.
            drop(entered);
            continue;
        }
        if page.state().load(SeqCst) != LIVE {
            return Err(GrantError::Revoked);
        }
        return Ok(entered);
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let word = self.page.inflight(self.phase);
        word.fetch_sub(1, SeqCst);
        if self.page.drain_waiters().load(SeqCst) != 0 {
            sys::futex_wake(word);
        }
    }
}

/// How long one wait of a drain sleeps before it looks at the holder again.
const SLICE: Duration = Duration::from_millis(10);

/// Waits until every operation that may have seen the grant's state and
/// generations as they were before this call has left the fence, or the
/// holder process is gone; [`GrantError::Stalled`] past `deadline`, with
/// an operation of a live holder still in flight. Blocking: call it from a
/// blocking thread. The caller serialises drains of one page.
///
/// First the other phase's counter drains (what an earlier drain that gave
/// up left there), then the phase flips and the old one drains.
pub(super) fn drain(page: &ControlPage, deadline: Duration) -> Result<(), GrantError> {
    let start = Instant::now();
    page.drain_waiters().fetch_add(1, SeqCst);
    let cur = page.phase().load(SeqCst) & 1;
    let out = wait_zero(page, 1 - cur, start, deadline).and_then(|()| {
        page.phase().fetch_add(1, SeqCst);
        wait_zero(page, cur, start, deadline)
    });
    page.drain_waiters().fetch_sub(1, SeqCst);
    out
}

fn wait_zero(
    page: &ControlPage,
    phase: u32,
    start: Instant,
    deadline: Duration,
) -> Result<(), GrantError> {
    let word = page.inflight(phase);
    loop {
        let n = word.load(SeqCst);
        if n == 0 || holder_gone(page) {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= deadline {
            return Err(GrantError::Stalled {
                pending: n,
                waited_ms: waited.as_millis() as u64,
            });
        }
        sys::futex_wait(word, n, Some(SLICE.min(deadline - waited)));
    }
}

/// Whether the process that opened the grant is gone (or none ever did:
/// then nothing can be in flight but what a hostile process claims).
pub(super) fn holder_gone(page: &ControlPage) -> bool {
    let pid = page.holder_pid().load(SeqCst);
    pid == 0 || sys::process_gone(pid, page.holder_start().load(SeqCst))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    use ferry_proto::grant::{GrantId, Rights};

    use super::super::control::{Header, REVOKED};
    use super::*;

    fn page() -> Arc<ControlPage> {
        let p = ControlPage::create(&Header {
            block_count: 4,
            cookie: [1; 16],
            token_hash: [2; 32],
            grant: GrantId(1),
            base: 0x1000,
            block_size: 64,
            expires_at_ms: 0,
            rights: Rights::READ_WRITE,
        })
        .unwrap();
        let me = std::process::id();
        p.holder_pid().store(me, SeqCst);
        p.holder_start()
            .store(sys::process_start(me).unwrap(), SeqCst);
        Arc::new(p)
    }

    #[test]
    fn a_revoke_waits_for_the_operation_in_flight() {
        let page = page();
        let op = enter(&page).unwrap();
        let p = page.clone();
        let revoker = std::thread::spawn(move || {
            p.state().store(REVOKED, SeqCst);
            let t = Instant::now();
            drain(&p, Duration::from_secs(10)).unwrap();
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(60));
        assert!(!revoker.is_finished(), "the revoke did not wait");
        drop(op);
        let waited = revoker.join().unwrap();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert_eq!(enter(&page).err(), Some(GrantError::Revoked));
    }

    #[test]
    fn a_stopped_holder_stalls_a_revoke_until_its_deadline() {
        let page = page();
        let op = enter(&page).unwrap();
        page.state().store(REVOKED, SeqCst);
        let e = drain(&page, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(e, GrantError::Stalled { pending: 1, .. }), "{e}");
        // The next drain waits for what the first left behind.
        let p = page.clone();
        let again = std::thread::spawn(move || drain(&p, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!again.is_finished());
        drop(op);
        again.join().unwrap().unwrap();
    }

    #[test]
    fn a_dead_holder_does_not_hold_a_drain() {
        let page = page();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        page.holder_pid().store(dead, SeqCst);
        page.holder_start().store(0, SeqCst);
        // Killed mid-operation: its count never comes down.
        std::mem::forget(enter(&page).unwrap());
        let t = Instant::now();
        drain(&page, Duration::from_secs(10)).unwrap();
        assert!(t.elapsed() < Duration::from_millis(200));
    }

    #[test]
    fn a_stream_of_operations_does_not_starve_a_retire() {
        let page = page();
        let stop = Arc::new(AtomicBool::new(false));
        let busy: Vec<_> = (0..2)
            .map(|_| {
                let (page, stop) = (page.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut held = Some(enter(&page).unwrap());
                    while !stop.load(Relaxed) {
                        // Always one operation in flight per thread.
                        let next = enter(&page).unwrap();
                        held = Some(next);
                    }
                    drop(held);
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(10));
        for _ in 0..20 {
            let g = page.generation(1).unwrap();
            g.fetch_add(1, SeqCst);
            drain(&page, Duration::from_secs(5)).unwrap();
        }
        stop.store(true, Relaxed);
        for b in busy {
            b.join().unwrap();
        }
        assert_eq!(
            page.inflight(0).load(SeqCst) + page.inflight(1).load(SeqCst),
            0
        );
    }
}
