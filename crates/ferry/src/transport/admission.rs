//! Which accepted connections a connector keeps, so that nobody can lock
//! real peers out by opening connections.
//!
//! Every accepted connection holds a [`Ticket`] until it closes. A
//! connection is *busy* while it carries a live operation (one granted by a
//! valid capability that has not ended); busy connections are never closed
//! to make room. The others are *fresh* (they never carried an operation:
//! anyone who can reach the port can make one) or *spent* (they carried
//! one, and none is live now: a pooled connection between transfers, or
//! one an attacker keeps after its capability was used). The bounds:
//!
//! - at most `max` connections in all ([`DEFAULT_MAX_CONNECTIONS`], see
//!   `ConnectorBuilder::max_connections`);
//! - at most `max / 8` fresh ones ([`unproven_cap`]), and at most half of
//!   that from one *group* of addresses ([`per_group_cap`]): a network of
//!   `/24` for IPv4 and `/64` for IPv6 by default
//!   (`ConnectorBuilder::admission_prefixes`), since whoever holds one
//!   address of a network usually holds many (the loopback range has
//!   millions, one IPv6 `/64` has 2^64).
//!
//! A new connection beyond a bound makes room by closing another: for a
//! bound on fresh connections a fresh one, for the total a fresh or a spent
//! one (never a busy one). The victim is chosen among the candidates: those
//! that did not authenticate with the shared secret go first, then those
//! of the most crowded group, then the oldest (the longest idle, for a
//! spent one). Only when every connection is busy is the new one refused.
//! So a flood from one network evicts its own connections, never those of
//! a peer in another, less crowded network; and with a secret, a flood of
//! connections that cannot authenticate never evicts one that did (while
//! one of the flood's own is left to evict).

#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::sync::lock;
use tokio::sync::watch;

/// Accepted connections a connector keeps at most, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The fewest fresh connections a connector keeps room for (when its
/// `max_connections` allows as many).
pub const MIN_UNPROVEN: usize = 16;
/// IPv4 addresses of one network of this prefix length form one group,
/// by default.
pub const DEFAULT_IPV4_PREFIX: u8 = 24;
/// IPv6 addresses of one network of this prefix length form one group,
/// by default.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The most fresh connections (that never carried an operation) for a
/// total bound of `max`: an eighth of it, at least `MIN_UNPROVEN` (16).
pub fn unproven_cap(max: usize) -> usize {
    (max / 8).max(MIN_UNPROVEN).min(max)
}

/// The most fresh connections from one group of addresses for a total bound
/// of `max`: half of [`unproven_cap`].
pub fn per_group_cap(max: usize) -> usize {
    (unproven_cap(max) / 2).max(1)
}

/// How addresses are grouped: by network, of these prefix lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grouping {
    pub(crate) v4: u8,
    pub(crate) v6: u8,
}

impl Default for Grouping {
    fn default() -> Self {
        Grouping {
            v4: DEFAULT_IPV4_PREFIX,
            v6: DEFAULT_IPV6_PREFIX,
        }
    }
}

/// A network: the address with its host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Group {
    V4(u32),
    V6(u128),
}

impl Grouping {
    fn group(&self, addr: IpAddr) -> Group {
        // An IPv4 peer of a dual-stack listener arrives as `::ffff:a.b.c.d`.
        match addr.to_canonical() {
            IpAddr::V4(a) => {
                let bits = u32::from(self.v4.min(32));
                Group::V4(u32::from(a) & u32::MAX.checked_shl(32 - bits).unwrap_or(0))
            }
            IpAddr::V6(a) => {
                let bits = u32::from(self.v6.min(128));
                Group::V6(u128::from(a) & u128::MAX.checked_shl(128 - bits).unwrap_or(0))
            }
        }
    }
}

/// What the admission asks of an accepted connection.
pub(crate) trait Activity: Send + Sync {
    /// How long the connection has carried no live operation; `None` if it
    /// carries one now (or cannot tell without waiting).
    fn idle(&self) -> Option<Duration>;
}

struct Entry {
    group: Group,
    admitted: Instant,
    /// It proved it holds the shared secret.
    authenticated: bool,
    /// It carried an operation: no longer fresh.
    served: bool,
    /// Whether it carries one now (once the connection exists).
    activity: Option<Weak<dyn Activity>>,
    evict: watch::Sender<bool>,
}

/// Which connections may make room.
#[derive(Clone, Copy)]
enum Scope {
    FreshIn(Group),
    Fresh,
    Any,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Every connection held, by the order of admission.
    entries: BTreeMap<u64, Entry>,
    fresh: usize,
    fresh_in: HashMap<Group, usize>,
}

impl State {
    fn uncount_fresh(&mut self, group: Group) {
        self.fresh -= 1;
        if let Some(n) = self.fresh_in.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                self.fresh_in.remove(&group);
            }
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        if !e.served {
            self.uncount_fresh(e.group);
        }
        Some(e)
    }

    fn evict(&mut self, id: u64) {
        if let Some(e) = self.remove(id) {
            e.evict.send_replace(true);
        }
    }

    /// The connection to close to make room (see the module
    /// documentation), if any may be.
    fn victim(&self, scope: Scope) -> Option<u64> {
        let mut candidates: Vec<(u64, Group, bool, Duration)> = Vec::new();
        for (&id, e) in &self.entries {
            let in_scope = match scope {
                Scope::FreshIn(g) => !e.served && e.group == g,
                Scope::Fresh => !e.served,
                Scope::Any => true,
            };
            if !in_scope {
                continue;
            }
            let idle = if e.served {
                match e.activity.as_ref().and_then(Weak::upgrade) {
                    Some(a) => match a.idle() {
                        Some(d) => d,
                        None => continue,
                    },
                    // Closing: its place comes back as soon as it drops.
                    None => continue,
                }
            } else {
                e.admitted.elapsed()
            };
            candidates.push((id, e.group, e.authenticated, idle));
        }
        if candidates.iter().any(|c| !c.2) {
            candidates.retain(|c| !c.2);
        }
        let mut crowd: HashMap<Group, usize> = HashMap::new();
        for c in &candidates {
            *crowd.entry(c.1).or_default() += 1;
        }
        candidates
            .iter()
            .max_by_key(|c| (crowd[&c.1], c.3, Reverse(c.0)))
            .map(|c| c.0)
    }
}

/// The accepted connections of one connector.
pub(crate) struct Admission {
    max: usize,
    fresh_cap: usize,
    per_group: usize,
    grouping: Grouping,
    state: Arc<Mutex<State>>,
}

/// One accepted connection's place; given back when dropped.
pub(crate) struct Ticket {
    id: u64,
    state: Arc<Mutex<State>>,
    /// Becomes true when the connection must close to make room.
    pub(crate) evicted: watch::Receiver<bool>,
    /// It carried an operation (its entry knows it too).
    served: AtomicBool,
}

impl Admission {
    pub(crate) fn new(max: usize, grouping: Grouping) -> Self {
        let max = max.max(1);
        Admission {
            max,
            fresh_cap: unproven_cap(max),
            per_group: per_group_cap(max),
            grouping,
            state: Arc::default(),
        }
    }

    /// A place for a connection from `addr`, making room by closing
    /// another if need be; `None`: every place is held by a busy
    /// connection.
    pub(crate) fn admit(&self, addr: IpAddr) -> Option<Ticket> {
        let group = self.grouping.group(addr);
        let mut s = lock(&self.state);
        if s.fresh_in.get(&group).copied().unwrap_or(0) >= self.per_group {
            if let Some(v) = s.victim(Scope::FreshIn(group)) {
                s.evict(v);
            }
        }
        if s.fresh >= self.fresh_cap {
            if let Some(v) = s.victim(Scope::Fresh) {
                s.evict(v);
            }
        }
        if s.entries.len() >= self.max {
            let v = s.victim(Scope::Any)?;
            s.evict(v);
        }
        let (evict, evicted) = watch::channel(false);
        s.next += 1;
        let id = s.next;
        s.fresh += 1;
        *s.fresh_in.entry(group).or_default() += 1;
        s.entries.insert(
            id,
            Entry {
                group,
                admitted: Instant::now(),
                authenticated: false,
                served: false,
                activity: None,
                evict,
            },
        );
        Some(Ticket {
            id,
            state: self.state.clone(),
            evicted,
            served: AtomicBool::new(false),
        })
    }

    /// `(total, fresh)` connections held now.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let s = lock(&self.state);
        (s.entries.len(), s.fresh)
    }
}

impl Ticket {
    /// The connection proved it holds the shared secret.
    pub(crate) fn authenticated(&self) {
        if let Some(e) = lock(&self.state).entries.get_mut(&self.id) {
            e.authenticated = true;
        }
    }

    /// Where to ask whether the connection carries a live operation.
    pub(crate) fn watch(&self, activity: Weak<dyn Activity>) {
        if let Some(e) = lock(&self.state).entries.get_mut(&self.id) {
            e.activity = Some(activity);
        }
    }

    /// The connection presented a valid capability: it is no longer fresh,
    /// and is never closed to make room while it carries a live operation.
    pub(crate) fn prove(&self) {
        if self.served.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut s = lock(&self.state);
        let group = match s.entries.get_mut(&self.id) {
            Some(e) if !e.served => {
                e.served = true;
                e.group
            }
            _ => return,
        };
        s.uncount_fresh(group);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Gone already if it was evicted.
        lock(&self.state).remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, n: u8) -> IpAddr {
        IpAddr::from([10, 0, a, n])
    }

    struct Busy(AtomicBool);

    impl Activity for Busy {
        fn idle(&self) -> Option<Duration> {
            (!self.0.load(Ordering::Relaxed)).then_some(Duration::ZERO)
        }
    }

    fn evicted(t: &Ticket) -> bool {
        *t.evicted.borrow()
    }

    #[test]
    fn groups_are_networks() {
        let g = Grouping::default();
        let v4 = |s: &str| g.group(s.parse().unwrap());
        assert_eq!(v4("10.1.2.3"), v4("10.1.2.200"));
        assert_ne!(v4("10.1.2.3"), v4("10.1.3.3"));
        assert_eq!(v4("::ffff:10.1.2.3"), v4("10.1.2.9"));
        assert_eq!(v4("2001:db8::1"), v4("2001:db8::ffff:1:2"));
        assert_ne!(v4("2001:db8::1"), v4("2001:db8:0:1::1"));
        let all = Grouping { v4: 0, v6: 0 };
        assert_eq!(
            all.group("1.2.3.4".parse().unwrap()),
            all.group("200.2.3.4".parse().unwrap())
        );
        let one = Grouping { v4: 32, v6: 128 };
        assert_ne!(
            one.group("1.2.3.4".parse().unwrap()),
            one.group("1.2.3.5".parse().unwrap())
        );
    }

    #[test]
    fn the_most_crowded_group_makes_room() {
        let a = Admission::new(256, Grouping::default());
        let (cap, per) = (unproven_cap(256), per_group_cap(256));
        assert_eq!((cap, per), (32, 16));
        // One network holds at most its share.
        let one: Vec<Ticket> = (0..40).map(|i| a.admit(ip(7, i)).unwrap()).collect();
        assert_eq!(one.iter().filter(|t| !evicted(t)).count(), per);
        assert_eq!(a.counts(), (per, per));
        drop(one);
        // A peer from a network of its own, then a flood from four.
        let peer = a.admit(ip(9, 1)).unwrap();
        let flood: Vec<Ticket> = (0..200).map(|i| a.admit(ip(i % 4, i)).unwrap()).collect();
        assert!(!evicted(&peer), "the peer of the least crowded group stays");
        let live = flood.iter().filter(|t| !evicted(t)).count();
        assert_eq!(live, cap - 1);
        assert_eq!(a.counts(), (cap, cap));
        drop(flood);
        assert_eq!(a.counts(), (1, 1));
    }

    #[test]
    fn a_flood_that_cannot_authenticate_never_evicts_one_that_did() {
        let a = Admission::new(128, Grouping::default());
        let cap = unproven_cap(128);
        let peer = a.admit(ip(0, 1)).unwrap();
        peer.authenticated();
        // As many networks as places, one connection each: no group is
        // more crowded than the peer's.
        let flood: Vec<Ticket> = (0..100u8)
            .map(|i| a.admit(IpAddr::from([10, i, 0, 1])).unwrap())
            .collect();
        assert!(!evicted(&peer));
        assert_eq!(flood.iter().filter(|t| !evicted(t)).count(), cap - 1);
    }

    #[test]
    fn busy_connections_stay_and_spent_ones_make_room() {
        let a = Admission::new(4, Grouping::default());
        let busy = Arc::new(Busy(AtomicBool::new(true)));
        let held: Vec<Ticket> = (0..4).map(|i| a.admit(ip(i, 1)).unwrap()).collect();
        for t in &held {
            t.watch(Arc::downgrade(&busy) as Weak<dyn Activity>);
            t.prove();
        }
        assert_eq!(a.counts(), (4, 0));
        assert!(a.admit(ip(5, 1)).is_none(), "full of busy connections");
        assert!(held.iter().all(|t| !evicted(t)));
        // Their operations ended: the places are spent, and come back.
        busy.0.store(false, Ordering::Relaxed);
        let new = a.admit(ip(5, 1)).unwrap();
        assert_eq!(held.iter().filter(|t| evicted(t)).count(), 1);
        assert_eq!(a.counts(), (4, 1));
        drop(held);
        assert_eq!(a.counts(), (1, 1));
        drop(new);
        assert_eq!(a.counts(), (0, 0));
    }
}
