//! The table of memory this connector exposes: the capabilities it has
//! handed out, and the checks every remote request passes before it may
//! touch a byte.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_proto::session::{self, Caps};
use ferry_proto::wire::{AbortReason, Open};
use ferry_proto::{OperationKind, OperationStatus, Token};

use crate::error::Error;
use crate::host;
use crate::outcome::OpShared;
use crate::region::Region;
use crate::sync::lock;

pub(crate) struct Exposure {
    pub(crate) op_id: u64,
    token: Token,
    pub(crate) kind: OperationKind,
    sizes: Vec<u64>,
    pub(crate) region: Arc<Region>,
    pub(crate) shared: Arc<OpShared>,
    /// Who is transferring this operation right now.
    binding: Mutex<Option<Arc<dyn PassiveLink>>>,
}

/// Why a request was refused: the wire's reason and a detail for the peer.
pub(crate) type Refusal = (AbortReason, String);

/// The remote side an exposure is bound to while it transfers, as the
/// transport that carries it implements it: the table talks to bindings
/// only through this trait, never to a transport's own types.
pub(crate) trait PassiveLink: Send + Sync {
    /// The transfer ended here: leave the transport's tables (called before
    /// anyone waking on the end can look).
    fn leave(&self);
    /// The transfer ended here without completing (`how`, for the remote):
    /// parts still running elsewhere are told. Called after the outcome is
    /// published; a link whose reader settled the end itself does nothing.
    fn ended(&self, how: Option<&Refusal>);
    /// The owner withdrew the memory (cancel or drop): leave the tables and
    /// tell the remote, as it really ended (`how`).
    fn withdrawn(&self, how: Option<Refusal>);
    /// For a binding that later requests may join (the parts of a striped
    /// transfer), the worker they must come from: how such a transfer ended
    /// is remembered for it.
    fn joinable_by(&self) -> Option<&str> {
        None
    }
    /// The binding as its transport's own type (to join it).
    fn as_any(&self) -> &dyn Any;
}

/// A request as it asks to bind an exposure: the worker it comes from, and
/// how it binds (`None`: the exposure is free; `Some`: bound already, to be
/// joined or refused).
pub(crate) type Bind<'a> =
    dyn FnMut(Option<&Arc<dyn PassiveLink>>) -> Result<Arc<dyn PassiveLink>, Refusal> + 'a;

#[derive(Default)]
pub(crate) struct Exposures {
    map: Mutex<HashMap<u64, Arc<Exposure>>>,
    next_id: AtomicU64,
    /// Operations that left the table (the most recent [`ENDED`] records),
    /// with their tokens: whoever presents the token of one is told that it
    /// ended, and anyone else gets the one refusal of an unknown operation.
    /// A striped one that ended without completing also keeps how, for its
    /// own peer: a part whose `Open` arrives after the end (the parts travel
    /// on independent connections) is told how it ended, as the bound parts
    /// were, instead of just "ended" — so a cancel here reads as a cancel at
    /// the remote whichever part it hears of first.
    ended: Mutex<EndedLog>,
}

/// The records of ended operations, oldest first, and where each
/// operation's records are (looked up by id, so that an unknown id costs
/// what a known one does: no scan a peer could time).
#[derive(Default)]
struct EndedLog {
    order: VecDeque<u64>,
    by_id: HashMap<u64, Ended>,
}

/// A record of an operation that left the table.
struct Ended {
    token: Token,
    /// For a striped operation that ended without completing: the peer it
    /// was bound to, and how it ended (the latest word on it).
    stripe: Option<Box<(String, (AbortReason, String))>>,
    /// It expired (`OpCore::expire`): whoever presents its token is told
    /// so.
    expired: bool,
}

/// How many records of ended operations [`Exposures`] keeps.
const ENDED: usize = 4096;

/// The one answer to a request without a valid token, whatever it named:
/// a live operation, an ended one, or one never issued.
fn unknown() -> (AbortReason, String) {
    (AbortReason::UnknownOperation, String::new())
}

impl Exposures {
    /// Lists an operation; `shared` makes its outcome, given its id.
    pub(crate) fn insert(
        &self,
        kind: OperationKind,
        sizes: Vec<u64>,
        region: Arc<Region>,
        shared: impl FnOnce(u64, &[u64]) -> Arc<OpShared>,
    ) -> (Arc<Exposure>, Token) {
        let op_id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let token = host::random_token();
        let shared = shared(op_id, &sizes);
        let e = Arc::new(Exposure {
            op_id,
            token,
            kind,
            sizes,
            region,
            shared,
            binding: Mutex::new(None),
        });
        lock(&self.map).insert(op_id, e.clone());
        (e, token)
    }

    /// How many operations are exposed right now.
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// Checks a remote's request, from worker `peer`, against the
    /// capability it presents and binds the operation to it: `bind` makes
    /// the binding of a free exposure, or joins (or refuses) the one it has
    /// (a further part of a striped transfer). Nothing is touched when this
    /// fails.
    ///
    /// An operation over device memory is refused (`DeviceMemory`, before
    /// it is bound, so that it stays free for a peer that can lend) unless
    /// the request moves it by lending on a connection whose handshake found
    /// `caps` ([`session::device_refusal`]): device memory never moves in
    /// band.
    pub(crate) fn open(
        &self,
        o: &Open,
        peer: Option<&str>,
        caps: Caps,
        bind: &mut Bind<'_>,
    ) -> Result<(Arc<Exposure>, Arc<dyn PassiveLink>), Refusal> {
        let e = self.check(o, peer, caps)?;
        let ended = || {
            self.how_it_ended(o, peer)
                .unwrap_or_else(|| ended_here(o.op_id))
        };
        let mut binding = lock(&e.binding);
        let link = match &*binding {
            None => {
                if !e.shared.start() {
                    return Err(ended());
                }
                e.shared.opened(peer);
                let link = bind(None)?;
                *binding = Some(link.clone());
                link
            }
            Some(b) => {
                if e.shared.status().is_terminal() {
                    return Err(ended());
                }
                bind(Some(b))?
            }
        };
        drop(binding);
        Ok((e, link))
    }

    /// The checks of [`open`](Self::open), binding nothing: the exposure
    /// request `o` names, or how `open` would refuse it (so that a refusal
    /// of the transport's own, such as no copy slot, goes only to a holder
    /// of a valid capability: every other request learns only that).
    pub(crate) fn check(
        &self,
        o: &Open,
        peer: Option<&str>,
        caps: Caps,
    ) -> Result<Arc<Exposure>, Refusal> {
        let Some(e) = lock(&self.map).get(&o.op_id).cloned() else {
            return Err(self.how_it_ended(o, peer).unwrap_or_else(unknown));
        };
        if !e.token.ct_eq(&o.token) {
            return Err(unknown());
        }
        if e.kind != o.kind {
            return Err((
                AbortReason::WrongKind,
                format!(
                    "a {} cannot be paired with a {}",
                    o.kind.active_name(),
                    e.kind.passive_name()
                ),
            ));
        }
        if e.sizes.len() != o.sizes.len() {
            return Err((
                AbortReason::CountMismatch,
                format!(
                    "{} descriptors exposed, {} requested",
                    e.sizes.len(),
                    o.sizes.len()
                ),
            ));
        }
        // The request's sizes are runs as received: compared with the
        // exposed sizes without expanding them (the cost follows what this
        // side exposed, never the counts a peer claims).
        if let Some(i) = o.sizes.first_difference(&e.sizes) {
            let b = o.sizes.iter().nth(i).unwrap_or_default();
            return Err((
                AbortReason::SizeMismatch,
                format!(
                    "descriptor {i}: {} bytes exposed, {b} requested",
                    e.sizes[i]
                ),
            ));
        }
        // Device memory moves in band where CUDA stages it here (always,
        // where a device region could be made at all); else only by lending.
        if !e.region.is_host() && !crate::cuda::available() {
            if let Some(why) = session::device_refusal(o, caps) {
                return Err((AbortReason::DeviceMemory, why));
            }
        }
        Ok(e)
    }

    /// Ends an exposure from the transport's side (completion, remote
    /// cancel, connection loss). True if this call ended it.
    pub(crate) fn finish(
        &self,
        e: &Exposure,
        status: OperationStatus,
        error: Option<Error>,
    ) -> bool {
        // Fence before publishing the terminal state: whoever sees it may
        // take the memory back at once.
        e.region.close();
        if let Some(reason) = abort_reason(status, error.as_ref()) {
            self.remember_if_striped(e, reason);
        }
        // Leave the table before waking waiters, so that whoever wakes sees
        // the capability gone.
        self.unlist(e);
        let bound = lock(&e.binding).take();
        if let Some(b) = &bound {
            // Every part leaves its connection's table before anyone wakes.
            b.leave();
        }
        let won = e.shared.end(status, error);
        // The remote's parts end with it, told how it really ended here.
        if let Some(b) = bound {
            let (status, error) = e.shared.state();
            b.ended(abort_reason(status, error.as_ref()).as_ref());
        }
        won
    }

    /// Removes an exposure from the table: no new request can find it.
    pub(crate) fn forget(&self, e: &Exposure) {
        // Only a cancel forgets.
        self.remember_if_striped(e, (AbortReason::Cancelled, String::new()));
        self.unlist(e);
    }

    /// Takes `e` out of the table, remembering its token. Remembered
    /// before it leaves the table, under the table's lock: a request that
    /// comes meanwhile finds it either listed or remembered (answered
    /// `OperationEnded`), never neither (`UnknownOperation`, which a
    /// request for a just-cancelled operation used to get now and then).
    fn unlist(&self, e: &Exposure) {
        let mut map = lock(&self.map);
        if map.contains_key(&e.op_id) {
            self.remember(
                e.op_id,
                Ended {
                    token: e.token,
                    stripe: None,
                    expired: false,
                },
            );
            map.remove(&e.op_id);
        }
    }

    fn remember(&self, op_id: u64, r: Ended) {
        let mut log = lock(&self.ended);
        if let Some(known) = log.by_id.get_mut(&op_id) {
            // A later word on the same operation (how a stripe really
            // ended); its token is the same.
            if r.stripe.is_some() {
                known.stripe = r.stripe;
            }
            return;
        }
        if log.order.len() >= ENDED {
            if let Some(old) = log.order.pop_front() {
                log.by_id.remove(&old);
            }
        }
        log.order.push_back(op_id);
        log.by_id.insert(op_id, r);
    }

    /// How the ended operation that `o` names ended, told only to whoever
    /// presents its token (`None`: to anyone else, or if it is not
    /// remembered): that it ended, and for a part of a striped transfer that
    /// comes from the peer it was bound to, how.
    fn how_it_ended(&self, o: &Open, peer: Option<&str>) -> Option<(AbortReason, String)> {
        let log = lock(&self.ended);
        let r = log.by_id.get(&o.op_id)?;
        if !r.token.ct_eq(&o.token) {
            return None;
        }
        match r.stripe.as_deref() {
            Some((p, how)) if o.parts > 1 && Some(p.as_str()) == peer => Some(how.clone()),
            _ if r.expired => Some(expired_here(o.op_id)),
            _ => Some(ended_here(o.op_id)),
        }
    }

    /// Remembers how a striped operation ended, before it leaves the table.
    fn remember_if_striped(&self, e: &Exposure, how: (AbortReason, String)) {
        let peer = match &*lock(&e.binding) {
            Some(b) => match b.joinable_by() {
                Some(p) => p.to_string(),
                None => return,
            },
            None => return,
        };
        self.remember(
            e.op_id,
            Ended {
                token: e.token,
                stripe: Some(Box::new((peer, how))),
                expired: false,
            },
        );
    }

    /// The exposure's expiry lapsed: it leaves the table, and whoever
    /// presents its token from now on is told that it expired.
    pub(crate) fn expired(&self, e: &Exposure) {
        self.remember(
            e.op_id,
            Ended {
                token: e.token,
                stripe: None,
                expired: true,
            },
        );
        self.remember_if_striped(e, expired_here(e.op_id));
        self.unlist(e);
    }

    /// Ends an exposure from the owner's side (cancel or drop; the region
    /// is already closed). Tells the remote if one is bound.
    pub(crate) fn withdraw(&self, e: &Exposure) {
        // As it really ended (this cancel may have lost to a failure).
        let (status, error) = e.shared.state();
        let reason = abort_reason(status, error.as_ref());
        // A part bound since `forget` made this stripe.
        if let Some(r) = &reason {
            self.remember_if_striped(e, r.clone());
        }
        self.unlist(e);
        // Release `binding` before the link takes its transport's tables:
        // a reader takes them in the other order.
        let bound = lock(&e.binding).take();
        if let Some(b) = bound {
            b.withdrawn(reason);
        }
    }

    /// Ends every exposure (the connector shuts down).
    pub(crate) fn shutdown_all(&self) {
        let all: Vec<_> = lock(&self.map).values().cloned().collect();
        for e in all {
            self.finish(&e, OperationStatus::Errored, Some(Error::Shutdown));
        }
    }
}

fn expired_here(op_id: u64) -> (AbortReason, String) {
    (AbortReason::Expired, format!("operation {op_id} expired"))
}

fn ended_here(op_id: u64) -> (AbortReason, String) {
    (
        AbortReason::OperationEnded,
        format!("operation {op_id} has ended"),
    )
}

/// How the remote's parts of a striped transfer learn that it ended here
/// without completing (`None`: it completed).
pub(crate) fn abort_reason(
    status: OperationStatus,
    error: Option<&Error>,
) -> Option<(AbortReason, String)> {
    if let Some(Error::Expired { .. }) = error {
        return Some((
            AbortReason::Expired,
            error.map(|e| e.to_string()).unwrap_or_default(),
        ));
    }
    match status {
        OperationStatus::Complete => None,
        OperationStatus::Cancelled => Some((AbortReason::Cancelled, String::new())),
        _ => Some((
            AbortReason::PartFailed,
            error.map(|e| e.to_string()).unwrap_or_default(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::Descriptor;

    struct Link;
    impl PassiveLink for Link {
        fn leave(&self) {}
        fn ended(&self, _how: Option<&Refusal>) {}
        fn withdrawn(&self, _how: Option<Refusal>) {}
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    const ATTACH: Caps = Caps {
        attach: true,
        can_pull: true,
        peer_pulls: true,
        secret: false,
        device: true,
    };

    /// An exposure of device memory (a made-up address, never touched)
    /// refuses every request that would move it in band, before binding:
    /// a later request that lends still finds it free.
    #[test]
    fn device_memory_is_refused_in_band_and_stays_free() {
        // SAFETY: the address is never dereferenced: the table only looks
        // at the region's kind and sizes.
        let descs = vec![unsafe { Descriptor::from_cuda_ptr(0x7f00_0000_0000, 64, 0, false) }];
        // SAFETY: as above.
        let region = Arc::new(unsafe { Region::new(&descs, false) });
        let table = Exposures::default();
        let (e, token) = table.insert(OperationKind::Read, vec![64], region.clone(), |_, _| {
            OpShared::new(OperationStatus::Initialized)
        });
        let open = |req, pull, parts| Open {
            req,
            op_id: e.op_id,
            token,
            kind: OperationKind::Read,
            sizes: vec![64].into(),
            pull,
            part: 0,
            parts,
        };
        let mut bound = 0;
        let mut bind = |_: Option<&Arc<dyn PassiveLink>>| {
            bound += 1;
            Ok(Arc::new(Link) as Arc<dyn PassiveLink>)
        };
        for (o, caps) in [
            (open(1, false, 1), ATTACH),
            (open(2, true, 2), ATTACH),
            (open(3, true, 1), Caps::default()),
        ] {
            match table.open(&o, Some("w"), caps, &mut bind) {
                Err((AbortReason::DeviceMemory, why)) => {
                    assert!(why.starts_with(session::DEVICE_MEMORY_BY_IPC_ONLY), "{why}")
                }
                other => panic!("{o:?}: {:?}", other.map(|_| ())),
            }
        }
        assert!(!e.shared.status().is_terminal());
        // Lent: granted.
        assert!(table
            .open(&open(4, true, 1), Some("w"), ATTACH, &mut bind)
            .is_ok());
        assert_eq!(bound, 1, "bound once, by the request that lends");
        region.close();
    }

    /// Host memory is not concerned: a request in band is granted.
    #[test]
    fn host_memory_is_granted_in_band() {
        let descs = vec![Descriptor::from_vec(vec![0; 8])];
        // SAFETY: the vector outlives the region; nothing touches it.
        let region = Arc::new(unsafe { Region::new(&descs, false) });
        let table = Exposures::default();
        let (e, token) = table.insert(OperationKind::Read, vec![8], region.clone(), |_, _| {
            OpShared::new(OperationStatus::Initialized)
        });
        let o = Open {
            req: 1,
            op_id: e.op_id,
            token,
            kind: OperationKind::Read,
            sizes: vec![8].into(),
            pull: false,
            part: 0,
            parts: 1,
        };
        let mut bind =
            |_: Option<&Arc<dyn PassiveLink>>| Ok(Arc::new(Link) as Arc<dyn PassiveLink>);
        assert!(table.open(&o, None, Caps::default(), &mut bind).is_ok());
        region.close();
    }
}
