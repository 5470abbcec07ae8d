//! Bounds on copies that a peer can stall.
//!
//! A cross-memory copy reads the peer's pages; a peer can make them never
//! arrive (userfaultfd, a FUSE-backed mapping), and the copying thread then
//! waits in the kernel until they do: it cannot be interrupted. Such copies
//! run on threads of their own ([`run`]; never tokio's blocking pool, whose
//! threads a runtime waits for when it is dropped), outside every lock
//! (`Region::copy_into`), so a stalled one costs its thread and its
//! operation only. This module bounds how many threads that can be, and who
//! can hold them: at most [`PER_CONNECTION`] copies of one connection,
//! [`PER_PEER`] copies from one peer (whatever number of connections it
//! opens: see [`PeerKey`]) and [`IN_PROCESS`] in the whole process are in
//! flight at once.
//!
//! A copy takes its slot when it is planned ([`CopySlots::try_acquire`]),
//! and never waits for a slot that another peer holds. A copy (a READ's, or
//! a WRITE's whose source lends its memory) waits only where its own
//! connection's or peer's share is in use, for one of that peer's own
//! copies to end ([`CopySlots::acquire_own`], cancellable); where the
//! process's slots are all in use a READ moves in band instead (over the
//! connection, at once) and a WRITE is refused at once
//! (`AbortReason::CopySlots`). So a
//! peer that stalls its copies holds at most its share and delays only
//! itself, and once every slot is held (by peers with many identities: see
//! `docs/security.md`) honest READs go on in band.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// The most copies one connection may have in flight at once.
pub(crate) const PER_CONNECTION: usize = 4;
/// The most copies from one peer (see [`PeerKey`]) in flight at once.
pub(crate) const PER_PEER: usize = 16;
/// The most copies the process may have in flight at once.
pub(crate) const IN_PROCESS: usize = 64;

/// Who a copy reads from, for [`PER_PEER`]: a claim that costs a peer
/// nothing (its worker id, a port) does not count.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum PeerKey {
    /// A process of this host that passed the attach probe, by its pid and
    /// the random bytes of its program image (`cma::Peer::identity`): the
    /// kernel's word, not the peer's. All its connections share one share.
    Process(u32, [u8; 16]),
    /// A peer reached over the network (UCX), by the two hosts' addresses.
    Hosts(IpAddr, IpAddr),
}

/// Why no copy slot was free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// The connection has [`PER_CONNECTION`] copies in flight.
    Connection,
    /// The peer has [`PER_PEER`] copies in flight.
    Peer,
    /// The process has [`IN_PROCESS`] copies in flight.
    Process,
}

impl std::fmt::Display for NoSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, who) = match self {
            NoSlot::Connection => (PER_CONNECTION, "this connection"),
            NoSlot::Peer => (PER_PEER, "this peer"),
            NoSlot::Process => (IN_PROCESS, "this process"),
        };
        write!(
            f,
            "no copy slot is free: {who} has {n} cross-memory copies in flight \
             (a peer may be stalling them)"
        )
    }
}

/// The copies in flight: in the process, and by peer.
#[derive(Debug, Default)]
struct Ledger {
    total: usize,
    by_peer: HashMap<PeerKey, usize>,
}

impl Ledger {
    /// Counts one more copy of a connection that has `conn` in flight, from
    /// `peer`, if every bound allows it.
    fn take(&mut self, conn: &mut usize, peer: &PeerKey) -> Result<(), NoSlot> {
        if *conn >= PER_CONNECTION {
            return Err(NoSlot::Connection);
        }
        let mine = self.by_peer.get(peer).copied().unwrap_or(0);
        if mine >= PER_PEER {
            return Err(NoSlot::Peer);
        }
        if self.total >= IN_PROCESS {
            return Err(NoSlot::Process);
        }
        *conn += 1;
        self.total += 1;
        self.by_peer.insert(peer.clone(), mine + 1);
        Ok(())
    }

    /// Counts one copy less (one that [`take`](Self::take) counted).
    fn give(&mut self, conn: &mut usize, peer: &PeerKey) {
        *conn = conn.saturating_sub(1);
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_peer.get_mut(peer) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(peer);
            }
        }
    }
}

fn ledger() -> std::sync::MutexGuard<'static, Ledger> {
    static L: OnceLock<Mutex<Ledger>> = OnceLock::new();
    L.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A connection's copies in flight.
#[derive(Debug, Default)]
pub(crate) struct CopySlots {
    /// Counted under the ledger's lock.
    in_flight: Mutex<usize>,
}

/// The right to run one copy; its slots come back when it is dropped.
#[derive(Debug)]
pub(crate) struct CopySlot {
    conn: Arc<CopySlots>,
    peer: PeerKey,
}

impl CopySlots {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A slot for one copy of this connection from `peer`, at once, if the
    /// connection, the peer and the process each have one free; else why
    /// not. Never waits.
    pub(crate) fn try_acquire(self: &Arc<Self>, peer: PeerKey) -> Result<CopySlot, NoSlot> {
        let mut l = ledger();
        let mut conn = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        l.take(&mut conn, &peer)?;
        drop(conn);
        Ok(CopySlot {
            conn: self.clone(),
            peer,
        })
    }
}

impl CopySlots {
    /// A slot for one copy of this connection from `peer`, waiting while
    /// only this connection's or this peer's share is in use (for one of
    /// this peer's own copies to end), never for the process's: where the
    /// process has none free, `Err(NoSlot::Process)` at once.
    pub(crate) async fn acquire_own(self: &Arc<Self>, peer: PeerKey) -> Result<CopySlot, NoSlot> {
        loop {
            let freed = freed().notified();
            tokio::pin!(freed);
            // Registered before the check, so that a slot given back in
            // between still wakes it.
            freed.as_mut().enable();
            match self.try_acquire(peer.clone()) {
                Ok(slot) => return Ok(slot),
                Err(NoSlot::Process) => return Err(NoSlot::Process),
                Err(NoSlot::Connection | NoSlot::Peer) => freed.await,
            }
        }
    }
}

/// Woken whenever a slot comes back.
fn freed() -> &'static tokio::sync::Notify {
    static F: OnceLock<tokio::sync::Notify> = OnceLock::new();
    F.get_or_init(tokio::sync::Notify::new)
}

impl Drop for CopySlot {
    fn drop(&mut self) {
        {
            let mut l = ledger();
            let mut conn = self
                .conn
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            l.give(&mut conn, &self.peer);
        }
        freed().notify_waiters();
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

    fn process(pid: u32) -> PeerKey {
        PeerKey::Process(pid, [pid as u8; 16])
    }

    #[test]
    fn a_connection_and_a_peer_get_at_most_their_share() {
        let mut l = Ledger::default();
        let mut conns = [0usize; 8];
        let p = process(1);
        // One connection: its own bound first.
        for _ in 0..PER_CONNECTION {
            l.take(&mut conns[0], &p).unwrap();
        }
        assert_eq!(l.take(&mut conns[0], &p), Err(NoSlot::Connection));
        // More connections of the same peer: the peer's share.
        let mut taken = PER_CONNECTION;
        for c in conns.iter_mut().skip(1) {
            while taken < PER_PEER && l.take(c, &p).is_ok() {
                taken += 1;
            }
        }
        assert_eq!(taken, PER_PEER);
        assert_eq!(l.take(&mut conns[7], &p), Err(NoSlot::Peer));
        // Another peer still gets its own.
        let mut other = 0;
        assert!(l.take(&mut other, &process(2)).is_ok());
        // A slot given back is taken again.
        l.give(&mut conns[1], &p);
        assert!(l.take(&mut conns[1], &p).is_ok());
        assert_eq!(l.total, PER_PEER + 1);
    }

    #[test]
    fn the_process_bound_holds_whatever_the_number_of_peers() {
        let mut l = Ledger::default();
        let mut conn = 0;
        for pid in 0..IN_PROCESS as u32 {
            conn = 0;
            l.take(&mut conn, &process(pid)).unwrap();
        }
        assert_eq!(l.take(&mut 0, &process(9999)), Err(NoSlot::Process));
        l.give(&mut conn, &process(0));
        assert!(!l.by_peer.contains_key(&process(0)), "an idle peer leaves");
        assert!(l.take(&mut 0, &process(9999)).is_ok());
    }

    #[tokio::test]
    async fn a_copy_waits_for_its_own_share_only() {
        let slots = Arc::new(CopySlots::new());
        let key = PeerKey::Process(u32::MAX - 1, [0xCD; 16]);
        let mut held: Vec<CopySlot> = (0..PER_CONNECTION)
            .map(|_| slots.try_acquire(key.clone()).unwrap())
            .collect();
        let wait = tokio::spawn({
            let (slots, key) = (slots.clone(), key.clone());
            async move { slots.acquire_own(key).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !wait.is_finished(),
            "it waits while its own share is in use"
        );
        held.pop();
        let got = tokio::time::timeout(Duration::from_secs(5), wait).await;
        assert!(matches!(got, Ok(Ok(Ok(_)))), "one of its own copies ended");
    }

    #[test]
    fn slots_come_back_when_dropped() {
        let slots = Arc::new(CopySlots::new());
        let key = PeerKey::Process(u32::MAX, [0xAB; 16]);
        let held: Vec<CopySlot> = (0..PER_CONNECTION)
            .map(|_| slots.try_acquire(key.clone()).unwrap())
            .collect();
        assert_eq!(
            slots.try_acquire(key.clone()).unwrap_err(),
            NoSlot::Connection
        );
        drop(held);
        assert!(slots.try_acquire(key).is_ok());
    }
}
