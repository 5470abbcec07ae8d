//! Two [`Session`]s back to back, an active and a passive one, with a small
//! driver in this file that moves frames between them and runs their
//! actions against memory in `Vec`s: every transfer path (in band, lent,
//! the fallback from a lease to `Data`, striped in three parts), a cancel
//! in the middle, and hostile peers that break the frame-level rules of
//! `crates/ferry/tests/bad_input.rs`. Every transfer checks the bytes that
//! landed against the source, byte for byte.
//!
//! The driver is synchronous: after every call into a session it runs the
//! actions it queued, in order. Frames wait in each connection's inbox
//! until [`World::run`] (or [`World::run_on`], for some connections only)
//! delivers them; `Data` payloads travel with their frame. A `Stream` is
//! a job that sends one frame per turn, so that a cancel can come in the
//! middle of it.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use ferry_proto::session::{
    Action, Caps, Fence, Last, OpenParams, Role, Session, Start, Step, StripeState, Violation,
};
use ferry_proto::wire::{Abort, AbortReason, Data, Lease, Message, Open};
use ferry_proto::{Cursor, OperationKind, Token};

/// What memory that nothing wrote holds.
const UNTOUCHED: u8 = 0xEE;

// ---------------------------------------------------------------------------
// Operations: memory, a fence, an outcome.

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Complete,
    /// Cancelled here.
    Cancelled,
    /// Ended by the peer's `Abort`.
    Aborted(AbortReason),
    /// Its connection closed (a violation, or lost).
    Errored(String),
}

#[derive(Debug)]
struct Op {
    /// Names its memory in a lease's addresses.
    key: u64,
    bufs: RefCell<Vec<Vec<u8>>>,
    sealed: Cell<bool>,
    open: Cell<bool>,
    outcome: RefCell<Option<Outcome>>,
    /// A striped operation's parts, shared by their requests.
    stripe: RefCell<Option<StripeState>>,
    /// Each `Via` reported (`true`: lent).
    via: RefCell<Vec<bool>>,
    /// `(connection, request)` of each request that carries it.
    reqs: RefCell<Vec<(usize, u64)>>,
    /// Lent and not yet given back.
    lends: Cell<i32>,
}

/// The driver's handle on an operation.
#[derive(Clone, Debug)]
struct H(Rc<Op>);

impl Fence for H {
    fn is_sealed(&self) -> bool {
        self.0.sealed.get()
    }
    fn is_open(&self) -> bool {
        self.0.open.get()
    }
    fn can_commit(&self) -> bool {
        self.0
            .stripe
            .borrow()
            .as_ref()
            .map_or(true, StripeState::can_commit)
    }
}

impl H {
    fn outcome(&self) -> Option<Outcome> {
        self.0.outcome.borrow().clone()
    }
    fn bytes(&self) -> Vec<Vec<u8>> {
        self.0.bufs.borrow().clone()
    }
    fn sizes(&self) -> Vec<u64> {
        self.0
            .bufs
            .borrow()
            .iter()
            .map(|b| b.len() as u64)
            .collect()
    }
    fn via(&self) -> Vec<bool> {
        self.0.via.borrow().clone()
    }
    /// Its memory as a lease: descriptor `i` at `key << 40 | i << 32`.
    fn segments(&self) -> Vec<(u64, u64)> {
        self.sizes()
            .into_iter()
            .enumerate()
            .map(|(i, len)| (self.0.key << 40 | (i as u64) << 32, len))
            .collect()
    }
    fn stripe_done(&self) -> u16 {
        self.0.stripe.borrow().as_ref().map_or(0, StripeState::done)
    }
}

/// What the active side knows of a passive operation (its metadata).
#[derive(Debug, Clone)]
struct Meta {
    op_id: u64,
    token: Token,
    sizes: Vec<u64>,
}

// ---------------------------------------------------------------------------
// Connections and the driver.

#[derive(Debug, Clone)]
struct Frame {
    msg: Message,
    payload: Vec<u8>,
}

struct Conn {
    name: String,
    s: Session<H>,
    /// The session that reads what this one sends; `None`: a scripted
    /// peer, whose frames the test reads from `out` and writes to `inbox`.
    peer: Option<usize>,
    inbox: VecDeque<Frame>,
    out: Vec<Frame>,
    closed: bool,
    violation: Option<Violation>,
    discarded: usize,
}

enum Job {
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
    fn conn(&self) -> usize {
        match self {
            Job::Stream { c, .. } | Job::Pull { c, .. } => *c,
        }
    }
}

struct World {
    conns: Vec<Conn>,
    jobs: VecDeque<Job>,
    /// The passive side's exposure table, by operation id.
    exposed: BTreeMap<u64, (Token, OperationKind, H)>,
    /// Memory lent to a peer, by key.
    lent: BTreeMap<u64, H>,
    next_key: u64,
    /// The largest `Data` payload.
    chunk: u32,
    /// What happened, in order: `"<connection> <event>"`.
    log: Vec<String>,
}

const IN_BAND: Caps = Caps {
    attach: false,
    can_pull: false,
    peer_pulls: false,
    secret: false,
};
/// Attach set up both ways: either side may lend, either may pull.
const ATTACH: Caps = Caps {
    attach: true,
    can_pull: true,
    peer_pulls: true,
    secret: false,
};

impl World {
    fn new() -> World {
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

    fn conn(&mut self, name: String, role: Role, caps: Caps, peer: Option<usize>) -> usize {
        self.conns.push(Conn {
            name,
            s: Session::new(role, caps),
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
    fn pair(&mut self, active: Caps, passive: Caps) -> (usize, usize) {
        let n = self.conns.len();
        let a = self.conn(format!("active{n}"), Role::Active, active, Some(n + 1));
        let p = self.conn(format!("passive{}", n + 1), Role::Passive, passive, Some(n));
        (a, p)
    }

    /// An honest session whose peer the test plays.
    fn facing_script(&mut self, role: Role, caps: Caps) -> usize {
        let n = self.conns.len();
        self.conn(format!("{role:?}{n}").to_lowercase(), role, caps, None)
    }

    fn op(&mut self, bufs: Vec<Vec<u8>>, parts: u16) -> H {
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
    fn expose(&mut self, kind: OperationKind, bufs: Vec<Vec<u8>>) -> (H, Meta) {
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

    fn note(&mut self, c: usize, what: String) {
        let line = format!("{} {what}", self.conns[c].name);
        self.log.push(line);
    }

    fn send(&mut self, c: usize, msg: Message, payload: Vec<u8>) {
        let f = Frame { msg, payload };
        match self.conns[c].peer {
            Some(p) if !self.conns[p].closed => self.conns[p].inbox.push_back(f),
            Some(_) => {}
            None => self.conns[c].out.push(f),
        }
    }

    /// Starts an active request at `c` (`part`: which of how many).
    fn start(
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
            part,
        };
        let (req, start) = self.conns[c].s.open(p, target.clone());
        target.0.reqs.borrow_mut().push((c, req));
        match start {
            Start::Open(m) => self.send(c, m, vec![]),
            Start::OpenAndLease(m) => {
                self.send(c, m, vec![]);
                let segments = target.segments();
                self.send(c, Message::Lease(Lease { req, segments }), vec![]);
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
    fn flush(&mut self, c: usize) {
        while let Some(a) = self.conns[c].s.poll_action() {
            self.act(c, a);
        }
    }

    fn act(&mut self, c: usize, a: Action<H>) {
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
            Action::Via { target, lent } => target.0.via.borrow_mut().push(lent),
            Action::Lend { target } => {
                target.0.lends.set(target.0.lends.get() + 1);
                self.lent.insert(target.0.key, target);
            }
            Action::SendLease { req, target } => {
                let segments = target.segments();
                self.send(c, Message::Lease(Lease { req, segments }), vec![]);
            }
            Action::GiveBack { target } => self.give_back(&target),
            Action::Pull {
                req,
                target,
                segments,
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

    fn give_back(&mut self, target: &H) {
        let n = target.0.lends.get();
        assert!(n > 0, "memory given back that was not lent");
        target.0.lends.set(n - 1);
        if n == 1 {
            self.lent.remove(&target.0.key);
        }
    }

    /// Ends `op` here (once): its other requests are forgotten, and their
    /// peers told `tell`.
    fn end(&mut self, op: &H, outcome: Outcome, tell: Option<AbortReason>) -> bool {
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
    fn cancel(&mut self, op: &H) -> bool {
        if op.is_sealed() {
            return false;
        }
        self.end(op, Outcome::Cancelled, Some(AbortReason::Cancelled))
    }

    /// The connection ends: every operation on it fails with `why`.
    fn close(&mut self, c: usize, why: String) {
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
    fn check_grant(&mut self, o: &Open) -> Result<H, (AbortReason, String)> {
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
        if op.sizes() != o.sizes {
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
    fn receive(&mut self, c: usize, f: Frame) {
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
            Ok(Step::AttachOffer { .. }) => self.conns[c].s.attach_offered(None),
            Ok(Step::AttachVerify { .. }) => {
                let m = self.conns[c].s.attach_verified(false);
                self.send(c, m, vec![]);
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
    fn copy(&self, target: &H, segments: &[(u64, u64)]) -> bool {
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
    fn advance(&mut self, job: Job) -> (Option<Job>, bool) {
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
    fn turn(&mut self, only: &[usize]) -> bool {
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
    fn run_on(&mut self, only: &[usize]) {
        for _ in 0..100_000 {
            if !self.turn(only) {
                return;
            }
        }
        panic!("the sessions never settle");
    }

    /// Runs every connection until nothing moves.
    fn run(&mut self) {
        let all: Vec<usize> = (0..self.conns.len()).collect();
        self.run_on(&all);
    }

    /// Delivers the next frame in `c`'s inbox, and nothing else.
    fn deliver(&mut self, c: usize) {
        let f = self.conns[c].inbox.pop_front().expect("a frame");
        self.receive(c, f);
    }

    /// One step of `c`'s first job, and nothing else.
    fn job(&mut self, c: usize) {
        let k = self.jobs.iter().position(|j| j.conn() == c).expect("a job");
        let job = self.jobs.remove(k).unwrap();
        let (job, _) = self.advance(job);
        self.jobs.extend(job);
    }

    /// A frame from the scripted peer of `c`.
    fn inject(&mut self, c: usize, msg: Message) {
        self.conns[c].inbox.push_back(Frame {
            msg,
            payload: vec![],
        });
    }

    /// A `Data` frame and its payload from the scripted peer of `c`.
    fn inject_data(&mut self, c: usize, req: u64, desc: u32, offset: u64, payload: &[u8]) {
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
    fn sent(&mut self, c: usize) -> Vec<Message> {
        std::mem::take(&mut self.conns[c].out)
            .into_iter()
            .map(|f| f.msg)
            .collect()
    }

    /// Every session idle, nothing lent.
    fn assert_idle(&self) {
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

    fn violation(&self, c: usize) -> Option<Violation> {
        self.conns[c].violation.clone()
    }
}

fn abort(req: u64, reason: AbortReason) -> Message {
    Message::Abort(Abort {
        req,
        reason,
        detail: format!("{reason:?}"),
    })
}

/// Deterministic bytes, different per seed.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn patterns(sizes: &[usize], seed: u8) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, seed.wrapping_add(i as u8 * 17)))
        .collect()
}

fn untouched(sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes.iter().map(|&n| vec![UNTOUCHED; n]).collect()
}

/// Several descriptors, one empty, none a multiple of the chunk.
const SIZES: [usize; 4] = [37, 0, 1, 64];

/// A READ or WRITE between one pair; returns the source's and the
/// destination's operations after the run.
fn transfer(kind: OperationKind, active: Caps, passive: Caps, pull: bool) -> (World, H, H) {
    let mut w = World::new();
    let (a, _) = w.pair(active, passive);
    let (src, dst) = match kind {
        OperationKind::Read => {
            let (src, meta) = w.expose(kind, patterns(&SIZES, 1));
            let dst = w.op(untouched(&SIZES), 1);
            w.start(a, kind, &dst, &meta, pull, (0, 1));
            (src, dst)
        }
        OperationKind::Write => {
            let (dst, meta) = w.expose(kind, untouched(&SIZES));
            let src = w.op(patterns(&SIZES, 2), 1);
            w.start(a, kind, &src, &meta, pull, (0, 1));
            (src, dst)
        }
    };
    w.run();
    assert_clean(&w);
    (w, src, dst)
}

fn assert_complete(w: &World, src: &H, dst: &H) {
    assert_eq!(
        src.outcome(),
        Some(Outcome::Complete),
        "source; log {:#?}",
        w.log
    );
    assert_eq!(
        dst.outcome(),
        Some(Outcome::Complete),
        "destination; log {:#?}",
        w.log
    );
    assert_eq!(dst.bytes(), src.bytes(), "the destination's bytes");
    assert!(src.is_sealed(), "the source sealed");
    w.assert_idle();
}

fn assert_clean(w: &World) {
    for c in &w.conns {
        assert_eq!(c.violation, None, "{}", c.name);
        assert!(!c.closed, "{}", c.name);
    }
}

// ---------------------------------------------------------------------------
// Every path.

#[test]
fn read_in_band() {
    let (w, src, dst) = transfer(OperationKind::Read, IN_BAND, IN_BAND, false);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![false], vec![false]));
    // In band even with attach set up, when not asked to pull.
    let (w, src, dst) = transfer(OperationKind::Read, ATTACH, ATTACH, false);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![false], vec![false]));
}

#[test]
fn write_in_band() {
    let (w, src, dst) = transfer(OperationKind::Write, IN_BAND, IN_BAND, false);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![false], vec![false]));
}

#[test]
fn pulled_read() {
    let (w, src, dst) = transfer(OperationKind::Read, ATTACH, ATTACH, true);
    assert_complete(&w, &src, &dst);
    // The passive side lent; the active side copied.
    assert_eq!((src.via(), dst.via()), (vec![true], vec![true]));
    assert_eq!(src.0.lends.get(), 0);
    assert!(
        w.log.iter().any(|l| l == "passive1 commit 1"),
        "{:?}",
        w.log
    );
    assert!(w.log.iter().any(|l| l == "active0 complete"), "{:?}", w.log);
}

#[test]
fn pulled_write() {
    let (w, src, dst) = transfer(OperationKind::Write, ATTACH, ATTACH, true);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![true], vec![true]));
    assert_eq!(src.0.lends.get(), 0);
    assert!(w.log.iter().any(|l| l == "active0 commit 1"), "{:?}", w.log);
    assert!(
        w.log.iter().any(|l| l == "passive1 complete"),
        "{:?}",
        w.log
    );
}

#[test]
fn a_read_that_asks_for_a_lease_falls_back_to_data() {
    // The passive side may not lend: the peer never proved it can copy.
    for passive in [
        Caps {
            peer_pulls: false,
            ..ATTACH
        },
        Caps {
            attach: false,
            ..ATTACH
        },
        IN_BAND,
    ] {
        let (w, src, dst) = transfer(OperationKind::Read, ATTACH, passive, true);
        assert_complete(&w, &src, &dst);
        assert_eq!(src.via(), [false], "{passive:?}");
        // Known at the active side with the first `Data`.
        assert_eq!(dst.via(), [false], "{passive:?}");
    }
}

// ---------------------------------------------------------------------------
// Striped: three parts over three connections.

/// A striped transfer of `kind` in three parts, each on a connection of
/// its own, the operations on both sides shared by their parts. Nothing
/// has run yet.
fn striped(kind: OperationKind) -> (World, H, H, [(usize, usize); 3]) {
    let sizes = [10usize, 3, 20];
    let mut w = World::new();
    let pairs = [
        w.pair(IN_BAND, IN_BAND),
        w.pair(IN_BAND, IN_BAND),
        w.pair(IN_BAND, IN_BAND),
    ];
    let (src, dst, meta, mine) = match kind {
        OperationKind::Read => {
            let (src, meta) = w.expose(kind, patterns(&sizes, 3));
            let dst = w.op(untouched(&sizes), 3);
            (src, dst.clone(), meta, dst)
        }
        OperationKind::Write => {
            let (dst, meta) = w.expose(kind, untouched(&sizes));
            let src = w.op(patterns(&sizes, 4), 3);
            (src.clone(), dst, meta, src)
        }
    };
    for (i, &(a, _)) in pairs.iter().enumerate() {
        w.start(a, kind, &mine, &meta, true, (i as u16, 3));
    }
    (w, src, dst, pairs)
}

fn events(w: &World, side: &str) -> Vec<String> {
    w.log
        .iter()
        .filter(|l| l.starts_with(side))
        .map(|l| l.split_once(' ').unwrap().1.to_string())
        .collect()
}

#[test]
fn striped_write_and_read_in_three_parts() {
    for kind in [OperationKind::Write, OperationKind::Read] {
        let (mut w, src, dst, _) = striped(kind);
        w.run();
        assert_clean(&w);
        assert_complete(&w, &src, &dst);
        // In band on every part, though a lease was asked for.
        assert_eq!(src.via(), [false; 3]);
        assert_eq!(dst.via(), [false; 3]);
        // On each side, two parts done, then part 0 ends the whole.
        let (committer, completer) = match kind {
            OperationKind::Write => ("passive", "active"),
            OperationKind::Read => ("active", "passive"),
        };
        assert_eq!(
            events(&w, committer),
            ["part done", "part done", "commit 1"],
            "{kind:?}: {:#?}",
            w.log
        );
        assert_eq!(
            events(&w, completer),
            ["part done", "part done", "complete"],
            "{kind:?}: {:#?}",
            w.log
        );
    }
}

/// Part 0 runs alone first: every byte of it arrives, but its sealing
/// `Finish` waits until the source's fence says every other part is
/// confirmed (`can_commit`); and the destination, were it sent early,
/// would refuse it (see the unit tests).
#[test]
fn part_zero_waits_for_the_other_parts() {
    for kind in [OperationKind::Write, OperationKind::Read] {
        let (mut w, src, dst, pairs) = striped(kind);
        let [(a0, p0), (a1, p1), (a2, p2)] = pairs;
        w.run_on(&[a0, p0]);
        // Part 0 of [10, 3, 20] is bytes [0, 11): all of them landed.
        let landed = dst.bytes();
        assert_eq!(landed[0], src.bytes()[0]);
        assert_eq!(landed[1][0], src.bytes()[1][0]);
        assert_eq!(&landed[1][1..], [UNTOUCHED; 2]);
        assert!(!src.can_commit() && !dst.can_commit());
        assert!(!src.is_sealed());
        assert_eq!((src.outcome(), dst.outcome()), (None, None));
        // The source waits with its `Finish`.
        let waiting = w.jobs.iter().filter(|j| [a0, p0].contains(&j.conn()));
        assert_eq!(waiting.count(), 1);

        w.run_on(&[a1, p1]);
        assert_eq!((src.stripe_done(), dst.stripe_done()), (1, 1));
        assert!(!src.can_commit() && !dst.can_commit());
        w.run_on(&[a0, p0]);
        assert_eq!((src.outcome(), dst.outcome()), (None, None));

        w.run_on(&[a2, p2]);
        assert!(src.can_commit() && dst.can_commit());
        assert_eq!((src.outcome(), dst.outcome()), (None, None));
        w.run_on(&[a0, p0]);
        assert_complete(&w, &src, &dst);
    }
}

// ---------------------------------------------------------------------------
// A cancel in the middle.

#[test]
fn a_cancel_in_the_middle_of_a_write() {
    let mut w = World::new();
    let (a, p) = w.pair(IN_BAND, IN_BAND);
    let sizes = [100usize];
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&sizes));
    let src = w.op(patterns(&sizes, 5), 1);
    let req = w.start(a, OperationKind::Write, &src, &meta, false, (0, 1));
    // A few turns: the `Open` and some `Data` are through.
    for _ in 0..4 {
        w.turn(&[a, p]);
    }
    assert!(dst.bytes()[0][..5] == src.bytes()[0][..5]);
    assert!(w.cancel(&src));
    assert_eq!(w.conns[a].s.pending(), 0);
    w.run();
    assert_eq!(src.outcome(), Some(Outcome::Cancelled));
    assert_eq!(
        dst.outcome(),
        Some(Outcome::Aborted(AbortReason::Cancelled))
    );
    assert!(!dst.is_sealed());
    // What landed is a prefix of the source; nothing after it.
    let got = &dst.bytes()[0];
    let n = got.iter().position(|&b| b == UNTOUCHED).unwrap();
    assert!((5..100).contains(&n), "{n}");
    assert_eq!(got[..n], src.bytes()[0][..n]);
    assert!(got[n..].iter().all(|&b| b == UNTOUCHED));
    w.assert_idle();
    assert!(w
        .log
        .contains(&"passive1 remote abort Cancelled".to_string()));
    let _ = req;
}

#[test]
fn a_cancel_in_the_middle_of_a_read() {
    let mut w = World::new();
    let (a, p) = w.pair(IN_BAND, IN_BAND);
    let sizes = [100usize];
    let (src, meta) = w.expose(OperationKind::Read, patterns(&sizes, 6));
    let dst = w.op(untouched(&sizes), 1);
    w.start(a, OperationKind::Read, &dst, &meta, false, (0, 1));
    for _ in 0..5 {
        w.turn(&[a, p]);
    }
    assert!(w.cancel(&dst));
    w.run();
    assert_eq!(dst.outcome(), Some(Outcome::Cancelled));
    assert_eq!(
        src.outcome(),
        Some(Outcome::Aborted(AbortReason::Cancelled))
    );
    // `Data` already on its way to the active side is dropped there.
    assert!(w.conns[a].discarded > 0);
    let got = &dst.bytes()[0];
    let n = got.iter().position(|&b| b == UNTOUCHED).unwrap();
    assert_eq!(got[..n], src.bytes()[0][..n]);
    w.assert_idle();
}

#[test]
fn a_cancel_of_a_pulled_read_gives_the_lent_memory_back() {
    // Before the lease arrives, and after (before the copy runs).
    for lease_first in [false, true] {
        let mut w = World::new();
        let (a, p) = w.pair(ATTACH, ATTACH);
        let (src, meta) = w.expose(OperationKind::Read, patterns(&SIZES, 7));
        let dst = w.op(untouched(&SIZES), 1);
        w.start(a, OperationKind::Read, &dst, &meta, true, (0, 1));
        w.deliver(p);
        assert_eq!(src.0.lends.get(), 1);
        if lease_first {
            w.deliver(a);
            assert_eq!(dst.via(), [true]);
            assert_eq!(w.jobs.len(), 1, "the copy waits");
        }
        assert!(w.cancel(&dst));
        w.run();
        assert_eq!(dst.outcome(), Some(Outcome::Cancelled));
        assert_eq!(
            src.outcome(),
            Some(Outcome::Aborted(AbortReason::Cancelled))
        );
        assert_eq!(dst.bytes(), untouched(&SIZES));
        assert_eq!(src.0.lends.get(), 0);
        w.assert_idle();
    }
}

/// The passive side withdraws a READ it lent while the active side is
/// about to copy it: the copy that starts before the `Abort` arrives must
/// still find the memory lent (the `Release` that answers the `Abort`, or
/// the copy's own `Finish`, gives it back). See the unit test
/// `a_forgotten_lease_stays_lent_until_the_peer_stops_copying`.
#[test]
fn a_withdrawn_lease_stays_lent_while_the_peer_copies() {
    let mut w = World::new();
    let (a, p) = w.pair(ATTACH, ATTACH);
    let (src, meta) = w.expose(OperationKind::Read, patterns(&SIZES, 12));
    let dst = w.op(untouched(&SIZES), 1);
    w.start(a, OperationKind::Read, &dst, &meta, true, (0, 1));
    w.deliver(p);
    w.deliver(a);
    assert!(w.cancel(&src));
    assert_eq!(src.0.lends.get(), 1, "given back while the peer may copy");
    // The copy runs before the `Abort` arrives.
    w.job(a);
    w.run();
    assert_eq!(src.outcome(), Some(Outcome::Cancelled));
    assert_eq!(
        dst.outcome(),
        Some(Outcome::Aborted(AbortReason::Cancelled))
    );
    assert_eq!(src.0.lends.get(), 0);
    w.assert_idle();
}

#[test]
fn a_cancel_after_the_seal_changes_nothing() {
    let mut w = World::new();
    let (a, _) = w.pair(IN_BAND, IN_BAND);
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&SIZES));
    let src = w.op(patterns(&SIZES, 8), 1);
    w.start(a, OperationKind::Write, &src, &meta, false, (0, 1));
    // Only the writer's stream runs: every byte and the `Finish` sent.
    w.run_on(&[a]);
    assert!(src.is_sealed());
    assert!(!w.cancel(&src));
    w.run();
    assert_complete(&w, &src, &dst);
}

// ---------------------------------------------------------------------------
// Hostile peers (the frame-level rules of `crates/ferry/tests/bad_input.rs`):
// the honest session names the violation, closes, and every operation on
// the connection fails; memory outside what was sent stays untouched.

fn open_frame(req: u64, kind: OperationKind, meta: &Meta, pull: bool, part: (u16, u16)) -> Message {
    Message::Open(Open {
        req,
        op_id: meta.op_id,
        token: meta.token,
        kind,
        sizes: meta.sizes.clone(),
        pull,
        part: part.0,
        parts: part.1,
    })
}

fn assert_errored(op: &H, v: &Violation) {
    assert_eq!(op.outcome(), Some(Outcome::Errored(v.to_string())));
}

#[test]
fn hostile_writer_sends_data_outside_its_part() {
    let mut w = World::new();
    let (x, y) = (
        w.facing_script(Role::Passive, IN_BAND),
        w.facing_script(Role::Passive, IN_BAND),
    );
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&[10]));
    w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 2)));
    w.inject(y, open_frame(1, OperationKind::Write, &meta, false, (1, 2)));
    w.run();
    // Part 0 writes into part 1's range [5, 10).
    w.inject_data(x, 1, 0, 5, &[1; 5]);
    w.run();
    let v = w.violation(x).expect("a violation");
    assert!(matches!(v, Violation::DataOutOfOrder(_)), "{v:?}");
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), untouched(&[10]));
    // The other part's request ended with the operation, and was told.
    assert!(w.sent(x).is_empty());
    assert_eq!(w.sent(y), [abort(1, AbortReason::PartFailed)]);
    w.assert_idle();
}

#[test]
fn hostile_reader_sends_data_outside_its_part() {
    let mut w = World::new();
    let (x, y) = (
        w.facing_script(Role::Active, IN_BAND),
        w.facing_script(Role::Active, IN_BAND),
    );
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![10],
    };
    let dst = w.op(untouched(&[10]), 2);
    let r0 = w.start(x, OperationKind::Read, &dst, &meta, false, (0, 2));
    let r1 = w.start(y, OperationKind::Read, &dst, &meta, false, (1, 2));
    // Part 1 is [5, 10); the passive side sends byte 4.
    w.inject_data(y, r1, 0, 4, &[1; 6]);
    w.run();
    let v = w.violation(y).expect("a violation");
    assert!(matches!(v, Violation::DataOutOfOrder(_)), "{v:?}");
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), untouched(&[10]));
    let opens = w.sent(x);
    assert_eq!(opens.last(), Some(&abort(r0, AbortReason::PartFailed)));
    w.assert_idle();
}

#[test]
fn hostile_writer_finishes_before_all_data() {
    let mut w = World::new();
    let x = w.facing_script(Role::Passive, IN_BAND);
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&[8, 8]));
    w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 1)));
    w.inject_data(x, 1, 0, 0, &[1; 8]);
    w.inject_data(x, 1, 1, 0, &[2; 4]);
    w.inject(x, Message::Finish { req: 1 });
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::FinishBeforeAllData { req: 1 });
    assert_errored(&dst, &v);
    // What was sent landed; the rest is untouched; nothing was confirmed.
    let want = vec![vec![1; 8], [vec![2; 4], vec![UNTOUCHED; 4]].concat()];
    assert_eq!(dst.bytes(), want);
    assert!(w.sent(x).is_empty());
    w.assert_idle();
}

#[test]
fn hostile_reader_finishes_before_all_data() {
    let mut w = World::new();
    let x = w.facing_script(Role::Active, IN_BAND);
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![8],
    };
    let dst = w.op(untouched(&[8]), 1);
    let req = w.start(x, OperationKind::Read, &dst, &meta, false, (0, 1));
    w.inject_data(x, req, 0, 0, &[3; 7]);
    w.inject(x, Message::Finish { req });
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::FinishBeforeAllData { req });
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), [[vec![3; 7], vec![UNTOUCHED]].concat()]);
    w.assert_idle();
}

#[test]
fn hostile_destination_confirms_a_part_before_it_was_sent() {
    let mut w = World::new();
    let (x, y) = (
        w.facing_script(Role::Active, IN_BAND),
        w.facing_script(Role::Active, IN_BAND),
    );
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![100],
    };
    let src = w.op(patterns(&[100], 9), 2);
    let r0 = w.start(x, OperationKind::Write, &src, &meta, false, (0, 2));
    let r1 = w.start(y, OperationKind::Write, &src, &meta, false, (1, 2));
    // One frame of part 1 is out; the confirmation comes at once.
    w.turn(&[y]);
    w.inject(y, Message::Finish { req: r1 });
    w.run();
    let v = w.violation(y).expect("a violation");
    assert_eq!(v, Violation::PartConfirmedBeforeSent { part: 1 });
    assert_errored(&src, &v);
    assert!(!src.is_sealed());
    // Part 0 stopped and was told; it never sealed.
    let to_x = w.sent(x);
    assert_eq!(to_x.last(), Some(&abort(r0, AbortReason::PartFailed)));
    assert!(!to_x.contains(&Message::Finish { req: r0 }));
    w.assert_idle();
}

#[test]
fn hostile_writer_leases_memory_of_another_shape() {
    for lens in [vec![37, 0, 1], vec![37, 0, 1, 65], vec![37, 1, 0, 64]] {
        let mut w = World::new();
        let x = w.facing_script(Role::Passive, ATTACH);
        let (dst, meta) = w.expose(OperationKind::Write, untouched(&SIZES));
        w.inject(x, open_frame(1, OperationKind::Write, &meta, true, (0, 1)));
        let segments = lens.iter().map(|&l| (0x1000, l)).collect();
        w.inject(x, Message::Lease(Lease { req: 1, segments }));
        w.run();
        let v = w.violation(x).expect("a violation");
        assert_eq!(v, Violation::LeaseShapeMismatch { req: 1 });
        assert_errored(&dst, &v);
        assert_eq!(dst.bytes(), untouched(&SIZES));
        w.assert_idle();
    }
}

#[test]
fn hostile_passive_lends_memory_of_another_shape() {
    let mut w = World::new();
    let x = w.facing_script(Role::Active, ATTACH);
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![8, 8],
    };
    let dst = w.op(untouched(&[8, 8]), 1);
    let req = w.start(x, OperationKind::Read, &dst, &meta, true, (0, 1));
    w.inject(
        x,
        Message::Lease(Lease {
            req,
            segments: vec![(0x1000, 16)],
        }),
    );
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::LeaseShapeMismatch { req });
    assert_errored(&dst, &v);
    assert_eq!(dst.via(), Vec::<bool>::new());
    w.assert_idle();
}

#[test]
fn hostile_writer_reuses_a_request_number() {
    let mut w = World::new();
    let x = w.facing_script(Role::Passive, IN_BAND);
    let (first, m1) = w.expose(OperationKind::Write, untouched(&[8]));
    let (second, m2) = w.expose(OperationKind::Write, untouched(&[8]));
    w.inject(x, open_frame(1, OperationKind::Write, &m1, false, (0, 1)));
    w.inject_data(x, 1, 0, 0, &[4; 3]);
    w.inject(x, open_frame(1, OperationKind::Write, &m2, false, (0, 1)));
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::RequestNumberInUse(1));
    assert_errored(&first, &v);
    // The second `Open` bound nothing: its operation is untouched, and
    // an honest writer on another connection still completes it.
    assert_eq!(second.outcome(), None);
    let (a, _) = w.pair(IN_BAND, IN_BAND);
    let src = w.op(vec![pattern(8, 10)], 1);
    w.start(a, OperationKind::Write, &src, &m2, false, (0, 1));
    w.run();
    assert_eq!(second.outcome(), Some(Outcome::Complete));
    assert_eq!(second.bytes(), src.bytes());
    w.assert_idle();
}

#[test]
fn hostile_passive_sends_an_open() {
    let mut w = World::new();
    let x = w.facing_script(Role::Active, IN_BAND);
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![8],
    };
    let dst = w.op(untouched(&[8]), 1);
    w.start(x, OperationKind::Read, &dst, &meta, false, (0, 1));
    w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 1)));
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::OpenToActiveSide);
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), untouched(&[8]));
    w.assert_idle();
}

#[test]
fn hostile_peer_authenticates_again_and_is_told() {
    for (secret, want) in [
        (true, Violation::UnexpectedAuth),
        (false, Violation::AuthWithoutSecret),
    ] {
        let mut w = World::new();
        let x = w.facing_script(Role::Passive, Caps { secret, ..IN_BAND });
        let (dst, meta) = w.expose(OperationKind::Write, untouched(&[8]));
        w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 1)));
        w.inject(
            x,
            Message::Auth(ferry_proto::wire::Auth {
                handshake: vec![0; 32],
            }),
        );
        w.run();
        assert_eq!(w.violation(x), Some(want.clone()));
        assert_errored(&dst, &want);
        let told = Message::Abort(Abort {
            req: 0,
            reason: AbortReason::Unauthenticated,
            detail: want.to_string(),
        });
        assert_eq!(w.sent(x), [told]);
        w.assert_idle();
    }
}

/// A violation on one connection fails its operations only: a transfer
/// on another connection between the same two sides completes.
#[test]
fn a_violation_ends_only_its_own_connection() {
    let mut w = World::new();
    let (a, _) = w.pair(IN_BAND, IN_BAND);
    let x = w.facing_script(Role::Passive, IN_BAND);
    let (hit, m1) = w.expose(OperationKind::Write, untouched(&[8]));
    let (dst, m2) = w.expose(OperationKind::Write, untouched(&SIZES));
    let src = w.op(patterns(&SIZES, 11), 1);
    w.start(a, OperationKind::Write, &src, &m2, false, (0, 1));
    w.inject(x, open_frame(3, OperationKind::Write, &m1, false, (0, 1)));
    w.inject_data(x, 3, 0, 1, &[1]);
    w.run();
    assert!(matches!(w.violation(x), Some(Violation::DataOutOfOrder(_))));
    assert!(matches!(hit.outcome(), Some(Outcome::Errored(_))));
    assert_eq!(src.outcome(), Some(Outcome::Complete));
    assert_eq!(dst.outcome(), Some(Outcome::Complete));
    assert_eq!(dst.bytes(), src.bytes());
    assert!(!w.conns[a].closed);
    w.assert_idle();
}
