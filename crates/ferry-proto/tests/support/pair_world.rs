//! The driver behind `tests/session_pair.rs` and `tests/session_hostile.rs`:
//! two [`Session`]s back to back, an active and a passive one, or one
//! honest session whose peer the test plays; it moves frames between them
//! and runs their actions against memory in `Vec`s.
//!
//! The driver is synchronous: after every call into a session it runs the
//! actions it queued, in order. Frames wait in each connection's inbox
//! until [`World::run`] (or [`World::run_on`], for some connections only)
//! delivers them; `Data` payloads travel with their frame. A `Stream` is
//! a job that sends one frame per turn, so that a cancel can come in the
//! middle of it.
//!
//! Each test binary uses only some of it.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use ferry_proto::lane::LaneId;
use ferry_proto::session::{
    Action, Caps, Fence, LaneAnswer, LaneProof, Last, OpenParams, Role, Session, Start, Step,
    StripeState, Violation,
};
use ferry_proto::wire::{AbortReason, Data, Lease, Message, Open};
use ferry_proto::{Cursor, OperationKind, Token};

#[path = "lanes.rs"]
mod lanes;
#[path = "pair_world_ops.rs"]
mod ops;
pub use ops::*;

// ---------------------------------------------------------------------------
// Connections and the driver.

#[derive(Debug, Clone)]
pub struct Frame {
    pub msg: Message,
    pub payload: Vec<u8>,
}

pub struct Conn {
    pub name: String,
    pub s: Session<H>,
    /// The session that reads what this one sends; `None`: a scripted
    /// peer, whose frames the test reads from `out` and writes to `inbox`.
    pub peer: Option<usize>,
    pub inbox: VecDeque<Frame>,
    pub out: Vec<Frame>,
    pub closed: bool,
    pub violation: Option<Violation>,
    pub discarded: usize,
}

pub enum Job {
    Stream {
        c: usize,
        req: u64,
        target: H,
        cursor: Cursor,
        last: Last,
    },
    Pull {
        c: usize,
        req: u64,
        target: H,
        segments: Vec<(u64, u64)>,
    },
}

impl Job {
    pub fn conn(&self) -> usize {
        match self {
            Job::Stream { c, .. } | Job::Pull { c, .. } => *c,
        }
    }
}

pub struct World {
    pub conns: Vec<Conn>,
    pub jobs: VecDeque<Job>,
    /// The passive side's exposure table, by operation id.
    pub exposed: BTreeMap<u64, (Token, OperationKind, H)>,
    /// Memory lent to a peer, by key.
    pub lent: BTreeMap<u64, H>,
    pub next_key: u64,
    /// The largest `Data` payload.
    pub chunk: u32,
    /// What happened, in order: `"<connection> <event>"`.
    pub log: Vec<String>,
}

pub const IN_BAND: Caps = Caps {
    attach: false,
    can_pull: false,
    peer_pulls: false,
    secret: false,
    device: false,
};
/// Attach set up both ways: either side may lend, either may pull.
pub const ATTACH: Caps = Caps {
    attach: true,
    can_pull: true,
    peer_pulls: true,
    secret: false,
    device: false,
};

impl World {
    pub fn new() -> World {
        World {
            conns: Vec::new(),
            jobs: VecDeque::new(),
            exposed: BTreeMap::new(),
            lent: BTreeMap::new(),
            next_key: 0,
            chunk: 5,
            log: Vec::new(),
        }
    }

    pub fn conn(&mut self, name: String, role: Role, caps: Caps, peer: Option<usize>) -> usize {
        self.conns.push(Conn {
            name,
            s: {
                let mut s = Session::new(role, caps);
                s.agree_lanes(lanes::agreed(caps.device));
                s
            },
            peer,
            inbox: VecDeque::new(),
            out: Vec::new(),
            closed: false,
            violation: None,
            discarded: 0,
        });
        self.conns.len() - 1
    }

    /// A connection: its active and its passive end.
    pub fn pair(&mut self, active: Caps, passive: Caps) -> (usize, usize) {
        let n = self.conns.len();
        let a = self.conn(format!("active{n}"), Role::Active, active, Some(n + 1));
        let p = self.conn(format!("passive{}", n + 1), Role::Passive, passive, Some(n));
        (a, p)
    }

    /// An honest session whose peer the test plays.
    pub fn facing_script(&mut self, role: Role, caps: Caps) -> usize {
        let n = self.conns.len();
        self.conn(format!("{role:?}{n}").to_lowercase(), role, caps, None)
    }

    pub fn op(&mut self, bufs: Vec<Vec<u8>>, parts: u16) -> H {
        self.next_key += 1;
        H(Rc::new(Op {
            key: self.next_key,
            bufs: RefCell::new(bufs),
            sealed: Cell::new(false),
            open: Cell::new(true),
            outcome: RefCell::new(None),
            stripe: RefCell::new((parts > 1).then(|| StripeState::new(parts))),
            via: RefCell::new(Vec::new()),
            reqs: RefCell::new(Vec::new()),
            lends: Cell::new(0),
        }))
    }

    /// A passive operation of `kind` over `bufs`, and its metadata.
    pub fn expose(&mut self, kind: OperationKind, bufs: Vec<Vec<u8>>) -> (H, Meta) {
        let h = self.op(bufs, 1);
        let meta = Meta {
            op_id: 100 + h.0.key,
            token: Token::from_bytes([h.0.key as u8; 16]),
            sizes: h.sizes(),
        };
        self.exposed
            .insert(meta.op_id, (meta.token, kind, h.clone()));
        (h, meta)
    }

    pub fn note(&mut self, c: usize, what: String) {
        let line = format!("{} {what}", self.conns[c].name);
        self.log.push(line);
    }

    pub fn send(&mut self, c: usize, msg: Message, payload: Vec<u8>) {
        let f = Frame { msg, payload };
        match self.conns[c].peer {
            Some(p) if !self.conns[p].closed => self.conns[p].inbox.push_back(f),
            Some(_) => {}
            None => self.conns[c].out.push(f),
        }
    }

    /// Starts an active request at `c` (`part`: which of how many).
    pub fn start(
        &mut self,
        c: usize,
        kind: OperationKind,
        target: &H,
        meta: &Meta,
        pull: bool,
        part: (u16, u16),
    ) -> u64 {
        let p = OpenParams {
            kind,
            op_id: meta.op_id,
            token: meta.token,
            sizes: meta.sizes.clone(),
            pull,
            lane: pull.then_some(LaneId::CMA),
            part,
        };
        let (req, start) = self.conns[c].s.open(p, target.clone());
        target.0.reqs.borrow_mut().push((c, req));
        match start {
            Start::Open(m) => self.send(c, m, vec![]),
            Start::OpenAndLease(m, lane) => {
                self.send(c, m, vec![]);
                let segments = target.segments();
                self.send(
                    c,
                    Message::Lease(Lease {
                        lane,
                        req,
                        segments: segments.into(),
                        key: vec![],
                    }),
                    vec![],
                );
            }
            Start::Stream { open, cursor, last } => {
                self.send(c, open, vec![]);
                self.jobs.push_back(Job::Stream {
                    c,
                    req,
                    target: target.clone(),
                    cursor,
                    last,
                });
            }
        }
        self.flush(c);
        req
    }

    /// Runs every action `c` queued, in order.
    pub fn flush(&mut self, c: usize) {
        while let Some(a) = self.conns[c].s.poll_action() {
            self.act(c, a);
        }
    }

    pub fn act(&mut self, c: usize, a: Action<H>) {
        match a {
            Action::Send { msg, .. } => self.send(c, msg, vec![]),
            Action::Stream {
                req,
                target,
                cursor,
                last,
            } => self.jobs.push_back(Job::Stream {
                c,
                req,
                target,
                cursor,
                last,
            }),
            Action::Via { target, lent, .. } => target.0.via.borrow_mut().push(lent),
            Action::Lend { target, .. } => {
                target.0.lends.set(target.0.lends.get() + 1);
                self.lent.insert(target.0.key, target);
            }
            Action::SendLease { req, target, lane } => {
                let segments = target.segments();
                self.send(
                    c,
                    Message::Lease(Lease {
                        lane,
                        req,
                        segments: segments.into(),
                        key: vec![],
                    }),
                    vec![],
                );
            }
            Action::GiveBack { target } => self.give_back(&target),
            Action::Pull {
                req,
                target,
                segments,
                ..
            } => self.jobs.push_back(Job::Pull {
                c,
                req,
                target,
                segments,
            }),
            Action::PartDone { target } => {
                if let Some(s) = target.0.stripe.borrow_mut().as_mut() {
                    s.part_done();
                }
                self.note(c, "part done".into());
            }
            Action::Commit { req, target, lent } => {
                // Part 0 commits last.
                assert!(target.can_commit(), "a commit before the other parts");
                self.note(c, format!("commit {req}"));
                if target.0.open.get() {
                    if lent {
                        target.0.sealed.set(true);
                    }
                    self.end(&target, Outcome::Complete, None);
                    self.send(c, Message::Finish { req }, vec![]);
                } else {
                    let reason = AbortReason::Cancelled;
                    self.send(c, abort(req, reason), vec![]);
                }
            }
            Action::Complete { target } => {
                assert!(target.is_sealed(), "completed but not sealed");
                self.note(c, "complete".into());
                self.end(&target, Outcome::Complete, None);
            }
            Action::RemoteAbort { target, reason, .. } => {
                self.note(c, format!("remote abort {reason:?}"));
                self.end(
                    &target,
                    Outcome::Aborted(reason),
                    Some(AbortReason::PartFailed),
                );
            }
        }
    }

    pub fn give_back(&mut self, target: &H) {
        let n = target.0.lends.get();
        assert!(n > 0, "memory given back that was not lent");
        target.0.lends.set(n - 1);
        if n == 1 {
            self.lent.remove(&target.0.key);
        }
    }

    /// Ends `op` here (once): its other requests are forgotten, and their
    /// peers told `tell`.
    pub fn end(&mut self, op: &H, outcome: Outcome, tell: Option<AbortReason>) -> bool {
        if op.0.outcome.borrow().is_some() {
            return false;
        }
        *op.0.outcome.borrow_mut() = Some(outcome);
        op.0.open.set(false);
        let reqs = op.0.reqs.borrow().clone();
        for (c, req) in reqs {
            if self.conns[c].closed || !self.conns[c].s.forget(req) {
                continue;
            }
            if let Some(reason) = tell {
                self.send(c, abort(req, reason), vec![]);
            }
            self.flush(c);
        }
        true
    }

    /// The owner cancels `op`: no effect once it is sealed.
    pub fn cancel(&mut self, op: &H) -> bool {
        if op.is_sealed() {
            return false;
        }
        self.end(op, Outcome::Cancelled, Some(AbortReason::Cancelled))
    }

    /// The connection ends: every operation on it fails with `why`.
    pub fn close(&mut self, c: usize, why: String) {
        if self.conns[c].closed {
            return;
        }
        self.conns[c].closed = true;
        let (reqs, lent) = self.conns[c].s.drain();
        for t in lent {
            self.give_back(&t);
        }
        for t in reqs {
            self.end(
                &t,
                Outcome::Errored(why.clone()),
                Some(AbortReason::PartFailed),
            );
        }
        if let Some(p) = self.conns[c].peer {
            self.close(p, "connection lost".into());
        }
    }

    /// The passive side's check of an `Open` against its exposure table.
    pub fn check_grant(&mut self, o: &Open) -> Result<H, (AbortReason, String)> {
        let unknown = || {
            (
                AbortReason::UnknownOperation,
                "unknown operation".to_string(),
            )
        };
        let (token, kind, op) = self.exposed.get(&o.op_id).cloned().ok_or_else(unknown)?;
        if !token.ct_eq(&o.token) {
            return Err(unknown());
        }
        if op.outcome().is_some() {
            return Err((AbortReason::OperationEnded, "ended".into()));
        }
        if kind != o.kind {
            return Err((AbortReason::WrongKind, "wrong kind".into()));
        }
        if o.sizes.first_difference(&op.sizes()).is_some() {
            return Err((AbortReason::SizeMismatch, "sizes differ".into()));
        }
        if o.parts > 1 {
            let mut stripe = op.0.stripe.borrow_mut();
            let s = stripe.get_or_insert_with(|| StripeState::new(o.parts));
            if s.parts() != o.parts || s.bind(o.part).is_err() {
                return Err((AbortReason::Busy, "part bound".into()));
            }
        }
        Ok(op)
    }

    /// Delivers the next frame in `c`'s inbox.
    pub fn receive(&mut self, c: usize, f: Frame) {
        let req = match &f.msg {
            Message::Data(d) => Some(d.req),
            _ => None,
        };
        match self.conns[c].s.handle_frame(f.msg) {
            Ok(Step::Done) => {}
            Ok(Step::Payload {
                target,
                desc,
                offset,
                len,
            }) => {
                assert_eq!(f.payload.len(), len as usize, "request {req:?}");
                let mut b = target.0.bufs.borrow_mut();
                b[desc as usize][offset as usize..][..len as usize].copy_from_slice(&f.payload);
            }
            Ok(Step::Discard { len }) => {
                assert_eq!(f.payload.len(), len as usize);
                self.conns[c].discarded += 1;
            }
            Ok(Step::CheckGrant(o)) => {
                let verdict = self.check_grant(&o);
                let granted = verdict.as_ref().ok().cloned();
                self.conns[c].s.bound(&o, verdict);
                if let Some(op) = granted {
                    op.0.reqs.borrow_mut().push((c, o.req));
                    if op.is_open() {
                        self.conns[c].s.serve(o.req);
                    } else {
                        // No lease went out: the memory comes back at once.
                        self.conns[c].s.forget(o.req);
                        self.conns[c].s.unlend(o.req);
                    }
                }
            }
            // This world sends no digest.
            Ok(Step::Verify { req, .. }) => panic!("a digest to verify for request {req}"),
            // Nor grant frames.
            Ok(Step::ServeGrant(r)) => panic!("a grant request {}", r.req),
            Ok(Step::GrantReply(r)) => panic!("a grant reply {}", r.req),
            // Nor offer frames.
            Ok(Step::ServeClaim(c)) => panic!("an offer claim {}", c.req),
            Ok(Step::OfferReply(r)) => panic!("an offer reply {}", r.req),
            Ok(Step::LaneOffer { lane, .. }) => {
                // No lane here: each offer is declined and settles at once.
                let answer = LaneAnswer {
                    bytes: Some(Vec::new()),
                    settled: Some(LaneProof::default()),
                };
                if let Some(m) = self.conns[c].s.lane_answered(lane, answer) {
                    self.send(c, m, vec![]);
                }
            }
            Err(v) => {
                // The `Abort` of a violation the peer is told goes first.
                self.flush(c);
                self.note(c, format!("violation: {v}"));
                self.conns[c].violation = Some(v.clone());
                self.close(c, v.to_string());
                return;
            }
        }
        self.flush(c);
    }

    /// Copies a lease into `target` from the memory lent to it.
    pub fn copy(&self, target: &H, segments: &[(u64, u64)]) -> bool {
        let mut dst = target.0.bufs.borrow_mut();
        for (i, &(addr, len)) in segments.iter().enumerate() {
            let (key, desc, off) = (
                addr >> 40,
                (addr >> 32) as u8 as usize,
                addr as u32 as usize,
            );
            let Some(src) = self.lent.get(&key) else {
                return false;
            };
            let src = src.0.bufs.borrow();
            let Some(bytes) = src.get(desc).and_then(|b| b.get(off..off + len as usize)) else {
                return false;
            };
            dst[i][..len as usize].copy_from_slice(bytes);
        }
        true
    }

    /// One turn of a job: `None` when it is over; `true` if it moved.
    pub fn advance(&mut self, job: Job) -> (Option<Job>, bool) {
        if self.conns[job.conn()].closed {
            return (None, true);
        }
        match job {
            Job::Stream {
                c,
                req,
                target,
                mut cursor,
                last,
            } => {
                if !target.is_open() {
                    // The cancel tells the peer.
                    return (None, true);
                }
                if let Some((desc, offset, len)) = cursor.next_chunk(self.chunk) {
                    let payload = target.0.bufs.borrow()[desc as usize][offset as usize..]
                        [..len as usize]
                        .to_vec();
                    cursor.accept(desc, offset, len).unwrap();
                    let d = Data {
                        req,
                        desc,
                        offset,
                        len,
                    };
                    self.send(c, Message::Data(d), payload);
                    let job = Job::Stream {
                        c,
                        req,
                        target,
                        cursor,
                        last,
                    };
                    return (Some(job), true);
                }
                match last {
                    Last::Seal => target.0.sealed.set(true),
                    Last::Part => {}
                    Last::SealAfterParts if target.can_commit() => target.0.sealed.set(true),
                    Last::SealAfterParts => {
                        let job = Job::Stream {
                            c,
                            req,
                            target,
                            cursor,
                            last,
                        };
                        return (Some(job), false);
                    }
                }
                self.send(c, Message::Finish { req }, vec![]);
                if last == Last::Part {
                    self.conns[c].s.part_sent(req);
                }
                (None, true)
            }
            Job::Pull {
                c,
                req,
                target,
                segments,
            } => {
                if !target.is_open() {
                    return (None, true);
                }
                let ok = self.copy(&target, &segments);
                if ok {
                    target.0.sealed.set(true);
                }
                if let Some(m) = self.conns[c].s.pull_ended(req, ok) {
                    self.send(c, m, vec![]);
                }
                if !ok {
                    let why = Outcome::Errored("the copy failed".into());
                    self.end(&target, why, Some(AbortReason::OperationEnded));
                }
                self.flush(c);
                (None, true)
            }
        }
    }

    /// One turn for the connections in `only`: a frame into each inbox,
    /// a step of each job. Whether anything moved.
    pub fn turn(&mut self, only: &[usize]) -> bool {
        let mut moved = false;
        for &c in only {
            if self.conns[c].closed {
                self.conns[c].inbox.clear();
                continue;
            }
            if let Some(f) = self.conns[c].inbox.pop_front() {
                self.receive(c, f);
                moved = true;
            }
        }
        for _ in 0..self.jobs.len() {
            let job = self.jobs.pop_front().unwrap();
            if !only.contains(&job.conn()) {
                self.jobs.push_back(job);
                continue;
            }
            let (job, m) = self.advance(job);
            moved |= m;
            self.jobs.extend(job);
        }
        moved
    }

    /// Runs the connections in `only` until nothing moves.
    pub fn run_on(&mut self, only: &[usize]) {
        for _ in 0..100_000 {
            if !self.turn(only) {
                return;
            }
        }
        panic!("the sessions never settle");
    }

    /// Runs every connection until nothing moves.
    pub fn run(&mut self) {
        let all: Vec<usize> = (0..self.conns.len()).collect();
        self.run_on(&all);
    }

    /// Delivers the next frame in `c`'s inbox, and nothing else.
    pub fn deliver(&mut self, c: usize) {
        let f = self.conns[c].inbox.pop_front().expect("a frame");
        self.receive(c, f);
    }

    /// One step of `c`'s first job, and nothing else.
    pub fn job(&mut self, c: usize) {
        let k = self.jobs.iter().position(|j| j.conn() == c).expect("a job");
        let job = self.jobs.remove(k).unwrap();
        let (job, _) = self.advance(job);
        self.jobs.extend(job);
    }

    /// A frame from the scripted peer of `c`.
    pub fn inject(&mut self, c: usize, msg: Message) {
        self.conns[c].inbox.push_back(Frame {
            msg,
            payload: vec![],
        });
    }

    /// A `Data` frame and its payload from the scripted peer of `c`.
    pub fn inject_data(&mut self, c: usize, req: u64, desc: u32, offset: u64, payload: &[u8]) {
        let d = Data {
            req,
            desc,
            offset,
            len: payload.len() as u32,
        };
        self.conns[c].inbox.push_back(Frame {
            msg: Message::Data(d),
            payload: payload.to_vec(),
        });
    }

    /// What `c` sent to its scripted peer since the last call.
    pub fn sent(&mut self, c: usize) -> Vec<Message> {
        std::mem::take(&mut self.conns[c].out)
            .into_iter()
            .map(|f| f.msg)
            .collect()
    }

    /// Every session idle, nothing lent.
    pub fn assert_idle(&self) {
        for c in &self.conns {
            assert_eq!(c.s.pending(), 0, "{} has requests left", c.name);
        }
        assert!(
            self.lent.is_empty(),
            "memory still lent: {:?}",
            self.lent.keys()
        );
        assert!(self.jobs.is_empty(), "jobs left");
    }

    pub fn violation(&self, c: usize) -> Option<Violation> {
        self.conns[c].violation.clone()
    }
}
