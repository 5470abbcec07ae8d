//! Bounds on copies that a peer can stall.
//!
//! A cross-memory copy reads the peer's pages; a peer can make them never
//! arrive (userfaultfd, a FUSE-backed mapping), and the copying thread then
//! waits in the kernel until they do: it cannot be interrupted. Such copies
//! run on tokio's blocking pool, outside every lock (`Region::copy_into`),
//! so a stalled one costs its thread and its operation only. This module
//! bounds how many threads that can be: at most [`PER_CONNECTION`] copies
//! per connection and [`IN_PROCESS`] in the whole process are in flight at
//! once; further copies wait for a slot (asynchronously, and give up when
//! their operation ends), so that stalled peers can never exhaust the
//! blocking pool (512 threads by default) that other work needs.

use std::sync::{Arc, OnceLock};

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
