//! The harness of the `session` fuzz target (`fuzz/fuzz_targets/session.rs`,
//! which includes this file), also run on stable by `tests/session_fuzz.rs`:
//! the script, the driver, and the driver's model of each side. What it
//! checks is in `session_fuzz_checks.rs`.
//!
//! The input is a script for an active and a passive [`Session`] on one
//! connection, driven by an honest driver (every action it queues is run
//! right after each call, as a real driver does) and interleaved with a
//! hostile peer: each byte picks a step: open a request at the active side,
//! deliver the next honest frame to either side, advance a `Data` stream or
//! a copy, inject a frame built from the input (or decoded from raw input
//! bytes with `wire::decode_frame`) into either side, cancel, lose the
//! connection. Frames injected are only those the wire can carry: each is
//! encoded and decoded back first.
//!
//! Whatever the script: nothing panics; each `Err` is a [`Violation`] with
//! the documented reason; and the session never hands the driver more than
//! the request's grant allows (`session_fuzz_checks.rs` says exactly what
//! that means).

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

use ferry_proto::lane::LaneId;
use ferry_proto::session::{
    part_range, Action, Caps, Fence, LaneAnswer, LaneProof, Last, OpenParams, Role, Session, Start,
    Step, Violation,
};
use ferry_proto::wire::{
    self, Abort, AbortReason, Auth, Data, Hello, LaneOffer, Lease, Message, Open, MAX_CHUNK,
    PROTOCOL_VERSION,
};
use ferry_proto::{Cursor, OperationKind, Token};

#[path = "session_fuzz_checks.rs"]
mod checks;
#[path = "lanes.rs"]
mod lanes;

/// What one run did, for tests that check the scripts reach far.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Frames fed to the sessions.
    pub frames: usize,
    /// `Step::Payload`s checked.
    pub payloads: usize,
    /// `Step::Discard`s.
    pub discards: usize,
    /// Actions run, by name.
    pub actions: BTreeMap<&'static str, usize>,
    /// Violations, by variant.
    pub violations: BTreeMap<&'static str, usize>,
    /// Connections that ended.
    pub connections: usize,
}

impl Stats {
    /// Adds another run's counts.
    pub fn add(&mut self, o: &Stats) {
        self.frames += o.frames;
        self.payloads += o.payloads;
        self.discards += o.discards;
        self.connections += o.connections;
        for (k, v) in &o.actions {
            *self.actions.entry(k).or_default() += v;
        }
        for (k, v) in &o.violations {
            *self.violations.entry(k).or_default() += v;
        }
    }
}

/// Runs the script `data`; panics if a check fails.
pub fn run(data: &[u8]) -> Stats {
    let mut h = Harness::new(data);
    let mut steps = 0;
    while h.input.more() && steps < 20_000 {
        h.step();
        steps += 1;
    }
    h.settle();
    h.lose_connection();
    h.stats
}

// ---------------------------------------------------------------------------
// The script's bytes.

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn more(&self) -> bool {
        self.pos < self.data.len()
    }
    /// The next byte; zero once the script has ended.
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn bit(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = start + n;
        &self.data[start..end]
    }
    /// A request number that collides often: 0 to 5.
    fn req(&mut self) -> u64 {
        u64::from(self.u8() % 6)
    }
    /// One to three small descriptor sizes, now and then a huge one.
    fn sizes(&mut self) -> Vec<u64> {
        let n = 1 + self.u8() % 3;
        (0..n)
            .map(|_| match self.u8() {
                250 => u64::MAX / 2,
                251 => u64::MAX,
                b => u64::from(b % 24),
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// The fence: flags that only move as a real one's do (open to closed,
// unsealed to sealed, not committable to committable).

#[derive(Debug)]
struct Flags {
    id: u32,
    sealed: Cell<bool>,
    open: Cell<bool>,
    commit: Cell<bool>,
}

#[derive(Clone, Debug)]
struct T(Rc<Flags>);

impl Fence for T {
    fn is_sealed(&self) -> bool {
        self.0.sealed.get()
    }
    fn is_open(&self) -> bool {
        self.0.open.get()
    }
    fn can_commit(&self) -> bool {
        self.0.commit.get()
    }
}

impl T {
    fn id(&self) -> u32 {
        self.0.id
    }
}

// ---------------------------------------------------------------------------
// The driver's model of each side.

/// What the driver granted a request (passive: `bound`) or asked for
/// (active: `open`), and how far its bytes have landed.
#[derive(Debug, Clone)]
struct Grant {
    id: u32,
    sizes: Vec<u64>,
    /// The flat range of its part (all of it when not striped).
    start: u128,
    end: u128,
    /// Where the next byte must land (a receiving request).
    next: u128,
    /// This side receives the bytes.
    dest: bool,
    part: Option<u16>,
    /// `part_sent` was called.
    sent: bool,
    target: T,
}

impl Grant {
    fn new(id: u32, sizes: Vec<u64>, dest: bool, part: (u16, u16), target: T) -> Grant {
        let total = sizes.iter().fold(0u64, |a, s| a.saturating_add(*s));
        let (start, end) = if part.1 > 1 {
            part_range(total, part.0, part.1)
        } else {
            (0, total)
        };
        Grant {
            id,
            sizes,
            start: start.into(),
            end: end.into(),
            next: start.into(),
            dest,
            part: (part.1 > 1).then_some(part.0),
            sent: false,
            target,
        }
    }

    /// The flat position of `(desc, offset)`.
    fn flat(&self, desc: u32, offset: u64) -> u128 {
        let before: u128 = self.sizes[..desc as usize]
            .iter()
            .map(|&s| u128::from(s))
            .sum();
        before + u128::from(offset)
    }

    /// `(desc, offset)` of flat position `at` (past the end: one past the
    /// last descriptor).
    fn locate(&self, at: u128) -> (u32, u64) {
        let mut left = at;
        for (i, &s) in self.sizes.iter().enumerate() {
            if left < u128::from(s) {
                return (i as u32, left as u64);
            }
            left -= u128::from(s);
        }
        (
            self.sizes.len() as u32,
            left.min(u128::from(u64::MAX)) as u64,
        )
    }
}

enum Job {
    Stream {
        req: u64,
        target: T,
        cursor: Cursor,
        last: Last,
        chunk: u32,
        next: u128,
        grant: Grant,
    },
    Pull {
        req: u64,
        target: T,
    },
}

struct End {
    s: Session<T>,
    caps: Caps,
    /// Live requests' grants, by request number.
    grants: BTreeMap<u64, Grant>,
    /// Memory lent (a `Lend` ran, no `GiveBack` yet), by handle.
    lent: BTreeSet<u32>,
    /// Parts counted done.
    parts_done: BTreeSet<u32>,
    /// Frames from the honest peer.
    inbox: VecDeque<Message>,
    jobs: Vec<Job>,
}

impl End {
    fn new(role: Role, caps: Caps) -> End {
        let mut s = Session::new(role, caps);
        s.set_lanes(&LANES[..2]);
        s.agree_lanes(lanes::agreed(caps.device));
        End {
            s,
            caps,
            grants: BTreeMap::new(),
            lent: BTreeSet::new(),
            parts_done: BTreeSet::new(),
            inbox: VecDeque::new(),
            jobs: Vec::new(),
        }
    }

    /// The grant of request `req`, which must carry `target`.
    fn grant(&self, req: u64, target: &T, what: &str) -> &Grant {
        let g = self
            .grants
            .get(&req)
            .unwrap_or_else(|| panic!("{what} for request {req}, which is not live"));
        assert_eq!(
            g.id,
            target.id(),
            "{what} for request {req} names another handle"
        );
        g
    }

    fn by_id(&self, id: u32, what: &str) -> (u64, &Grant) {
        self.grants
            .iter()
            .find(|(_, g)| g.id == id)
            .map(|(r, g)| (*r, g))
            .unwrap_or_else(|| panic!("{what} for handle {id}, which is not live"))
    }
}

const ACTIVE: usize = 0;
const PASSIVE: usize = 1;
/// The lanes both ends set up by offers (and one neither knows).
const LANES: [LaneId; 3] = [LaneId(1), LaneId(2), LaneId(77)];

struct Harness<'a> {
    input: Input<'a>,
    ends: [End; 2],
    /// Handles whose request ended.
    ended: BTreeSet<u32>,
    next_id: u32,
    stats: Stats,
}

impl<'a> Harness<'a> {
    fn new(data: &'a [u8]) -> Self {
        let mut input = Input { data, pos: 0 };
        let caps = |b: u8, secret: bool| Caps {
            attach: b & 1 != 0,
            can_pull: b & 2 != 0,
            peer_pulls: b & 4 != 0,
            secret,
            device: b & 0x60 != 0,
        };
        let b = input.u8();
        let secret = b & 0x80 != 0;
        Harness {
            input,
            ends: [
                End::new(Role::Active, caps(b, secret)),
                End::new(Role::Passive, caps(b >> 3, secret)),
            ],
            ended: BTreeSet::new(),
            next_id: 0,
            stats: Stats::default(),
        }
    }

    fn handle(&mut self, commit: bool) -> T {
        self.next_id += 1;
        T(Rc::new(Flags {
            id: self.next_id,
            sealed: Cell::new(false),
            open: Cell::new(true),
            commit: Cell::new(commit),
        }))
    }

    fn step(&mut self) {
        match self.input.u8() % 16 {
            0 | 1 => self.open(),
            2..=4 => self.deliver(PASSIVE),
            5..=7 => self.deliver(ACTIVE),
            8 | 9 => {
                let i = usize::from(self.input.bit());
                self.advance(i);
            }
            10 => self.settle(),
            11 => self.hostile(PASSIVE),
            12 => self.hostile(ACTIVE),
            13 => self.raw(),
            14 => self.local(),
            _ => {
                if self.input.u8() < 24 {
                    self.lose_connection();
                } else {
                    let i = usize::from(self.input.bit());
                    self.hostile(i);
                }
            }
        }
    }

    /// The honest active side starts a request.
    fn open(&mut self) {
        let kind = if self.input.bit() {
            OperationKind::Read
        } else {
            OperationKind::Write
        };
        let sizes: Vec<u64> = (0..1 + self.input.u8() % 3)
            .map(|_| u64::from(self.input.u8() % 24))
            .collect();
        let pull = self.input.bit();
        let parts = 1 + u16::from(self.input.u8() % 3);
        let part = u16::from(self.input.u8()) % parts;
        let commit = parts == 1 || self.input.bit();
        let t = self.handle(commit);
        let p = OpenParams {
            kind,
            op_id: 9,
            token: Token::from_bytes([9; 16]),
            sizes: sizes.clone(),
            pull,
            lane: pull.then_some(LaneId::CMA),
            part: (part, parts),
        };
        let e = &mut self.ends[ACTIVE];
        let (req, start) = e.s.open(p, t.clone());
        assert!(!e.grants.contains_key(&req), "request number {req} reused");
        let dest = kind == OperationKind::Read;
        let g = Grant::new(t.id(), sizes.clone(), dest, (part, parts), t.clone());
        e.grants.insert(req, g.clone());
        let open = |m: &Message| match m {
            Message::Open(o) => {
                assert_eq!(o.req, req);
                assert_eq!((o.kind, o.sizes.expand()), (kind, sizes.clone()));
                assert_eq!((o.part, o.parts), (part, parts));
                assert_eq!(o.pull, pull && parts == 1);
            }
            other => panic!("start with {other:?}"),
        };
        match start {
            Start::Open(m) => {
                assert!(dest, "a WRITE starts with its bytes or a lease");
                open(&m);
                self.send(ACTIVE, m);
            }
            Start::OpenAndLease(m, _) => {
                assert!(!dest && pull && parts == 1);
                open(&m);
                self.send(ACTIVE, m);
                let segments = lease_of(&sizes);
                self.send(
                    ACTIVE,
                    Message::Lease(Lease {
                        lane: ferry_proto::lane::LaneId::CMA,
                        req,
                        segments: segments.into(),
                        key: vec![],
                    }),
                );
            }
            Start::Stream {
                open: m,
                cursor,
                last,
            } => {
                assert!(!dest);
                open(&m);
                self.send(ACTIVE, m);
                self.stream(ACTIVE, req, t, cursor, last);
            }
        }
        self.pump(ACTIVE);
    }

    fn send(&mut self, from: usize, m: Message) {
        self.ends[1 - from].inbox.push_back(m);
    }

    /// Delivers the next honest frame to side `i`.
    fn deliver(&mut self, i: usize) {
        if let Some(m) = self.ends[i].inbox.pop_front() {
            self.feed(i, m);
        }
    }

    /// Runs every action side `i` queued, checking each.
    fn pump(&mut self, i: usize) {
        while let Some(a) = self.ends[i].s.poll_action() {
            self.act(i, a);
        }
    }

    /// The passive driver's answer to an `Open`.
    fn grant(&mut self, o: Open) {
        let b = self.input.u8();
        if b & 7 == 0 {
            let reason = AbortReason::from_code(2 + b / 8 % 7);
            self.ends[PASSIVE]
                .s
                .bound(&o, Err((reason, "refused".into())));
            return;
        }
        let t = self.handle(o.parts <= 1 || b & 8 != 0);
        let dest = o.kind == OperationKind::Write;
        let g = Grant::new(t.id(), o.sizes.expand(), dest, (o.part, o.parts), t.clone());
        let e = &mut self.ends[PASSIVE];
        e.grants.insert(o.req, g);
        e.s.bound(&o, Ok(t.clone()));
        if b & 7 == 1 {
            // The operation ended meanwhile: whoever ended it tells the peer.
            t.0.open.set(false);
            self.pump(PASSIVE);
            self.forget(PASSIVE, o.req, AbortReason::OperationEnded);
            // No lease went out: the memory comes back at once.
            self.ends[PASSIVE].s.unlend(o.req);
            self.pump(PASSIVE);
        } else {
            // As the driver does: what `bound` queued (a `Lend`, which may
            // fail) runs before the request is served.
            self.pump(PASSIVE);
            self.ends[PASSIVE].s.serve(o.req);
        }
    }

    /// The request `req` ended here: out of the table, the peer told.
    fn forget(&mut self, i: usize, req: u64, reason: AbortReason) {
        if self.ends[i].s.forget(req) {
            let id = self.ends[i].grants[&req].id;
            self.ended_here(i, id);
            let detail = String::new();
            let m = Message::Abort(Abort {
                req,
                reason,
                detail,
            });
            self.send(i, m);
        }
        self.pump(i);
    }

    /// The request of handle `id` ended: once.
    fn ended_here(&mut self, i: usize, id: u32) {
        assert!(self.ended.insert(id), "handle {id} ended twice");
        self.ends[i].grants.retain(|_, g| g.id != id);
    }

    /// Moves one job of side `i` one step.
    fn advance(&mut self, i: usize) {
        let n = self.ends[i].jobs.len();
        if n == 0 {
            return;
        }
        let k = usize::from(self.input.u8()) % n;
        let ok = self.input.u8() != 0;
        self.advance_job(i, k, ok);
    }

    /// One step of job `k` of side `i` (`ok`: a copy succeeds); whether
    /// it moved.
    fn advance_job(&mut self, i: usize, k: usize, ok: bool) -> bool {
        let job = self.ends[i].jobs.swap_remove(k);
        match job {
            Job::Stream {
                req,
                target,
                mut cursor,
                last,
                chunk,
                next,
                grant,
            } => {
                if !target.is_open() {
                    // Whoever closed it tells the peer.
                    return true;
                }
                if let Some((desc, offset, len)) = cursor.next_chunk(chunk) {
                    let next = grant.check_chunk(desc, offset, len, next, "a stream");
                    cursor
                        .accept(desc, offset, len)
                        .expect("the stream's own chunk");
                    let d = Data {
                        req,
                        desc,
                        offset,
                        len,
                    };
                    self.send(i, Message::Data(d));
                    self.ends[i].jobs.push(Job::Stream {
                        req,
                        target,
                        cursor,
                        last,
                        chunk,
                        next,
                        grant,
                    });
                    return true;
                }
                assert_eq!(next, grant.end, "the stream ends short of its part");
                match last {
                    Last::Seal => target.0.sealed.set(true),
                    Last::Part => {}
                    Last::SealAfterParts if target.can_commit() => target.0.sealed.set(true),
                    Last::SealAfterParts => {
                        self.ends[i].jobs.push(Job::Stream {
                            req,
                            target,
                            cursor,
                            last,
                            chunk,
                            next,
                            grant,
                        });
                        return false;
                    }
                }
                self.send(i, Message::Finish { req });
                if last == Last::Part {
                    let e = &mut self.ends[i];
                    e.s.part_sent(req);
                    if let Some(g) = e.grants.get_mut(&req).filter(|g| g.id == target.id()) {
                        g.sent = true;
                    }
                }
                self.pump(i);
                true
            }
            Job::Pull { req, target } => {
                let done = ok && target.is_open();
                if done {
                    target.0.sealed.set(true);
                }
                let m = self.ends[i].s.pull_ended(req, done);
                assert_eq!(m.is_some(), done);
                if let Some(m) = m {
                    assert_eq!(m, Message::Finish { req });
                    self.send(i, m);
                } else if target.is_open() {
                    // The copy failed: the operation ends here.
                    target.0.open.set(false);
                    self.forget(i, req, AbortReason::OperationEnded);
                }
                self.pump(i);
                true
            }
        }
    }

    /// Delivers every honest frame and runs every job until nothing moves.
    fn settle(&mut self) {
        for _ in 0..2_000 {
            let mut moved = false;
            for i in [ACTIVE, PASSIVE] {
                if let Some(m) = self.ends[i].inbox.pop_front() {
                    self.feed(i, m);
                    moved = true;
                }
                let mut k = 0;
                while k < self.ends[i].jobs.len() {
                    let before = self.ends[i].jobs.len();
                    moved |= self.advance_job(i, k, true);
                    // A job that stays is pushed to the end.
                    if self.ends[i].jobs.len() >= before {
                        k += 1;
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// A local event: a cancel, a region closing, a stripe's other parts
    /// done.
    fn local(&mut self) {
        let i = usize::from(self.input.bit());
        let what = self.input.u8();
        let live: Vec<(u64, T)> = self.ends[i]
            .grants
            .iter()
            .map(|(r, g)| (*r, g.target.clone()))
            .collect();
        if live.is_empty() {
            return;
        }
        let (req, t) = live[usize::from(self.input.u8()) % live.len()].clone();
        match what % 3 {
            // The owner cancels: no effect once sealed.
            0 if !t.is_sealed() => {
                t.0.open.set(false);
                self.forget(i, req, AbortReason::Cancelled);
            }
            // A cancel has begun to close the region.
            1 if !t.is_sealed() => t.0.open.set(false),
            2 => t.0.commit.set(true),
            _ => {}
        }
    }

    /// A frame built from the script, as the wire can carry it.
    fn hostile(&mut self, i: usize) {
        let inp = &mut self.input;
        // Mostly frames that may be right where they land.
        let m = match inp.u8() % 16 {
            0 => Message::Hello(Hello {
                version: PROTOCOL_VERSION,
                worker_id: "x".into(),
            }),
            1 => Message::Auth(Auth {
                handshake: vec![inp.u8(); 32],
            }),
            2 => Message::LaneOffer(LaneOffer {
                lane: LANES[usize::from(inp.u8() % 3)],
                // Mostly rounds that may be right where they land.
                round: inp.u8() % 5,
                bytes: vec![inp.u8(); usize::from(inp.u8() % 8)],
            }),
            3 | 4 => {
                let parts = 1 + u16::from(inp.u8() % 4);
                Message::Open(Open {
                    req: inp.req(),
                    op_id: u64::from(inp.u8()),
                    token: Token::from_bytes([inp.u8(); 16]),
                    kind: if inp.bit() {
                        OperationKind::Read
                    } else {
                        OperationKind::Write
                    },
                    sizes: inp.sizes().into(),
                    pull: parts == 1 && inp.bit(),
                    part: u16::from(inp.u8()) % parts,
                    parts,
                })
            }
            5..=8 => {
                let req = inp.req();
                let aim = inp.u8();
                let len = match inp.u8() {
                    0 => 0,
                    255 => MAX_CHUNK,
                    254 => u32::MAX,
                    b => u32::from(b % 12),
                };
                let (desc, offset) = match self.ends[i].grants.get(&req) {
                    // Near where the next byte must land.
                    Some(g) if aim & 1 == 0 => {
                        let at = (g.next + u128::from(aim >> 1 & 3)).saturating_sub(1);
                        g.locate(at)
                    }
                    _ => (u32::from(aim % 4), u64::from(self.input.u8() % 30)),
                };
                Message::Data(Data {
                    req,
                    desc,
                    offset,
                    len,
                })
            }
            9 | 10 => Message::Finish { req: inp.req() },
            11 | 12 => Message::Abort(Abort {
                req: inp.req(),
                reason: AbortReason::from_code(inp.u8() % 14),
                detail: String::new(),
            }),
            13 => {
                let req = inp.req();
                let right = inp.bit();
                let sizes = match self.ends[i].grants.get(&req) {
                    Some(g) if right => g.sizes.clone(),
                    _ => self.input.sizes(),
                };
                Message::Lease(Lease {
                    lane: ferry_proto::lane::LaneId::CMA,
                    req,
                    segments: lease_of(&sizes).into(),
                    key: vec![],
                })
            }
            _ => Message::Release { req: inp.req() },
        };
        let bytes = m.to_vec();
        if let Ok(Some((back, used))) = wire::decode_frame(&bytes) {
            assert_eq!(used, bytes.len());
            self.feed(i, back);
        }
    }

    /// Frames decoded from raw script bytes, fed to one side.
    fn raw(&mut self) {
        let i = usize::from(self.input.bit());
        let n = usize::from(self.input.u8() % 64);
        let mut rest = self.input.bytes(n);
        while let Ok(Some((m, used))) = wire::decode_frame(rest) {
            let payload = match &m {
                Message::Data(d) => d.len as usize,
                _ => 0,
            };
            self.feed(i, m);
            match rest.get(used + payload..) {
                Some(r) => rest = r,
                None => break,
            }
        }
    }
}

/// A lease of descriptors of these sizes, at made-up addresses.
fn lease_of(sizes: &[u64]) -> Vec<(u64, u64)> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| (0x1000_0000 * (i as u64 + 1), s))
        .collect()
}
