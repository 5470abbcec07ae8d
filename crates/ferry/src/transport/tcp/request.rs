//! A request's state on a connection, in either role, and the stripes that
//! tie the parts of one transfer together.

use super::*;

/// The part a request plays in a cross-memory-attach transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cma {
    /// The bytes go in `Data` frames.
    No,
    /// This side is the source and lent its memory (`Lease` sent).
    Lent,
    /// A READ asked for a lease; the answer is a `Lease` or `Data` frames.
    Requested,
    /// A pulled WRITE whose `Lease` has not arrived yet.
    AwaitLease,
    /// This side is the destination and copies from the peer.
    Pulling,
}

/// Where a connection stands in setting up cross-memory attach.
pub(super) enum Attaching {
    /// Nothing received yet.
    Idle,
    /// The passive side answered the active side's nonce (`None`: declined).
    Offered(Option<([u8; 16], [u8; 16])>),
    /// Set up, or declined.
    Done,
}

/// An active operation waiting for its remote.
pub(super) struct ActiveReq {
    pub(super) kind: OperationKind,
    pub(super) region: Arc<Region>,
    pub(super) shared: Arc<OpShared>,
    pub(super) cursor: Cursor,
    pub(super) cma: Cma,
    /// The transfer is striped and this request carries one part of it.
    pub(super) part: Option<Part>,
}

/// The part of a striped transfer that a request carries.
pub(super) struct Part {
    pub(super) stripe: Arc<Stripe>,
    pub(super) index: u16,
    /// A part other than 0 that has ended (landed, or confirmed): it stays
    /// in the table until the operation ends, so that an `Abort` or a lost
    /// connection on it still ends the operation.
    pub(super) done: bool,
    /// The source of a part other than 0 has sent all of it: only then may
    /// the destination confirm it.
    pub(super) sent: bool,
}

impl Part {
    pub(super) fn new(stripe: Arc<Stripe>, index: u16) -> Option<Self> {
        Some(Part {
            stripe,
            index,
            done: false,
            sent: false,
        })
    }
}

/// Whether `part` is of a striped transfer whose other parts have not all
/// landed (a commit now would be premature).
pub(super) fn parts_missing(part: &Option<Part>) -> bool {
    part.as_ref().is_some_and(|p| !p.stripe.all_done())
}

/// A passive operation bound to a request on this connection.
pub(super) struct PassiveReq {
    pub(super) exposure: Arc<Exposure>,
    /// For writes: where the next payload byte must go.
    pub(super) cursor: Option<Cursor>,
    pub(super) cma: Cma,
    /// As in [`ActiveReq`].
    pub(super) part: Option<Part>,
}

/// Binds request `o` of `conn` to an exposure: a request of its own binds a
/// free exposure; a part of a striped transfer makes the stripe (the first
/// part to arrive) or joins it (`joined`: the stripe it belongs to).
pub(super) fn bind_request(
    conn: &Arc<Conn>,
    o: &Open,
    bound: Option<&Arc<dyn PassiveLink>>,
    joined: &mut Option<Arc<Stripe>>,
) -> Result<Arc<dyn PassiveLink>, Refusal> {
    if o.parts <= 1 {
        return match bound {
            None => Ok(Arc::new(ReqLink {
                conn: Arc::downgrade(conn),
                req: o.req,
            })),
            Some(_) => Err((AbortReason::Busy, String::new())),
        };
    }
    let stripe = match bound {
        None => Stripe::new(o.parts, conn.peer.clone()),
        // Another part of the same transfer, from the same worker.
        Some(b) => match b.as_any().downcast_ref::<Stripe>() {
            Some(s) if s.parts == o.parts && s.peer == conn.peer => {
                s.me.upgrade().ok_or((AbortReason::Busy, String::new()))?
            }
            _ => return Err((AbortReason::Busy, String::new())),
        },
    };
    if !stripe.bind(o.part, Arc::downgrade(conn), o.req, None) {
        return Err((AbortReason::Busy, format!("part {} bound twice", o.part)));
    }
    *joined = Some(stripe.clone());
    Ok(stripe)
}

/// The binding of an exposure to one request on an accepted connection.
pub(super) struct ReqLink {
    pub(super) conn: Weak<Conn>,
    pub(super) req: u64,
}

impl PassiveLink for ReqLink {
    fn leave(&self) {}

    fn ended(&self, _how: Option<&Refusal>) {
        // The reader that ended it tells the remote itself.
    }

    fn withdrawn(&self, _how: Option<Refusal>) {
        if let Some(conn) = self.conn.upgrade() {
            conn.forget_passive(self.req);
            conn.abort_detached(self.req, AbortReason::Cancelled, String::new());
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl PassiveLink for Stripe {
    fn leave(&self) {
        self.abandon(None);
    }

    fn ended(&self, how: Option<&Refusal>) {
        if let Some(how) = how {
            self.abandon(Some(how.clone()));
        }
    }

    fn withdrawn(&self, how: Option<Refusal>) {
        self.abandon(how);
    }

    fn joinable_by(&self) -> Option<&str> {
        Some(&self.peer)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A transfer split into parts, each a request on a connection of its own
/// (see `docs/transports.md`, "Striping"). Part 0 travels on the first
/// connection and commits the whole: its source sends the sealing `Finish`
/// only after the destination has confirmed every other part.
pub(crate) struct Stripe {
    /// This stripe, for a part that joins it.
    pub(super) me: Weak<Stripe>,
    pub(super) parts: u16,
    /// The worker that sends the parts (passive side): all must come from it.
    pub(super) peer: String,
    /// Parts other than 0 whose bytes have all landed: the destination
    /// counts them as their `Finish` arrives, the source as their
    /// confirmation does.
    pub(super) done: watch::Sender<u16>,
    /// The request of each part, once bound.
    pub(super) members: Mutex<Vec<Option<Member>>>,
}

#[derive(Clone)]
pub(super) struct Member {
    pub(super) conn: Weak<Conn>,
    pub(super) req: u64,
    /// Active side: set once the part's `Open` is on the wire.
    pub(super) opened: Option<Arc<watch::Sender<bool>>>,
}

impl Stripe {
    pub(crate) fn new(parts: u16, peer: String) -> Arc<Self> {
        Arc::new_cyclic(|me| Stripe {
            me: me.clone(),
            parts,
            peer,
            done: watch::Sender::new(0),
            members: Mutex::new((0..parts).map(|_| None).collect()),
        })
    }

    /// Records the request that carries `part`; false if it has one already.
    pub(crate) fn bind(
        &self,
        part: u16,
        conn: Weak<Conn>,
        req: u64,
        opened: Option<Arc<watch::Sender<bool>>>,
    ) -> bool {
        let mut m = lock(&self.members);
        match m.get_mut(usize::from(part)) {
            Some(slot @ None) => {
                *slot = Some(Member { conn, req, opened });
                true
            }
            _ => false,
        }
    }

    pub(super) fn part_done(&self) {
        self.done.send_modify(|n| *n += 1);
    }

    pub(super) fn all_done(&self) -> bool {
        *self.done.borrow() + 1 >= self.parts
    }

    /// Ends every part's request still in a connection's table; with a
    /// reason, each part is also told with an `Abort` (after its `Open`,
    /// which it must not overtake). May be called again (first without a
    /// reason, to leave the tables before waking waiters, then with one).
    pub(crate) fn abandon(&self, abort: Option<(AbortReason, String)>) {
        let members: Vec<Member> = lock(&self.members).iter().flatten().cloned().collect();
        for m in members {
            let Some(conn) = m.conn.upgrade() else {
                continue;
            };
            lock(&conn.active).remove(&m.req);
            lock(&conn.passive).remove(&m.req);
            // Told even if its request has left the table: on the passive
            // side a part bound just before the end may not be in it yet
            // (its reader inserts it after binding, then sees the end and
            // leaves it out); an `Abort` for a request that ended is ignored.
            let Some((reason, detail)) = abort.clone() else {
                continue;
            };
            match m.opened {
                Some(o) if !*o.borrow() => {
                    let mut o = o.subscribe();
                    let h = conn.handle.clone();
                    h.spawn(async move {
                        until(&mut o, |o| *o).await;
                        conn.abort_detached(m.req, reason, detail);
                    });
                }
                _ => conn.abort_detached(m.req, reason, detail),
            }
        }
    }
}

/// How a stream of `Data` frames ends.
pub(super) enum Last {
    /// With the `Finish` that seals the operation (not striped).
    Seal,
    /// With a plain `Finish`: a part other than 0, which the destination
    /// confirms.
    Part,
    /// Part 0: with the sealing `Finish`, once every other part is confirmed.
    SealAfter(Arc<Stripe>),
}
