//! One connection's request protocol after the handshake, for either role,
//! as a state machine without IO: fed frames and local events, it answers
//! with what the driver must do. No socket, no clock, no lock, no thread.
//!
//! Every request has a *side* (the source or the destination of the
//! bytes) and a *path* (the bytes travel in `Data` frames, or the source
//! lends its memory and the destination copies it). The rules that decide
//! the outcome live here: who may send `Data`, when a `Finish` is
//! premature, what a lease must look like, how the parts of a striped
//! transfer confirm, and the order of the lanes' set-up. Each refusal is
//! a typed [`Violation`].
//!
//! The memory itself stays with the driver: a request carries the
//! driver's handle `T` on it (its region and outcome), and the session
//! asks it only what the fence knows ([`Fence`]): whether the operation
//! is sealed, whether its region is open, whether the other parts of its
//! stripe are done.

mod action;
mod digest;
mod fence;
mod heartbeat;
mod lease;
pub mod liveness;
mod offer;
mod plan;
mod stripe;
#[cfg(test)]
mod tests;
mod violation;

use std::collections::{BTreeMap, VecDeque};

pub use action::{Action, Last, OpenParams, Start, Step};
pub use fence::{Caps, Fence};
pub use liveness::{Liveness, Tick};
pub use offer::{LaneAnswer, LaneProof, LaneState};
pub use plan::{
    can_lend, device_refusal, lane_for, lends, plan, route, table_caps, Plan, Thresholds,
    DEVICE_MEMORY_BY_IPC_ONLY,
};
pub use stripe::{part_range, BindError, StripeState};
pub use violation::Violation;

use crate::lane::{LaneId, Mem};
use crate::wire::{Abort, AbortReason, Message, Open};
// The session tests use it through `super::*`.
use crate::runs::Runs;
#[cfg(test)]
use crate::wire::MAX_LEASE_SEGMENTS;
use crate::{Cursor, OperationKind};

/// Which end of the connection this session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This side connected: it starts READs and WRITEs.
    Active,
    /// This side accepted: it serves readables and writables.
    Passive,
}

/// Which end of the bytes a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// This side has the bytes.
    Source,
    /// The bytes land here.
    Destination,
}

impl Side {
    /// The side of a request of `kind` for a session of `role`.
    pub fn of(role: Role, kind: OperationKind) -> Side {
        match (role, kind) {
            (Role::Active, OperationKind::Read) | (Role::Passive, OperationKind::Write) => {
                Side::Destination
            }
            _ => Side::Source,
        }
    }
}

/// How a request's bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// In `Data` frames on this connection.
    InBand,
    /// This side is the source and lent its memory (`Lease` sent).
    Lent,
    /// A READ asked for a lease; the answer is a `Lease` or `Data` frames.
    Requested,
    /// A pulled WRITE whose `Lease` has not arrived yet.
    AwaitLease,
    /// This side is the destination and copies from the lent memory.
    Pulling,
}

/// The part of a striped transfer that a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartState {
    index: u16,
    /// A part other than 0 that has landed or been confirmed: it stays in
    /// the table until the operation ends, so that an `Abort` or a lost
    /// connection on it still ends the operation.
    done: bool,
    /// The source has sent all of it: only then may it be confirmed.
    sent: bool,
}

#[derive(Debug, Clone)]
struct Request<T> {
    side: Side,
    path: Path,
    /// The bytes this request covers (its part's range when striped); at
    /// the destination of in-band bytes, where the next byte must land.
    cursor: Cursor,
    part: Option<PartState>,
    target: T,
    /// The flat byte range this request covers (its part's, striped;
    /// `(0, u64::MAX)`: all of it), for its digest.
    span: (u64, u64),
    /// The integrity check (see `digest.rs`).
    digest: digest::DigestState,
}

/// One connection's request protocol (see the module documentation).
#[derive(Debug)]
pub struct Session<T> {
    role: Role,
    caps: Caps,
    requests: BTreeMap<u64, Request<T>>,
    /// Memory lent to the peer, by request, whether its lease went out
    /// (only then may the peer be copying it), and the lane that lends it.
    lent: BTreeMap<u64, (T, bool, LaneId)>,
    next_req: u64,
    /// The lanes' set-up (see [`LaneOffer`](crate::wire::LaneOffer)).
    lanes: offer::LaneStates,
    /// Leases go through an RDMA backend (see [`Session::rdma_leases`]).
    rdma_leases: bool,
    /// This side's integrity check is on (see [`Session::set_digest`]).
    digest: bool,
    actions: VecDeque<Action<T>>,
}

impl<T: Fence> Session<T> {
    /// A session for a connection of `role`, after a handshake that found
    /// `caps`.
    pub fn new(role: Role, caps: Caps) -> Self {
        Session {
            role,
            caps,
            requests: BTreeMap::new(),
            lent: BTreeMap::new(),
            next_req: 1,
            lanes: offer::LaneStates::default(),
            rdma_leases: false,
            digest: false,
            actions: VecDeque::new(),
        }
    }

    /// The next thing to do, in order.
    pub fn poll_action(&mut self) -> Option<Action<T>> {
        self.actions.pop_front()
    }

    /// Requests and leases in flight: zero when idle.
    pub fn pending(&self) -> usize {
        self.requests.len() + self.lent.len()
    }

    /// Requests in flight, in either role: those of operations that have
    /// not ended here (memory still lent after its operation ended is not
    /// one). Zero when the connection carries no live operation.
    pub fn live(&self) -> usize {
        self.requests.len()
    }

    /// What this side can do.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    fn push(&mut self, a: Action<T>) {
        self.actions.push_back(a);
    }

    fn reply(&mut self, msg: Message) {
        self.push(Action::Send { msg, reply: true });
    }

    fn abort(&mut self, req: u64, reason: AbortReason, detail: String) {
        self.reply(Message::Abort(Abort {
            req,
            reason,
            detail,
        }));
    }

    fn give_back(&mut self, req: u64) {
        if let Some((target, ..)) = self.lent.remove(&req) {
            self.push(Action::GiveBack { target });
        }
    }

    /// Handles one frame from the peer. An `Err` closes the connection.
    pub fn handle_frame(&mut self, msg: Message) -> Result<Step<T>, Violation> {
        match msg {
            Message::Hello(_) => Err(Violation::UnexpectedHello),
            Message::Auth(_) => {
                let v = if self.caps.secret {
                    Violation::UnexpectedAuth
                } else {
                    Violation::AuthWithoutSecret
                };
                self.abort(0, v.abort_reason(), v.to_string());
                Err(v)
            }
            Message::LaneOffer(o) => self.on_lane_offer(o),
            Message::Open(o) => self.on_open(o),
            Message::Data(d) => {
                let Some(r) = self.requests.get_mut(&d.req) else {
                    return Ok(Step::Discard { len: d.len });
                };
                let in_band = matches!(r.path, Path::InBand | Path::Requested);
                if r.side != Side::Destination || !in_band {
                    return Err(Violation::UnexpectedData { req: d.req });
                }
                if !r.target.moves_in_band() {
                    // A READ into device memory that this side cannot
                    // stage asked for a lease; the source must not fall
                    // back to streaming.
                    return Err(Violation::DataForDeviceMemory { req: d.req });
                }
                r.cursor.accept(d.desc, d.offset, d.len)?;
                if r.path == Path::Requested {
                    // The source chose to stream instead of lending.
                    r.path = Path::InBand;
                    let target = r.target.clone();
                    self.push(Action::Via {
                        target: target.clone(),
                        lent: false,
                        lane: None,
                    });
                    return Ok(Step::Payload {
                        target,
                        desc: d.desc,
                        offset: d.offset,
                        len: d.len,
                    });
                }
                Ok(Step::Payload {
                    target: r.target.clone(),
                    desc: d.desc,
                    offset: d.offset,
                    len: d.len,
                })
            }
            Message::Lease(l) => self.on_lease(l),
            Message::Release { req } => {
                self.give_back(req);
                Ok(Step::Done)
            }
            Message::Finish { req } => self.on_finish(req),
            Message::Abort(a) => self.on_abort(a),
            m @ (Message::Ping | Message::Pong) => Ok(self.on_heartbeat(&m)),
            Message::Digest(d) => self.on_digest(d),
            Message::GrantRequest(r) => match self.role {
                Role::Passive => Ok(Step::ServeGrant(r)),
                Role::Active => Err(Violation::GrantRequestToActiveSide),
            },
            Message::GrantReply(r) => match self.role {
                Role::Active => Ok(Step::GrantReply(r)),
                Role::Passive => Err(Violation::GrantReplyToPassiveSide),
            },
            Message::OfferClaim(c) => match self.role {
                Role::Passive => Ok(Step::ServeClaim(c)),
                Role::Active => Err(Violation::OfferClaimToActiveSide),
            },
            Message::OfferReply(r) => match self.role {
                Role::Active => Ok(Step::OfferReply(r)),
                Role::Passive => Err(Violation::OfferReplyToPassiveSide),
            },
        }
    }

    fn on_open(&mut self, o: Open) -> Result<Step<T>, Violation> {
        if self.role == Role::Active {
            return Err(Violation::OpenToActiveSide);
        }
        if self.requests.contains_key(&o.req) || self.lent.contains_key(&o.req) {
            return Err(Violation::RequestNumberInUse(o.req));
        }
        Ok(Step::CheckGrant(o))
    }

    /// The exposure table's verdict on request `o` (passive side): refused
    /// with a reason, or granted to the operation behind `target`. A
    /// granted request is in the table afterwards; memory it lends is lent
    /// by the queued actions. The driver then checks that the operation
    /// did not end meanwhile and calls [`serve`](Self::serve), or
    /// [`forget`](Self::forget) and [`unlend`](Self::unlend).
    ///
    /// A grant means the driver found `o.sizes` equal to the granted
    /// operation's ([`Runs::first_difference`]): only then are they
    /// expanded here, so that what this costs follows the grant, never the
    /// counts the peer claimed.
    pub fn bound(&mut self, o: &Open, verdict: Result<T, (AbortReason, String)>) {
        let target = match verdict {
            Ok(t) => t,
            Err((reason, detail)) => return self.abort(o.req, reason, detail),
        };
        if !target.moves_in_band() {
            if let Some(why) = device_refusal(o, self.caps) {
                // The driver refuses this before it binds the operation
                // (so that it stays free for a peer that can lend); here it
                // is refused all the same, and the operation it was bound
                // to ends, since nothing else will move it.
                return self.refuse_device(o.req, target, why);
            }
        }
        let side = Side::of(Role::Passive, o.kind);
        if o.parts > 1 {
            // A part of a striped transfer: always in band. Its sizes are
            // the grant's (checked by the driver before it bound them):
            // only now are they expanded.
            let (start, end) = part_range(o.sizes.total(), o.part, o.parts);
            self.push(Action::Via {
                target: target.clone(),
                lent: false,
                lane: None,
            });
            self.requests.insert(
                o.req,
                Request {
                    side,
                    path: Path::InBand,
                    cursor: Cursor::range(o.sizes.expand(), start, end),
                    part: Some(PartState {
                        index: o.part,
                        done: false,
                        sent: false,
                    }),
                    target,
                    span: (start, end),
                    digest: Default::default(),
                },
            );
            return;
        }
        // The lane that lends it, where this side lends: the planner's.
        let device = target.is_device();
        let lane = Some(o)
            .filter(|o| lends(o, device, self.caps))
            .map(|_| self.lending_lane(Mem::of(device)));
        let path = match (lane, o.kind, o.pull) {
            (Some(Some(_)), ..) => Path::Lent,
            (Some(None), ..) if !target.moves_in_band() => {
                let why = "no lane of this connection lends it";
                let detail = format!("{DEVICE_MEMORY_BY_IPC_ONLY}: {why}");
                return self.refuse_device(o.req, target, detail);
            }
            (_, OperationKind::Write, true) => Path::AwaitLease,
            // In band, or a READ that cannot be lent: its bytes stream.
            _ => Path::InBand,
        };
        let lane = lane.flatten();
        self.push(Action::Via {
            target: target.clone(),
            lent: path != Path::InBand,
            lane,
        });
        if let Some(lane) = lane {
            // Lent before the driver looks at the status: an owner that
            // drops the operation from then on finds the memory lent.
            self.lent.insert(o.req, (target.clone(), false, lane));
            self.push(Action::Lend {
                req: o.req,
                target: target.clone(),
                lane,
            });
        }
        self.requests.insert(
            o.req,
            Request {
                side,
                path,
                cursor: Cursor::new(o.sizes.expand()),
                part: None,
                target,
                span: (0, u64::MAX),
                digest: Default::default(),
            },
        );
    }

    /// Starts serving a bound request: its source sends a lease or the
    /// bytes; a destination waits for them.
    pub fn serve(&mut self, req: u64) {
        let Some(r) = self.requests.get(&req) else {
            // Ended meanwhile (`forget` gave back what it lent).
            return;
        };
        if r.side != Side::Source {
            return;
        }
        let (target, cursor) = (r.target.clone(), r.cursor.clone());
        let a = match (r.path, r.part) {
            (Path::Lent, _) => {
                let Some(l) = self.lent.get_mut(&req) else {
                    // Given back meanwhile: nothing to lease.
                    return;
                };
                l.1 = true;
                let lane = l.2;
                Action::SendLease { req, target, lane }
            }
            (_, Some(p)) => Action::Stream {
                req,
                target,
                cursor,
                last: if p.index == 0 {
                    Last::SealAfterParts
                } else {
                    Last::Part
                },
            },
            (_, None) => Action::Stream {
                req,
                target,
                cursor,
                last: Last::Seal,
            },
        };
        self.push(a);
    }

    /// Takes a request out of the table: its operation ended here, and
    /// whoever ended it tells the peer. Memory it lent whose lease went out
    /// stays lent until the peer says it stopped copying (`Finish`,
    /// `Abort`, `Release`) or the connection ends; memory whose lease never
    /// went out is given back at once. True if it was there.
    pub fn forget(&mut self, req: u64) -> bool {
        if self.lent.get(&req).is_some_and(|l| !l.1) {
            self.give_back(req);
        }
        self.requests.remove(&req).is_some()
    }

    /// Refuses request `req` over device memory it cannot move: the peer
    /// told (`Abort(DeviceMemory)`, `detail`), and the operation behind
    /// `target` ended with the same.
    fn refuse_device(&mut self, req: u64, target: T, detail: String) {
        self.abort(req, AbortReason::DeviceMemory, detail.clone());
        self.push(Action::RemoteAbort {
            target,
            reason: AbortReason::DeviceMemory,
            detail,
        });
    }

    /// Starts an active request for the operation behind `target`: its
    /// number and how to begin. The request is in the table afterwards.
    pub fn open(&mut self, p: OpenParams, target: T) -> (u64, Start) {
        let req = self.next_req;
        self.next_req += 1;
        let (part, parts) = p.part;
        let side = Side::of(Role::Active, p.kind);
        let striped = parts > 1;
        // A source lends by the planner's lane, or not at all.
        let lane = p.lane.filter(|_| side == Side::Source);
        let pull = p.pull && !striped && (side == Side::Destination || lane.is_some());
        let path = match (pull, side) {
            (false, _) => Path::InBand,
            (true, Side::Destination) => Path::Requested,
            (true, Side::Source) => Path::Lent,
        };
        let mut span = (0, u64::MAX);
        let cursor = if striped {
            let total = p.sizes.iter().fold(0u64, |a, s| a.saturating_add(*s));
            let (start, end) = part_range(total, part, parts);
            span = (start, end);
            Cursor::range(p.sizes.clone(), start, end)
        } else if path == Path::Lent {
            // A lending source sends no byte itself, so it never walks a
            // cursor: no copy of what may be a million sizes.
            Cursor::new(Vec::new())
        } else {
            Cursor::new(p.sizes.clone())
        };
        match (path, lane) {
            (Path::Lent, Some(lane)) => {
                self.push(Action::Via {
                    target: target.clone(),
                    lent: true,
                    lane: Some(lane),
                });
                // Its lease goes out with the `Open` (`Start::OpenAndLease`).
                self.lent.insert(req, (target.clone(), true, lane));
                self.push(Action::Lend {
                    req,
                    target: target.clone(),
                    lane,
                });
            }
            (Path::InBand, _) => self.push(Action::Via {
                target: target.clone(),
                lent: false,
                lane: None,
            }),
            // Known once the peer answers with a lease or with data.
            _ => {}
        }
        let open = Message::Open(Open {
            req,
            op_id: p.op_id,
            token: p.token,
            kind: p.kind,
            sizes: Runs::of(&p.sizes),
            pull,
            part,
            parts,
        });
        let start = match (side, path, lane) {
            (Side::Destination, ..) => Start::Open(open),
            // `Lent` only with a lane (above).
            (Side::Source, Path::Lent, Some(lane)) => Start::OpenAndLease(open, lane),
            (Side::Source, ..) => Start::Stream {
                open,
                cursor: cursor.clone(),
                last: match (striped, part) {
                    (false, _) => Last::Seal,
                    (true, 0) => Last::SealAfterParts,
                    (true, _) => Last::Part,
                },
            },
        };
        self.requests.insert(
            req,
            Request {
                side,
                path,
                cursor,
                part: striped.then_some(PartState {
                    index: part,
                    done: false,
                    sent: false,
                }),
                target,
                span,
                digest: Default::default(),
            },
        );
        (req, start)
    }

    fn part_mut(&mut self, req: u64) -> Option<&mut PartState> {
        self.requests.get_mut(&req).and_then(|r| r.part.as_mut())
    }

    /// Every byte of the part that request `req` carries has been sent.
    pub fn part_sent(&mut self, req: u64) {
        if let Some(p) = self.requests.get_mut(&req).and_then(|r| r.part.as_mut()) {
            p.sent = true;
        }
    }

    /// The connection ended: the handles of the requests whose operation
    /// ends with it, and every lent memory's, for the driver to end and
    /// give back.
    ///
    /// A part other than 0 that is done, of an operation that is sealed,
    /// ends nothing: its outcome is decided, and comes on part 0's
    /// connection (the confirmation there, or that connection's end). The
    /// peer may report COMPLETE, then exit at once, and the end of this
    /// connection can be seen before the confirmation that part 0's
    /// carried: it must not fail an operation that the peer completed.
    pub fn drain(&mut self) -> (Vec<T>, Vec<T>) {
        let reqs = std::mem::take(&mut self.requests);
        let lent = std::mem::take(&mut self.lent);
        self.actions.clear();
        let settled =
            |r: &Request<T>| r.part.is_some_and(|p| p.index != 0 && p.done) && r.target.is_sealed();
        (
            reqs.into_values()
                .filter(|r| !settled(r))
                .map(|r| r.target)
                .collect(),
            lent.into_values().map(|(t, ..)| t).collect(),
        )
    }

    fn on_finish(&mut self, req: u64) -> Result<Step<T>, Violation> {
        // A destination that copied from us has stopped.
        self.give_back(req);
        let Some(r) = self.requests.get_mut(&req) else {
            return Ok(Step::Done);
        };
        if let Some(p) = r.part.as_mut().filter(|p| p.index != 0) {
            // A part other than 0: at the destination, every byte of it
            // was sent (confirmed unless a cancel is closing the region);
            // at the source, that confirmation.
            if p.done {
                return Ok(Step::Done);
            }
            let target = r.target.clone();
            match r.side {
                Side::Destination if !r.cursor.is_done() => {
                    return Err(Violation::PartFinishedEarly { part: p.index })
                }
                Side::Destination => {
                    if let Some(verify) = self.digest_gate(req)? {
                        return Ok(verify);
                    }
                    if target.is_open() {
                        if let Some(p) = self.part_mut(req) {
                            p.done = true;
                        }
                        self.push(Action::PartDone { target });
                        self.reply(Message::Finish { req });
                    }
                }
                Side::Source if !p.sent => {
                    return Err(Violation::PartConfirmedBeforeSent { part: p.index })
                }
                Side::Source => {
                    p.done = true;
                    self.push(Action::PartDone { target });
                }
            }
            return Ok(Step::Done);
        }
        let premature = match (r.path, r.side) {
            // The peer copied what we lent: it has every byte.
            (Path::Lent, _) => None,
            (Path::Pulling, _) if !r.target.is_sealed() => {
                Some(Violation::FinishBeforeCopyEnded { req })
            }
            (Path::Pulling, _) => None,
            (Path::AwaitLease, _) => Some(Violation::FinishBeforeLease { req }),
            (_, Side::Destination) if !r.cursor.is_done() || !r.target.can_commit() => {
                Some(Violation::FinishBeforeAllData { req })
            }
            // A confirmation must follow our own `Finish` (sent only once
            // sealed).
            (_, Side::Source) if !r.target.is_sealed() => {
                Some(Violation::FinishBeforeAllData { req })
            }
            _ => None,
        };
        if let Some(v) = premature {
            return Err(v);
        }
        if let Some(verify) = self.digest_gate(req)? {
            return Ok(verify);
        }
        let Some(r) = self.requests.remove(&req) else {
            return Ok(Step::Done);
        };
        let a = match (r.path, r.side) {
            (Path::Lent, _) => Action::Commit {
                req,
                target: r.target,
                lent: true,
            },
            (Path::Pulling, _) | (_, Side::Source) => Action::Complete { target: r.target },
            (_, Side::Destination) => Action::Commit {
                req,
                target: r.target,
                lent: false,
            },
        };
        self.push(a);
        Ok(Step::Done)
    }

    fn on_abort(&mut self, a: Abort) -> Result<Step<T>, Violation> {
        // A destination that copied from us has stopped (with RDMA leases,
        // its `Release` says when its gets have drained).
        if !self.rdma_leases {
            self.give_back(a.req);
        }
        let Some(r) = self.requests.get(&a.req) else {
            return Ok(Step::Done);
        };
        if let Some(p) = r.part {
            // This side has begun to end a striped operation (a cancel, or
            // another part failed): it settles the outcome and tells the
            // peer; the peer's answers on other parts must not preempt it.
            // A sealed operation is the peer's to settle.
            if !r.target.is_open() && !r.target.is_sealed() {
                self.requests.remove(&a.req);
                return Ok(Step::Done);
            }
            if self.role == Role::Active && a.reason == AbortReason::OperationEnded && p.index != 0
            {
                // A further part arrived after the peer ended the
                // operation: how it ended comes on part 0.
                self.requests.remove(&a.req);
                return Ok(Step::Done);
            }
        }
        let Some(r) = self.requests.remove(&a.req) else {
            return Ok(Step::Done);
        };
        self.push(Action::RemoteAbort {
            target: r.target,
            reason: a.reason,
            detail: a.detail,
        });
        if r.path == Path::Pulling && !self.rdma_leases {
            // Our copy stops here (the region closes): the source may
            // stop waiting for it. (With RDMA leases, once the copy has
            // stopped: `pull_ended`.)
            self.reply(Message::Release { req: a.req });
        }
        Ok(Step::Done)
    }
}
