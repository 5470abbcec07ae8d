//! Places for the connections of a small request/response server (the
//! control plane's HTTP server, the metrics endpoint), so that silent
//! clients cannot keep a place from a client that sends a request.
//!
//! A server accepts every connection first and asks for a place here. A
//! connection is *waiting* until it has sent a complete request, then
//! *serving*. When every place is taken, a new connection takes the place
//! of the oldest waiting one (whose handle is handed back, to close it);
//! only when every place is serving is the new one refused. A client that
//! sends its request as it connects is waiting for the moment it takes to
//! read it, and is then the newest: evicting it takes as many new
//! connections as there are places, within that moment.

use std::collections::VecDeque;

/// A connection's place.
pub type SlotId = u64;

struct Entry<H> {
    id: SlotId,
    serving: bool,
    handle: Option<H>,
}

/// The places, with one handle `H` per connection (what closes it).
pub struct Slots<H> {
    max: usize,
    next: SlotId,
    /// In order of arrival.
    entries: VecDeque<Entry<H>>,
}

/// What [`Slots::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<H> {
    /// A place, free or taken from the oldest waiting connection, whose
    /// handle comes back (to close it).
    Admitted {
        /// The new connection's place.
        id: SlotId,
        /// The connection evicted for it.
        evicted: Option<H>,
    },
    /// Every place is serving: close the new connection.
    Refused,
}

impl<H> Slots<H> {
    /// At most `max` connections (at least 1).
    pub fn new(max: usize) -> Slots<H> {
        Slots {
            max: max.max(1),
            next: 0,
            entries: VecDeque::new(),
        }
    }

    /// A place for a new connection, waiting; give it its handle with
    /// [`attach`](Self::attach).
    pub fn admit(&mut self) -> Admission<H> {
        let mut evicted = None;
        if self.entries.len() >= self.max {
            let Some(i) = self.entries.iter().position(|e| !e.serving) else {
                return Admission::Refused;
            };
            evicted = self.entries.remove(i).and_then(|e| e.handle);
        }
        let id = self.next;
        self.next += 1;
        self.entries.push_back(Entry {
            id,
            serving: false,
            handle: None,
        });
        Admission::Admitted { id, evicted }
    }

    /// Gives the connection at `id` its handle; `false` if it has no place
    /// any more.
    pub fn attach(&mut self, id: SlotId, handle: H) -> bool {
        match self.entries.iter_mut().find(|e| e.id == id) {
            Some(e) => {
                e.handle = Some(handle);
                true
            }
            None => false,
        }
    }

    /// The connection at `id` has sent a complete request: it keeps its
    /// place until [`remove`](Self::remove). `false` if it was evicted.
    pub fn serving(&mut self, id: SlotId) -> bool {
        match self.entries.iter_mut().find(|e| e.id == id) {
            Some(e) => {
                e.serving = true;
                true
            }
            None => false,
        }
    }

    /// The connection at `id` ended: its place is free.
    pub fn remove(&mut self, id: SlotId) {
        self.entries.retain(|e| e.id != id);
    }

    /// Connections holding a place.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no connection holds a place.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Connections that have not sent a complete request yet.
    pub fn waiting(&self) -> usize {
        self.entries.iter().filter(|e| !e.serving).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(s: &mut Slots<u32>, handle: u32) -> Admission<u32> {
        let a = s.admit();
        if let Admission::Admitted { id, .. } = a {
            assert!(s.attach(id, handle));
        }
        a
    }

    #[test]
    fn the_oldest_waiting_connection_gives_way_and_serving_ones_never() {
        let mut s = Slots::new(3);
        let ids: Vec<SlotId> = (0..3)
            .map(|h| match admit(&mut s, h) {
                Admission::Admitted { id, evicted: None } => id,
                a => panic!("{a:?}"),
            })
            .collect();
        // 0 serves; 1 and 2 wait: a fourth evicts 1, the oldest waiting.
        assert!(s.serving(ids[0]));
        assert!(matches!(
            admit(&mut s, 3),
            Admission::Admitted {
                evicted: Some(1),
                ..
            }
        ));
        assert!(!s.serving(ids[1]), "evicted");
        assert_eq!((s.len(), s.waiting()), (3, 2));
        // Everything serving: refused.
        let mut s = Slots::new(2);
        for h in 0..2 {
            let Admission::Admitted { id, .. } = admit(&mut s, h) else {
                panic!()
            };
            s.serving(id);
        }
        assert_eq!(admit(&mut s, 9), Admission::Refused);
        s.remove(0);
        assert!(matches!(
            admit(&mut s, 9),
            Admission::Admitted { evicted: None, .. }
        ));
    }

    #[test]
    fn a_flood_of_waiting_connections_stays_bounded() {
        let mut s = Slots::new(4);
        for h in 0..1000 {
            assert!(matches!(admit(&mut s, h), Admission::Admitted { .. }));
        }
        assert_eq!(s.len(), 4);
    }
}
