//! Which accepted connections a connector keeps, so that nobody can lock
//! real peers out by opening connections.
//!
//! Every accepted connection holds a [`Ticket`] until it closes. A
//! connection is *unproven* until it presents a valid capability (an `Open`
//! with a token that grants an operation); anyone who can reach the port can
//! make one, while proven ones come from peers that hold metadata. The
//! bounds:
//!
//! - at most `max` connections in all ([`DEFAULT_MAX_CONNECTIONS`], see
//!   `ConnectorBuilder::max_connections`);
//! - at most `max / 8` unproven ones ([`unproven_cap`]), and at most
//!   [`UNPROVEN_PER_ADDRESS`] from one IP address.
//!
//! When a new connection would exceed a bound, the oldest unproven
//! connection (from the same address, for the per-address bound) is
//! closed to make room; only when every connection is proven is the new
//! one refused. A legitimate peer proves its connection with its first
//! request, milliseconds after connecting, so an attacker churning
//! connections mostly evicts its own, and proven peers are never evicted.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::sync::lock;
use tokio::sync::watch;

/// Accepted connections a connector keeps at most, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Unproven connections one IP address may hold at once.
pub const UNPROVEN_PER_ADDRESS: usize = 16;

/// The most unproven connections for a total bound of `max`.
pub fn unproven_cap(max: usize) -> usize {
    (max / 8).max(UNPROVEN_PER_ADDRESS).min(max)
}

struct Entry {
    id: u64,
    addr: IpAddr,
    evict: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    next: u64,
    total: usize,
    /// Oldest first.
    unproven: VecDeque<Entry>,
    per_addr: HashMap<IpAddr, usize>,
}

impl State {
    fn evict(&mut self, at: usize) {
        if let Some(e) = self.unproven.remove(at) {
            self.forget_addr(e.addr);
            self.total -= 1;
            e.evict.send_replace(true);
        }
    }

    fn forget_addr(&mut self, addr: IpAddr) {
        if let Some(n) = self.per_addr.get_mut(&addr) {
            *n -= 1;
            if *n == 0 {
                self.per_addr.remove(&addr);
            }
        }
    }
}

/// The accepted connections of one connector.
pub(crate) struct Admission {
    max: usize,
    state: Arc<Mutex<State>>,
}

/// One accepted connection's place; given back when dropped.
pub(crate) struct Ticket {
    id: u64,
    addr: IpAddr,
    state: Arc<Mutex<State>>,
    /// Becomes true when the connection must close to make room.
    pub(crate) evicted: watch::Receiver<bool>,
    /// Counted in `total` (false once evicted: the eviction uncounted it).
    proven: std::sync::atomic::AtomicBool,
}

impl Admission {
    pub(crate) fn new(max: usize) -> Self {
        Admission {
            max: max.max(1),
            state: Arc::default(),
        }
    }

    /// A place for a connection from `addr`, making room by evicting the
    /// oldest unproven connection if need be; `None`: every place is taken
    /// by a proven connection.
    pub(crate) fn admit(&self, addr: IpAddr) -> Option<Ticket> {
        let mut s = lock(&self.state);
        if s.per_addr.get(&addr).copied().unwrap_or(0) >= UNPROVEN_PER_ADDRESS {
            if let Some(at) = s.unproven.iter().position(|e| e.addr == addr) {
                s.evict(at);
            }
        }
        if s.unproven.len() >= unproven_cap(self.max) || s.total >= self.max {
            if s.unproven.is_empty() {
                return None;
            }
            s.evict(0);
        }
        let (evict, evicted) = watch::channel(false);
        s.next += 1;
        let id = s.next;
        s.total += 1;
        *s.per_addr.entry(addr).or_default() += 1;
        s.unproven.push_back(Entry { id, addr, evict });
        Some(Ticket {
            id,
            addr,
            state: self.state.clone(),
            evicted,
            proven: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// `(total, unproven)` connections held now.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let s = lock(&self.state);
        (s.total, s.unproven.len())
    }
}

impl Ticket {
    /// The connection presented a valid capability: it is never evicted.
    pub(crate) fn prove(&self) {
        use std::sync::atomic::Ordering;
        if self.proven.load(Ordering::Relaxed) {
            return;
        }
        let mut s = lock(&self.state);
        if let Some(at) = s.unproven.iter().position(|e| e.id == self.id) {
            s.unproven.remove(at);
            s.forget_addr(self.addr);
            self.proven.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        if self.proven.load(std::sync::atomic::Ordering::Relaxed) {
            s.total -= 1;
        } else if let Some(at) = s.unproven.iter().position(|e| e.id == self.id) {
            s.unproven.remove(at);
            s.forget_addr(self.addr);
            s.total -= 1;
        }
        // Otherwise it was evicted, which uncounted it.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn the_oldest_unproven_connection_makes_room() {
        let a = Admission::new(64);
        let cap = unproven_cap(64);
        let mut held: Vec<Ticket> = (0..cap)
            .map(|i| a.admit(ip(i as u8 % 4)).unwrap())
            .collect();
        let proven = a.admit(ip(9)).unwrap();
        assert!(*held[0].evicted.borrow(), "the oldest made room");
        proven.prove();
        assert_eq!(a.counts(), (cap, cap - 1));
        held.remove(0);
        assert_eq!(
            a.counts(),
            (cap, cap - 1),
            "an evicted ticket was uncounted"
        );
        // One address cannot hold more than its share.
        let from_one: Vec<Ticket> = (0..UNPROVEN_PER_ADDRESS + 3)
            .map(|_| a.admit(ip(7)).unwrap())
            .collect();
        let live = from_one.iter().filter(|t| !*t.evicted.borrow()).count();
        assert_eq!(live, UNPROVEN_PER_ADDRESS);
        drop(from_one);
        drop(held);
        assert_eq!(a.counts(), (1, 0));
        drop(proven);
        assert_eq!(a.counts(), (0, 0));
    }

    #[test]
    fn proven_connections_are_never_evicted() {
        let a = Admission::new(4);
        let proven: Vec<Ticket> = (0..4).map(|i| a.admit(ip(i)).unwrap()).collect();
        proven.iter().for_each(Ticket::prove);
        assert!(a.admit(ip(5)).is_none(), "full of proven connections");
        assert!(proven.iter().all(|t| !*t.evicted.borrow()));
    }
}
