//! Session-level tests (see also `tests/session_pair.rs`): every
//! [`Violation`], provoked by the exact frames that break its rule
//! (`violations`), and the answers to frames that look odd but break
//! nothing (`answers`). This file holds what both share: a fence whose
//! answers the test sets, frames, sessions, and ways to read their actions.

use std::cell::Cell;
use std::rc::Rc;

use super::*;
use crate::lane::LaneId;
use crate::wire::{Data, Hello, LaneOffer, Lease, PROTOCOL_VERSION};
use crate::Token;

mod answers;
mod device;
mod digest;
mod lanes;
mod rdma;
mod rules;
mod settled;
mod violations;

// ---------------------------------------------------------------------------
// A fence whose answers the test sets.

#[derive(Debug)]
struct Flags {
    sealed: Cell<bool>,
    open: Cell<bool>,
    commit: Cell<bool>,
    host: Cell<bool>,
    device: Cell<bool>,
}

/// The handle of one operation: shared flags, compared by identity.
#[derive(Clone, Debug)]
struct F(Rc<Flags>);

impl F {
    fn new() -> F {
        F(Rc::new(Flags {
            sealed: Cell::new(false),
            open: Cell::new(true),
            commit: Cell::new(true),
            host: Cell::new(true),
            device: Cell::new(false),
        }))
    }
    fn seal(&self) {
        self.0.sealed.set(true);
    }
    fn close(&self) {
        self.0.open.set(false);
    }
    fn set_commit(&self, can: bool) {
        self.0.commit.set(can);
    }
    /// Its memory is device (GPU) memory that this side cannot stage
    /// (does not move in band).
    fn on_device(&self) {
        self.0.host.set(false);
        self.0.device.set(true);
    }
    /// Its memory is device memory that this side stages through host
    /// memory (moves in band).
    fn on_staged_device(&self) {
        self.0.device.set(true);
    }
    fn is(&self, other: &F) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
}

impl Fence for F {
    fn is_sealed(&self) -> bool {
        self.0.sealed.get()
    }
    fn is_open(&self) -> bool {
        self.0.open.get()
    }
    fn can_commit(&self) -> bool {
        self.0.commit.get()
    }
    fn moves_in_band(&self) -> bool {
        self.0.host.get()
    }
    fn is_device(&self) -> bool {
        self.0.device.get()
    }
}

// ---------------------------------------------------------------------------
// Frames and sessions.

const NO_CAPS: Caps = Caps {
    attach: false,
    can_pull: false,
    peer_pulls: false,
    secret: false,
    device: false,
};
/// Attach set up both ways, both sides offering CUDA IPC.
const ATTACH: Caps = Caps {
    attach: true,
    can_pull: true,
    peer_pulls: true,
    secret: false,
    device: true,
};

/// The lanes a test session sets up by offers.
const LANES: [LaneId; 2] = [LaneId(1), LaneId(2)];

fn passive(caps: Caps) -> Session<F> {
    let mut s = Session::new(Role::Passive, caps);
    s.set_lanes(&LANES);
    s.agree_lanes(agreed(caps.device));
    s
}

fn active(caps: Caps) -> Session<F> {
    let mut s = Session::new(Role::Active, caps);
    s.agree_lanes(agreed(caps.device));
    s
}

/// The lanes a test session shares with its peer: a host lane (as
/// cross-memory attach declares itself) and a device lane riding on its
/// proof (as CUDA IPC does), device memory only where `device`.
fn agreed(device: bool) -> crate::lane::LaneSet {
    use crate::lane::{FailureScope, LaneCaps, LaneSet, MemKinds, Proven, Reach};
    let host = LaneCaps {
        id: LaneId::CMA,
        lends: MemKinds::HOST,
        pulls_into: MemKinds::HOST,
        reach: Reach::Host,
        within_process: true,
        failure: FailureScope::Connection,
        proven_by: LaneId::CMA,
    };
    let gpu = LaneCaps {
        id: LaneId::CUDA_IPC,
        lends: MemKinds::DEVICE,
        pulls_into: MemKinds::BOTH,
        within_process: false,
        failure: FailureScope::Request,
        ..host
    };
    let proven = Proven {
        proved_by: Some(LaneId::CMA),
        device,
        same_process: false,
    };
    LaneSet::agreed(&[host, gpu], &proven)
}

fn open(req: u64, kind: OperationKind, sizes: &[u64]) -> Open {
    Open {
        req,
        op_id: 7,
        token: Token::from_bytes([3; 16]),
        kind,
        sizes: sizes.into(),
        pull: false,
        part: 0,
        parts: 1,
    }
}

fn pulled(o: Open) -> Open {
    Open { pull: true, ..o }
}

fn part(o: Open, part: u16, parts: u16) -> Open {
    Open { part, parts, ..o }
}

fn params(kind: OperationKind, sizes: &[u64], pull: bool, part: (u16, u16)) -> OpenParams {
    OpenParams {
        kind,
        op_id: 7,
        token: Token::from_bytes([3; 16]),
        sizes: sizes.to_vec(),
        pull,
        lane: pull.then_some(LaneId::CMA),
        part,
    }
}

fn data(req: u64, desc: u32, offset: u64, len: u32) -> Message {
    Message::Data(Data {
        req,
        desc,
        offset,
        len,
    })
}

fn finish(req: u64) -> Message {
    Message::Finish { req }
}

fn abort(req: u64, reason: AbortReason) -> Message {
    Message::Abort(Abort {
        req,
        reason,
        detail: format!("{reason:?} from the peer"),
    })
}

/// A lease of descriptors of these lengths, at made-up addresses.
fn lease(req: u64, lens: &[u64]) -> Message {
    Message::Lease(Lease {
        lane: crate::lane::LaneId::CMA,
        req,
        segments: segments(lens).into(),
        key: Vec::new(),
    })
}

fn segments(lens: &[u64]) -> Vec<(u64, u64)> {
    lens.iter()
        .enumerate()
        .map(|(i, &l)| (0x1000 * (i as u64 + 1), l))
        .collect()
}

fn hello() -> Message {
    Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "w".into(),
    })
}

/// Lane `lane`'s offer of `round` (bytes only the lane reads).
fn offer(lane: LaneId, round: u8) -> Message {
    Message::LaneOffer(LaneOffer {
        lane,
        round,
        bytes: vec![9; 4],
    })
}

/// Every queued action, in order.
fn take(s: &mut Session<F>) -> Vec<Action<F>> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

/// Every queued action, in words.
fn acts(s: &mut Session<F>) -> Vec<String> {
    take(s).iter().map(show).collect()
}

fn show(a: &Action<F>) -> String {
    match a {
        Action::Send { msg, reply } => {
            format!(
                "Send {}{}",
                frame(msg),
                if *reply { " (reply)" } else { "" }
            )
        }
        Action::Stream {
            req, cursor, last, ..
        } => format!("Stream {req} {last:?} {:?}", cursor.next_chunk(u32::MAX)),
        Action::Via { lent, .. } => format!("Via {}", if *lent { "lent" } else { "in band" }),
        Action::Lend { .. } => "Lend".into(),
        Action::SendLease { req, .. } => format!("SendLease {req}"),
        Action::GiveBack { .. } => "GiveBack".into(),
        Action::Pull { req, segments, .. } => format!("Pull {req} {segments:?}"),
        Action::PartDone { .. } => "PartDone".into(),
        Action::Commit { req, lent, .. } => {
            format!("Commit {req}{}", if *lent { " lent" } else { "" })
        }
        Action::Complete { .. } => "Complete".into(),
        Action::RemoteAbort { reason, detail, .. } => format!("RemoteAbort {reason:?}: {detail}"),
    }
}

fn frame(m: &Message) -> String {
    match m {
        Message::Finish { req } => format!("Finish {req}"),
        Message::Release { req } => format!("Release {req}"),
        Message::Abort(a) => format!("Abort {} {:?}: {}", a.req, a.reason, a.detail),
        other => format!("{other:?}"),
    }
}

/// The handle an action carries.
fn target(a: &Action<F>) -> Option<&F> {
    match a {
        Action::Send { .. } => None,
        Action::Stream { target, .. }
        | Action::Via { target, .. }
        | Action::Lend { target, .. }
        | Action::SendLease { target, .. }
        | Action::GiveBack { target }
        | Action::Pull { target, .. }
        | Action::PartDone { target }
        | Action::Commit { target, .. }
        | Action::Complete { target }
        | Action::RemoteAbort { target, .. } => Some(target),
    }
}

/// Every queued action names `f` (or none).
fn all_about(s: &mut Session<F>, f: &F) -> Vec<String> {
    let all = take(s);
    for a in &all {
        if let Some(t) = target(a) {
            assert!(t.is(f), "{} names another operation", show(a));
        }
    }
    all.iter().map(show).collect()
}

/// Serves `o` at the passive session `s` as the driver does: the `Open`,
/// the grant to a new operation, `serve`. Returns the operation's handle;
/// the actions stay queued.
fn bind(s: &mut Session<F>, o: &Open) -> F {
    let step = s.handle_frame(Message::Open(o.clone())).unwrap();
    assert!(matches!(&step, Step::CheckGrant(x) if x == o), "{step:?}");
    let f = F::new();
    s.bound(o, Ok(f.clone()));
    s.serve(o.req);
    f
}

/// Feeds `msg` and expects `Payload` naming `f` at the frame's place.
fn lands(s: &mut Session<F>, msg: Message, f: &F) {
    let Message::Data(d) = msg else {
        panic!("not data: {msg:?}")
    };
    match s.handle_frame(msg) {
        Ok(Step::Payload {
            target,
            desc,
            offset,
            len,
        }) => {
            assert!(target.is(f));
            assert_eq!((desc, offset, len), (d.desc, d.offset, d.len));
        }
        other => panic!("expected the payload to land, got {other:?}"),
    }
}

fn done(r: Result<Step<F>, Violation>) {
    assert!(matches!(r, Ok(Step::Done)), "{r:?}");
}
