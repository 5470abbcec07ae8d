//! Bounds on copies that a peer can stall.
//!
//! A cross-memory copy reads the peer's pages; a peer can make them never
//! arrive (userfaultfd, a FUSE-backed mapping), and the copying thread then
//! waits in the kernel until they do: it cannot be interrupted. Such copies
//! run on threads of their own ([`run`]; never tokio's blocking pool, whose
//! threads a runtime waits for when it is dropped), outside every lock
//! (`Region::copy_into`), so a stalled one costs its thread and its
//! operation only. This module bounds how many threads that can be: at most
//! [`PER_CONNECTION`] copies per connection and [`IN_PROCESS`] in the whole
//! process are in flight at once; further copies wait for a slot
//! (asynchronously, and give up when their operation ends).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most copies one connection may have in flight at once.
pub(crate) const PER_CONNECTION: usize = 4;
/// The most copies the process may have in flight at once.
pub(crate) const IN_PROCESS: usize = 64;

fn process_slots() -> Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS
        .get_or_init(|| Arc::new(Semaphore::new(IN_PROCESS)))
        .clone()
}

/// A connection's share of the copy slots.
pub(crate) struct CopySlots {
    mine: Arc<Semaphore>,
}

/// The right to run one copy; the slots come back when it is dropped.
pub(crate) struct CopySlot {
    _mine: OwnedSemaphorePermit,
    _process: OwnedSemaphorePermit,
}

impl CopySlots {
    pub(crate) fn new() -> Self {
        CopySlots {
            mine: Arc::new(Semaphore::new(PER_CONNECTION)),
        }
    }

    /// A slot at once, if one of this connection and one of the process
    /// are free.
    pub(crate) fn try_acquire(&self) -> Option<CopySlot> {
        let mine = self.mine.clone().try_acquire_owned().ok()?;
        let process = process_slots().try_acquire_owned().ok()?;
        Some(CopySlot {
            _mine: mine,
            _process: process,
        })
    }

    /// Waits for a slot of this connection, then one of the process (in
    /// that order, so that one connection never holds more than its share
    /// of the process's slots, even while waiting).
    pub(crate) async fn acquire(&self) -> CopySlot {
        let mine = self
            .mine
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let process = process_slots()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        CopySlot {
            _mine: mine,
            _process: process,
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The copy threads: at most [`IN_PROCESS`] (every job runs under a
/// process slot, so no more are ever busy at once); an idle one exits after
/// a while.
#[derive(Default)]
struct Threads {
    queue: VecDeque<Job>,
    idle: usize,
    alive: usize,
}

fn threads() -> &'static (Mutex<Threads>, Condvar) {
    static T: OnceLock<(Mutex<Threads>, Condvar)> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn lock(m: &Mutex<Threads>) -> std::sync::MutexGuard<'_, Threads> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on a copy thread (call it only while holding a [`CopySlot`]).
/// Threads are detached: a copy that a peer stalls keeps its thread, never
/// the runtime (nor its shutdown).
pub(crate) fn run(f: impl FnOnce() + Send + 'static) {
    let (m, cv) = threads();
    let mut t = lock(m);
    t.queue.push_back(Box::new(f));
    // An idle thread takes the job only if no earlier job is already
    // promised to it: a thread woken for one job that a peer then stalls
    // would leave the next one queued behind it for ever.
    if t.idle >= t.queue.len() {
        cv.notify_one();
        return;
    }
    t.alive += 1;
    drop(t);
    let spawned = std::thread::Builder::new()
        .name("ferry-copy".into())
        .stack_size(256 * 1024)
        .spawn(worker);
    if let Err(e) = spawned {
        lock(m).alive -= 1;
        // The job waits for a thread that frees up; with none alive it
        // would wait for ever: run it here instead.
        tracing::warn!("could not start a copy thread ({e}); copying on the caller's thread");
        let job = lock(m).queue.pop_back();
        if let Some(job) = job {
            job();
        }
    }
}

fn worker() {
    /// An idle copy thread exits after this long.
    const LINGER: Duration = Duration::from_secs(30);
    let (m, cv) = threads();
    let mut t = lock(m);
    loop {
        if let Some(job) = t.queue.pop_front() {
            drop(t);
            job();
            t = lock(m);
            continue;
        }
        t.idle += 1;
        let (g, timeout) = cv
            .wait_timeout(t, LINGER)
            .unwrap_or_else(|e| e.into_inner());
        t = g;
        t.idle -= 1;
        if timeout.timed_out() && t.queue.is_empty() {
            t.alive -= 1;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_gets_at_most_its_share() {
        let slots = CopySlots::new();
        let mut held = Vec::new();
        for _ in 0..PER_CONNECTION {
            held.push(slots.acquire().await);
        }
        let more = tokio::time::timeout(std::time::Duration::from_millis(50), slots.acquire());
        assert!(more.await.is_err(), "a fifth copy must wait for a slot");
        held.pop();
        let again = tokio::time::timeout(std::time::Duration::from_secs(5), slots.acquire());
        assert!(again.await.is_ok(), "a slot given back is taken");
    }
}
