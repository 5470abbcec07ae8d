//! A request's state on a connection, in either role, and the stripes that
//! tie the parts of one transfer together.

use std::sync::{Arc, Mutex, Weak};

use ferry_proto::session::{Fence, StripeState};
use ferry_proto::wire::AbortReason;
use ferry_proto::OperationStatus;
use tokio::sync::watch;

use crate::exposure::{Exposure, Exposures, PassiveLink, Refusal};
use crate::outcome::OpShared;
use crate::region::Region;
use crate::transport::stall::CopySlot;
use crate::Error;

use super::util::*;

/// The driver's handle on a request, carried by the session: the memory
/// (its region and outcome) and how the operation ends.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) region: Arc<Region>,
    pub(super) shared: Arc<OpShared>,
    /// Passive side: the exposure, ended through its table.
    pub(super) exposure: Option<(Arc<Exposure>, Arc<Exposures>)>,
    /// The transfer is striped: all its parts.
    pub(super) stripe: Option<Arc<Stripe>>,
    /// The copy slot taken for the copy this side will make of a lease
    /// (`stall.rs`), until the copy takes it (or the request ends).
    pub(super) slot: Option<Arc<Mutex<Option<CopySlot>>>>,
}

impl Fence for Target {
    fn is_sealed(&self) -> bool {
        self.shared.is_sealed()
    }

    fn is_open(&self) -> bool {
        self.region.is_open()
    }

    fn can_commit(&self) -> bool {
        self.stripe.as_ref().map_or(true, |s| s.all_done())
    }

    fn moves_in_band(&self) -> bool {
        // Device memory is staged through host memory where CUDA is here
        // (`staged.rs`); a device region exists only where it is (the
        // connector refuses it otherwise), so this is the net behind that.
        self.region.is_host() || crate::cuda::available()
    }

    fn is_device(&self) -> bool {
        !self.region.is_host()
    }
}

impl Target {
    pub(super) fn active(
        region: Arc<Region>,
        shared: Arc<OpShared>,
        stripe: Option<Arc<Stripe>>,
    ) -> Self {
        Target {
            region,
            shared,
            exposure: None,
            stripe,
            slot: None,
        }
    }

    pub(super) fn passive(
        e: Arc<Exposure>,
        table: Arc<Exposures>,
        stripe: Option<Arc<Stripe>>,
    ) -> Self {
        Target {
            region: e.region.clone(),
            shared: e.shared.clone(),
            exposure: Some((e, table)),
            stripe,
            slot: None,
        }
    }

    /// The request holds `slot` for the copy it will make of a lease.
    pub(super) fn with_slot(mut self, slot: Option<CopySlot>) -> Self {
        self.slot = slot.map(|s| Arc::new(Mutex::new(Some(s))));
        self
    }

    /// The copy slot taken for this request, if any (once).
    pub(super) fn take_slot(&self) -> Option<CopySlot> {
        self.slot.as_ref().and_then(|s| lock(s).take())
    }

    /// Ends the operation (its region closes first); true if this call
    /// ended it. The other parts of a striped active transfer leave their
    /// tables before anyone wakes.
    pub(super) fn end(&self, status: OperationStatus, error: Option<Error>) -> bool {
        match &self.exposure {
            Some((e, table)) => table.finish(e, status, error),
            None => {
                if let Some(s) = &self.stripe {
                    s.abandon(None);
                }
                self.region.close();
                self.shared.end(status, error)
            }
        }
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
    /// Which parts are bound and done (the rules: `ferry_proto::session`).
    pub(super) state: Mutex<StripeState>,
}

/// What a stripe needs of the connection that carries one of its parts.
pub(super) trait PartConn: Send + Sync {
    /// The part's request leaves the connection's session.
    fn forget(&self, req: u64);
    /// Tells the peer that the part's request ended, once its `Open` is on
    /// the wire (`opened`, if it is not yet).
    fn abort_after(
        &self,
        req: u64,
        reason: AbortReason,
        detail: String,
        opened: Option<watch::Receiver<bool>>,
    );
}

#[derive(Clone)]
pub(super) struct Member {
    pub(super) conn: Weak<dyn PartConn>,
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
            state: Mutex::new(StripeState::new(parts)),
        })
    }

    /// Records the request that carries `part`; false if it has one already.
    pub(crate) fn bind(
        &self,
        part: u16,
        conn: Weak<dyn PartConn>,
        req: u64,
        opened: Option<Arc<watch::Sender<bool>>>,
    ) -> bool {
        if lock(&self.state).bind(part).is_err() {
            return false;
        }
        let mut m = lock(&self.members);
        match m.get_mut(usize::from(part)) {
            Some(slot) => {
                *slot = Some(Member { conn, req, opened });
                true
            }
            None => false,
        }
    }

    pub(super) fn part_done(&self) {
        let done = {
            let mut s = lock(&self.state);
            s.part_done();
            s.done()
        };
        self.done.send_replace(done);
    }

    pub(super) fn all_done(&self) -> bool {
        lock(&self.state).can_commit()
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
            conn.forget(m.req);
            // Told even if its request has left the table: on the passive
            // side a part bound just before the end may not be in it yet
            // (its reader inserts it after binding, then sees the end and
            // leaves it out); an `Abort` for a request that ended is ignored.
            let Some((reason, detail)) = abort.clone() else {
                continue;
            };
            let opened = m.opened.filter(|o| !*o.borrow()).map(|o| o.subscribe());
            conn.abort_after(m.req, reason, detail, opened);
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
