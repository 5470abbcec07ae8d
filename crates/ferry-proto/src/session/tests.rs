//! Session-level tests (see also `tests/session_pair.rs`): every
//! [`Violation`], provoked by the exact frames that break its rule, and the
//! answers to frames that look odd but break nothing.

use std::cell::Cell;
use std::rc::Rc;

use super::*;
use crate::cursor::CursorError;
use crate::wire::{Auth, Data, Hello, PROTOCOL_VERSION};
use crate::Token;

// ---------------------------------------------------------------------------
// A fence whose answers the test sets.

#[derive(Debug)]
struct Flags {
    sealed: Cell<bool>,
    open: Cell<bool>,
    commit: Cell<bool>,
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
}

// ---------------------------------------------------------------------------
// Frames and sessions.

const NO_CAPS: Caps = Caps {
    attach: false,
    can_pull: false,
    peer_pulls: false,
    secret: false,
};
/// Attach set up both ways.
const ATTACH: Caps = Caps {
    attach: true,
    can_pull: true,
    peer_pulls: true,
    secret: false,
};

fn passive(caps: Caps) -> Session<F> {
    Session::new(Role::Passive, caps)
}

fn active(caps: Caps) -> Session<F> {
    Session::new(Role::Active, caps)
}

fn open(req: u64, kind: OperationKind, sizes: &[u64]) -> Open {
    Open {
        req,
        op_id: 7,
        token: Token::from_bytes([3; 16]),
        kind,
        sizes: sizes.to_vec(),
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
        req,
        segments: segments(lens),
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

fn attach(verdict: Verdict) -> Message {
    Message::Attach(Attach {
        pid: 42,
        addr: 0x5000,
        cookie: [9; 16],
        verdict,
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
        | Action::Lend { target }
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

// ---------------------------------------------------------------------------
// Every violation, each provoked by the frames that break its rule. Each
// provoker checks what it provoked and returns the violation.

fn unexpected_hello() -> Violation {
    let mut last = None;
    for role in [Role::Active, Role::Passive] {
        let mut s = Session::new(role, NO_CAPS);
        let v = s.handle_frame(hello()).unwrap_err();
        assert_eq!(v, Violation::UnexpectedHello);
        // Not told: the connection just closes.
        assert!(acts(&mut s).is_empty());
        last = Some(v);
    }
    last.unwrap()
}

/// An `Auth` after the handshake: the peer is told (an `Abort` of request
/// 0, `Unauthenticated`) before the `Err`.
fn auth_case(secret: bool) -> Violation {
    let mut last = None;
    for role in [Role::Active, Role::Passive] {
        let mut s = Session::new(role, Caps { secret, ..NO_CAPS });
        let v = s
            .handle_frame(Message::Auth(Auth {
                handshake: vec![1; 48],
            }))
            .unwrap_err();
        let all = take(&mut s);
        assert_eq!(
            all.len(),
            1,
            "{:?}",
            all.iter().map(show).collect::<Vec<_>>()
        );
        match &all[0] {
            Action::Send {
                msg: Message::Abort(a),
                reply: true,
            } => {
                assert_eq!(a.req, 0);
                assert_eq!(a.reason, AbortReason::Unauthenticated);
                assert_eq!(a.detail, v.to_string());
            }
            other => panic!("expected the Abort to the peer, got {}", show(other)),
        }
        assert!(v.is_told());
        last = Some(v);
    }
    last.unwrap()
}

fn unexpected_auth() -> Violation {
    let v = auth_case(true);
    assert_eq!(v, Violation::UnexpectedAuth);
    v
}

fn auth_without_secret() -> Violation {
    let v = auth_case(false);
    assert_eq!(v, Violation::AuthWithoutSecret);
    v
}

fn attach_to_active_side() -> Violation {
    let mut s = active(ATTACH);
    for verdict in [Verdict::Unknown, Verdict::CanPull, Verdict::Refused] {
        assert_eq!(
            s.handle_frame(attach(verdict)).unwrap_err(),
            Violation::AttachToActiveSide
        );
    }
    assert!(acts(&mut s).is_empty());
    Violation::AttachToActiveSide
}

fn attach_out_of_turn() -> Violation {
    // A verdict before any nonce.
    let mut s = passive(NO_CAPS);
    let v = s.handle_frame(attach(Verdict::CanPull)).unwrap_err();
    assert_eq!(v, Violation::AttachOutOfTurn);
    assert!(acts(&mut s).is_empty());
    v
}

fn open_to_active_side() -> Violation {
    let mut s = active(NO_CAPS);
    let (req, _) = s.open(params(OperationKind::Read, &[8], false, (0, 1)), F::new());
    take(&mut s);
    let v = s
        .handle_frame(Message::Open(open(req + 1, OperationKind::Write, &[8])))
        .unwrap_err();
    assert_eq!(v, Violation::OpenToActiveSide);
    v
}

fn request_number_in_use() -> Violation {
    let mut s = passive(NO_CAPS);
    let o = open(5, OperationKind::Write, &[8]);
    bind(&mut s, &o);
    take(&mut s);
    // Another operation, the same request number.
    let again = Open {
        op_id: 8,
        ..open(5, OperationKind::Read, &[4])
    };
    let v = s.handle_frame(Message::Open(again)).unwrap_err();
    assert_eq!(v, Violation::RequestNumberInUse(5));
    assert!(acts(&mut s).is_empty());
    v
}

fn unexpected_data() -> Violation {
    // Data into a READ that this side serves.
    let mut s = passive(NO_CAPS);
    bind(&mut s, &open(3, OperationKind::Read, &[8]));
    take(&mut s);
    let v = s.handle_frame(data(3, 0, 0, 8)).unwrap_err();
    assert_eq!(v, Violation::UnexpectedData { req: 3 });
    v
}

fn data_out_of_order() -> Violation {
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &open(1, OperationKind::Write, &[8]));
    lands(&mut s, data(1, 0, 0, 4), &f);
    // A gap of one byte.
    let v = s.handle_frame(data(1, 0, 5, 3)).unwrap_err();
    match &v {
        Violation::DataOutOfOrder(CursorError {
            desc, offset, len, ..
        }) => assert_eq!((*desc, *offset, *len), (0, 5, 3)),
        other => panic!("{other:?}"),
    }
    v
}

fn finish_before_all_data() -> Violation {
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &open(1, OperationKind::Write, &[8]));
    lands(&mut s, data(1, 0, 0, 4), &f);
    let v = s.handle_frame(finish(1)).unwrap_err();
    assert_eq!(v, Violation::FinishBeforeAllData { req: 1 });
    v
}

fn part_finished_early() -> Violation {
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &part(open(1, OperationKind::Write, &[10]), 1, 2));
    // Part 1 of 2 is [5, 10): three of its five bytes.
    lands(&mut s, data(1, 0, 5, 3), &f);
    let v = s.handle_frame(finish(1)).unwrap_err();
    assert_eq!(v, Violation::PartFinishedEarly { part: 1 });
    v
}

fn part_confirmed_before_sent() -> Violation {
    let mut s = active(NO_CAPS);
    let (req, start) = s.open(params(OperationKind::Write, &[12], false, (2, 3)), F::new());
    assert!(matches!(
        start,
        Start::Stream {
            last: Last::Part,
            ..
        }
    ));
    take(&mut s);
    // Confirmed while the driver still streams it (no `part_sent`).
    let v = s.handle_frame(finish(req)).unwrap_err();
    assert_eq!(v, Violation::PartConfirmedBeforeSent { part: 2 });
    v
}

fn finish_before_copy_ended() -> Violation {
    // A pulled WRITE at the passive side: the lease came, the copy runs,
    // and the writer claims it ended.
    let mut s = passive(ATTACH);
    let f = bind(&mut s, &pulled(open(1, OperationKind::Write, &[4, 8])));
    done(s.handle_frame(lease(1, &[4, 8])));
    assert_eq!(
        all_about(&mut s, &f),
        ["Via lent", &format!("Pull 1 {:?}", segments(&[4, 8]))]
    );
    let v = s.handle_frame(finish(1)).unwrap_err();
    assert_eq!(v, Violation::FinishBeforeCopyEnded { req: 1 });
    v
}

fn finish_before_lease() -> Violation {
    let mut s = passive(ATTACH);
    bind(&mut s, &pulled(open(1, OperationKind::Write, &[4])));
    take(&mut s);
    let v = s.handle_frame(finish(1)).unwrap_err();
    assert_eq!(v, Violation::FinishBeforeLease { req: 1 });
    v
}

fn lease_without_attach() -> Violation {
    // No attach at all, and attach without the proof that this side can
    // copy from the peer.
    for caps in [
        NO_CAPS,
        Caps {
            can_pull: false,
            ..ATTACH
        },
    ] {
        let mut s = passive(caps);
        bind(&mut s, &pulled(open(1, OperationKind::Write, &[4])));
        take(&mut s);
        assert_eq!(
            s.handle_frame(lease(1, &[4])).unwrap_err(),
            Violation::LeaseWithoutAttach
        );
    }
    Violation::LeaseWithoutAttach
}

fn unasked_lease() -> Violation {
    // A lease for a request this side never opened.
    let mut s = active(ATTACH);
    s.open(params(OperationKind::Read, &[4], true, (0, 1)), F::new());
    take(&mut s);
    let v = s.handle_frame(lease(9, &[4])).unwrap_err();
    assert_eq!(v, Violation::UnaskedLease { req: 9 });
    assert!(acts(&mut s).is_empty());
    v
}

fn lease_shape_mismatch() -> Violation {
    let mut last = None;
    for lens in [&[4u64][..], &[4, 9], &[8, 4], &[4, 8, 1]] {
        let mut s = passive(ATTACH);
        bind(&mut s, &pulled(open(1, OperationKind::Write, &[4, 8])));
        take(&mut s);
        let v = s.handle_frame(lease(1, lens)).unwrap_err();
        assert_eq!(v, Violation::LeaseShapeMismatch { req: 1 }, "{lens:?}");
        // No copy was asked for.
        assert!(acts(&mut s).is_empty());
        last = Some(v);
    }
    last.unwrap()
}

/// The variant's position, by an exhaustive match (no wildcard): a new
/// variant does not compile until it is counted here and provoked below.
fn variant(v: &Violation) -> usize {
    match v {
        Violation::UnexpectedHello => 0,
        Violation::UnexpectedAuth => 1,
        Violation::AuthWithoutSecret => 2,
        Violation::AttachToActiveSide => 3,
        Violation::AttachOutOfTurn => 4,
        Violation::OpenToActiveSide => 5,
        Violation::RequestNumberInUse(_) => 6,
        Violation::UnexpectedData { .. } => 7,
        Violation::DataOutOfOrder(_) => 8,
        Violation::FinishBeforeAllData { .. } => 9,
        Violation::PartFinishedEarly { .. } => 10,
        Violation::PartConfirmedBeforeSent { .. } => 11,
        Violation::FinishBeforeCopyEnded { .. } => 12,
        Violation::FinishBeforeLease { .. } => 13,
        Violation::LeaseWithoutAttach => 14,
        Violation::UnaskedLease { .. } => 15,
        Violation::LeaseShapeMismatch { .. } => 16,
    }
}
const VARIANTS: usize = 17;

type Provoker = fn() -> Violation;

const PROVOKERS: [(&str, Provoker); VARIANTS] = [
    ("unexpected_hello", unexpected_hello),
    ("unexpected_auth", unexpected_auth),
    ("auth_without_secret", auth_without_secret),
    ("attach_to_active_side", attach_to_active_side),
    ("attach_out_of_turn", attach_out_of_turn),
    ("open_to_active_side", open_to_active_side),
    ("request_number_in_use", request_number_in_use),
    ("unexpected_data", unexpected_data),
    ("data_out_of_order", data_out_of_order),
    ("finish_before_all_data", finish_before_all_data),
    ("part_finished_early", part_finished_early),
    ("part_confirmed_before_sent", part_confirmed_before_sent),
    ("finish_before_copy_ended", finish_before_copy_ended),
    ("finish_before_lease", finish_before_lease),
    ("lease_without_attach", lease_without_attach),
    ("unasked_lease", unasked_lease),
    ("lease_shape_mismatch", lease_shape_mismatch),
];

/// The documented mapping: only the authentication violations are told
/// (`Unauthenticated`); every other one is `Protocol`, and not told.
fn check_reason(v: &Violation) {
    let auth = matches!(v, Violation::UnexpectedAuth | Violation::AuthWithoutSecret);
    if auth {
        assert_eq!(v.abort_reason(), AbortReason::Unauthenticated, "{v:?}");
    } else {
        assert_eq!(v.abort_reason(), AbortReason::Protocol, "{v:?}");
    }
    assert_eq!(v.is_told(), auth, "{v:?}");
    assert!(!v.to_string().is_empty());
}

/// One test per violation (named after it), each running its provoker.
macro_rules! violation_tests {
    ($($name:ident),* $(,)?) => {
        mod violation {
            $(
                #[test]
                fn $name() {
                    let v = super::$name();
                    super::check_reason(&v);
                }
            )*
        }
    };
}

violation_tests!(
    unexpected_hello,
    unexpected_auth,
    auth_without_secret,
    attach_to_active_side,
    attach_out_of_turn,
    open_to_active_side,
    request_number_in_use,
    unexpected_data,
    data_out_of_order,
    finish_before_all_data,
    part_finished_early,
    part_confirmed_before_sent,
    finish_before_copy_ended,
    finish_before_lease,
    lease_without_attach,
    unasked_lease,
    lease_shape_mismatch,
);

#[test]
fn every_violation_is_provoked_by_its_own_test() {
    let mut seen = [None; VARIANTS];
    for (name, provoke) in PROVOKERS {
        let v = provoke();
        let i = variant(&v);
        assert!(seen[i].is_none(), "{name} provokes {v:?} as {:?}", seen[i]);
        seen[i] = Some(name);
    }
    assert!(seen.iter().all(Option::is_some), "{seen:?}");
}

// ---------------------------------------------------------------------------
// More frames that break each rule.

#[test]
fn attach_frames_out_of_the_exchange_order() {
    // The nonce twice (the offer is being made).
    let mut s = passive(ATTACH);
    assert!(matches!(
        s.handle_frame(attach(Verdict::Unknown)),
        Ok(Step::AttachOffer { nonce }) if nonce == [9; 16]
    ));
    assert_eq!(
        s.handle_frame(attach(Verdict::Unknown)).unwrap_err(),
        Violation::AttachOutOfTurn
    );
    // The offer sent: a nonce instead of a verdict.
    let mut s = passive(ATTACH);
    s.handle_frame(attach(Verdict::Unknown)).unwrap();
    s.attach_offered(Some(([9; 16], [8; 16])));
    assert_eq!(
        s.handle_frame(attach(Verdict::Unknown)).unwrap_err(),
        Violation::AttachOutOfTurn
    );
    // A fifth frame after the exchange.
    let mut s = passive(ATTACH);
    s.handle_frame(attach(Verdict::Unknown)).unwrap();
    s.attach_offered(None);
    s.handle_frame(attach(Verdict::Refused)).unwrap();
    for v in [Verdict::Unknown, Verdict::CanPull, Verdict::Refused] {
        assert_eq!(
            s.handle_frame(attach(v)).unwrap_err(),
            Violation::AttachOutOfTurn
        );
    }
}

#[test]
fn the_attach_exchange_in_order_sets_the_caps() {
    let nonces = ([9; 16], [8; 16]);
    for (offer, verdict, ok) in [
        (Some(nonces), Verdict::CanPull, true),
        (Some(nonces), Verdict::Refused, false),
        (None, Verdict::CanPull, false),
    ] {
        let mut s = passive(Caps {
            attach: true,
            ..NO_CAPS
        });
        match s.handle_frame(attach(Verdict::Unknown)) {
            Ok(Step::AttachOffer { nonce }) => assert_eq!(nonce, [9; 16]),
            other => panic!("{other:?}"),
        }
        s.attach_offered(offer);
        match s.handle_frame(attach(verdict)) {
            Ok(Step::AttachVerify { nonces, pid, addr }) => {
                assert_eq!((nonces, pid, addr), (offer, 42, 0x5000))
            }
            other => panic!("{other:?}"),
        }
        // The peer may copy from this side only if it read our offer.
        assert_eq!(s.caps().peer_pulls, ok, "{offer:?} {verdict:?}");
        assert!(!s.caps().can_pull);
        for probe in [false, true] {
            let m = s.attach_verified(probe);
            assert!(matches!(
                m,
                Message::Attach(Attach { pid: 0, addr: 0, verdict, .. })
                    if verdict == if probe { Verdict::CanPull } else { Verdict::Refused }
            ));
            assert_eq!(s.caps().can_pull, probe);
        }
        assert!(acts(&mut s).is_empty());
    }
}

#[test]
fn data_into_a_request_that_takes_none() {
    // A READ lent by this side.
    let mut s = passive(ATTACH);
    bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
    assert_eq!(
        s.handle_frame(data(1, 0, 0, 8)).unwrap_err(),
        Violation::UnexpectedData { req: 1 }
    );
    // A pulled WRITE, before and after its lease.
    for leased in [false, true] {
        let mut s = passive(ATTACH);
        bind(&mut s, &pulled(open(1, OperationKind::Write, &[8])));
        if leased {
            done(s.handle_frame(lease(1, &[8])));
        }
        assert_eq!(
            s.handle_frame(data(1, 0, 0, 8)).unwrap_err(),
            Violation::UnexpectedData { req: 1 }
        );
    }
    // A WRITE at the active side, in band and lent.
    for pull in [false, true] {
        let mut s = active(ATTACH);
        let (req, _) = s.open(params(OperationKind::Write, &[8], pull, (0, 1)), F::new());
        assert_eq!(
            s.handle_frame(data(req, 0, 0, 8)).unwrap_err(),
            Violation::UnexpectedData { req }
        );
    }
    // A READ at the active side that is being pulled.
    let mut s = active(ATTACH);
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), F::new());
    done(s.handle_frame(lease(req, &[8])));
    assert_eq!(
        s.handle_frame(data(req, 0, 0, 8)).unwrap_err(),
        Violation::UnexpectedData { req }
    );
}

#[test]
fn data_outside_the_request_is_out_of_order() {
    let cases: [(u32, u64, u32); 7] = [
        (0, 0, 9),        // past the descriptor
        (0, 8, 1),        // at its end
        (0, u64::MAX, 2), // an offset that overflows
        (1, 0, 1),        // the next descriptor, early
        (5, 0, 1),        // a descriptor that does not exist
        (0, 0, 0),        // nothing
        (0, 1, 1),        // a gap
    ];
    for (desc, offset, len) in cases {
        let mut s = passive(NO_CAPS);
        bind(&mut s, &open(1, OperationKind::Write, &[8, 8]));
        assert!(
            matches!(
                s.handle_frame(data(1, desc, offset, len)),
                Err(Violation::DataOutOfOrder(_))
            ),
            "({desc}, {offset}, {len})"
        );
    }
    // An overlap, and bytes of another part.
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &open(1, OperationKind::Write, &[8]));
    lands(&mut s, data(1, 0, 0, 4), &f);
    assert!(matches!(
        s.handle_frame(data(1, 0, 3, 2)),
        Err(Violation::DataOutOfOrder(_))
    ));
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &part(open(1, OperationKind::Write, &[4, 6]), 1, 2));
    // Part 1 of 2 of 10 bytes is [5, 10): descriptor 1 from offset 1.
    for (desc, offset) in [(0, 0), (0, 3), (1, 0), (1, 2)] {
        assert!(matches!(
            s.handle_frame(data(1, desc, offset, 1)),
            Err(Violation::DataOutOfOrder(_))
        ));
    }
    lands(&mut s, data(1, 1, 1, 5), &f);
    // Nothing after the part.
    assert!(matches!(
        s.handle_frame(data(1, 1, 6, 1)),
        Err(Violation::DataOutOfOrder(_))
    ));
}

#[test]
fn finish_before_all_data_in_every_direction() {
    // The active side's READ, before any byte.
    let mut s = active(NO_CAPS);
    let (req, _) = s.open(params(OperationKind::Read, &[8], false, (0, 1)), F::new());
    assert_eq!(
        s.handle_frame(finish(req)).unwrap_err(),
        Violation::FinishBeforeAllData { req }
    );
    // A READ that asked for a lease and got neither lease nor data.
    let mut s = active(ATTACH);
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), F::new());
    assert_eq!(
        s.handle_frame(finish(req)).unwrap_err(),
        Violation::FinishBeforeAllData { req }
    );
    // A confirmation of a READ this side has not finished sending.
    let mut s = passive(NO_CAPS);
    bind(&mut s, &open(1, OperationKind::Read, &[8]));
    assert_eq!(
        s.handle_frame(finish(1)).unwrap_err(),
        Violation::FinishBeforeAllData { req: 1 }
    );
    // The same at the active side's WRITE.
    let mut s = active(NO_CAPS);
    let (req, _) = s.open(params(OperationKind::Write, &[8], false, (0, 1)), F::new());
    assert_eq!(
        s.handle_frame(finish(req)).unwrap_err(),
        Violation::FinishBeforeAllData { req }
    );
    // Part 0 with every byte, before the other parts are done.
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &part(open(1, OperationKind::Write, &[10]), 0, 2));
    f.set_commit(false);
    lands(&mut s, data(1, 0, 0, 5), &f);
    assert_eq!(
        s.handle_frame(finish(1)).unwrap_err(),
        Violation::FinishBeforeAllData { req: 1 }
    );
    // Part 0 of a striped WRITE at the active side: confirmed before it
    // sealed.
    let mut s = active(NO_CAPS);
    let (req, _) = s.open(params(OperationKind::Write, &[10], false, (0, 2)), F::new());
    assert_eq!(
        s.handle_frame(finish(req)).unwrap_err(),
        Violation::FinishBeforeAllData { req }
    );
}

#[test]
fn finish_before_copy_ended_at_the_active_side() {
    let mut s = active(ATTACH);
    let f = F::new();
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), f.clone());
    done(s.handle_frame(lease(req, &[8])));
    assert_eq!(
        all_about(&mut s, &f),
        ["Via lent", &format!("Pull {req} {:?}", segments(&[8]))]
    );
    assert_eq!(
        s.handle_frame(finish(req)).unwrap_err(),
        Violation::FinishBeforeCopyEnded { req }
    );
}

#[test]
fn leases_nobody_asked_for() {
    // Without the proof that this side can copy from the peer.
    let mut s = active(Caps {
        can_pull: false,
        ..ATTACH
    });
    let (req, _) = s.open(params(OperationKind::Read, &[4], true, (0, 1)), F::new());
    assert_eq!(
        s.handle_frame(lease(req, &[4])).unwrap_err(),
        Violation::UnaskedLease { req }
    );
    // For a READ in band, a WRITE, a second lease, a lease after data.
    let mut s = active(ATTACH);
    let (read, _) = s.open(params(OperationKind::Read, &[4], false, (0, 1)), F::new());
    let (write, _) = s.open(params(OperationKind::Write, &[4], true, (0, 1)), F::new());
    let (pulled_read, _) = s.open(params(OperationKind::Read, &[4], true, (0, 1)), F::new());
    let (streamed, _) = s.open(params(OperationKind::Read, &[4], true, (0, 1)), F::new());
    done(s.handle_frame(lease(pulled_read, &[4])));
    assert!(matches!(
        s.handle_frame(data(streamed, 0, 0, 2)),
        Ok(Step::Payload { .. })
    ));
    for req in [read, write, pulled_read, streamed] {
        assert_eq!(
            s.handle_frame(lease(req, &[4])).unwrap_err(),
            Violation::UnaskedLease { req },
        );
    }
    // At the passive side: for a WRITE in band, a striped part, a READ.
    let mut s = passive(ATTACH);
    bind(&mut s, &open(1, OperationKind::Write, &[4]));
    bind(&mut s, &part(open(2, OperationKind::Write, &[4]), 1, 2));
    bind(&mut s, &pulled(open(3, OperationKind::Read, &[4])));
    bind(&mut s, &pulled(open(4, OperationKind::Write, &[4])));
    done(s.handle_frame(lease(4, &[4])));
    for req in [1, 2, 3, 4] {
        assert_eq!(
            s.handle_frame(lease(req, &[4])).unwrap_err(),
            Violation::UnaskedLease { req },
        );
    }
}

#[test]
fn a_confirmed_part_keeps_its_request_number() {
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &part(open(1, OperationKind::Write, &[10]), 1, 2));
    lands(&mut s, data(1, 0, 5, 5), &f);
    done(s.handle_frame(finish(1)));
    assert_eq!(
        all_about(&mut s, &f),
        ["Via in band", "PartDone", "Send Finish 1 (reply)"]
    );
    assert_eq!(s.pending(), 1);
    assert_eq!(
        s.handle_frame(Message::Open(open(1, OperationKind::Write, &[10])))
            .unwrap_err(),
        Violation::RequestNumberInUse(1)
    );
}

// ---------------------------------------------------------------------------
// Frames that break no rule.

#[test]
fn data_for_an_unknown_request_is_discarded() {
    for mut s in [passive(ATTACH), active(ATTACH)] {
        assert!(matches!(
            s.handle_frame(data(3, 0, 0, 100)),
            Ok(Step::Discard { len: 100 })
        ));
        assert!(acts(&mut s).is_empty());
    }
    // Also for a request that ended here: its payload is already on the
    // wire.
    let mut s = active(NO_CAPS);
    let (req, _) = s.open(params(OperationKind::Read, &[8], false, (0, 1)), F::new());
    assert!(s.forget(req));
    take(&mut s);
    assert!(matches!(
        s.handle_frame(data(req, 0, 0, 8)),
        Ok(Step::Discard { len: 8 })
    ));
    done(s.handle_frame(finish(req)));
    assert!(acts(&mut s).is_empty());
}

#[test]
fn a_lease_for_a_request_that_ended_is_released() {
    // The active side cancelled a pulled READ.
    let mut s = active(ATTACH);
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), F::new());
    assert!(s.forget(req));
    take(&mut s);
    done(s.handle_frame(lease(req, &[8])));
    assert_eq!(acts(&mut s), [format!("Send Release {req} (reply)")]);
    // The passive side ended a pulled WRITE, or refused it.
    let mut s = passive(ATTACH);
    bind(&mut s, &pulled(open(1, OperationKind::Write, &[8])));
    assert!(s.forget(1));
    take(&mut s);
    done(s.handle_frame(lease(1, &[8])));
    assert_eq!(acts(&mut s), ["Send Release 1 (reply)"]);
    let o = pulled(open(2, OperationKind::Write, &[8]));
    assert!(matches!(
        s.handle_frame(Message::Open(o.clone())),
        Ok(Step::CheckGrant(_))
    ));
    s.bound(&o, Err((AbortReason::UnknownOperation, "no".into())));
    done(s.handle_frame(lease(2, &[8])));
    assert_eq!(
        acts(&mut s),
        [
            "Send Abort 2 UnknownOperation: no (reply)",
            "Send Release 2 (reply)"
        ]
    );
    assert_eq!(s.pending(), 0);
}

#[test]
fn an_abort_while_pulling_ends_the_operation_then_releases_the_lease() {
    // The active side pulls a READ.
    let mut s = active(ATTACH);
    let f = F::new();
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), f.clone());
    done(s.handle_frame(lease(req, &[8])));
    take(&mut s);
    done(s.handle_frame(abort(req, AbortReason::Cancelled)));
    assert_eq!(
        all_about(&mut s, &f),
        [
            "RemoteAbort Cancelled: Cancelled from the peer".to_string(),
            format!("Send Release {req} (reply)")
        ]
    );
    assert_eq!(s.pending(), 0);
    // The passive side pulls a WRITE.
    let mut s = passive(ATTACH);
    let f = bind(&mut s, &pulled(open(4, OperationKind::Write, &[8])));
    done(s.handle_frame(lease(4, &[8])));
    take(&mut s);
    done(s.handle_frame(abort(4, AbortReason::ShuttingDown)));
    assert_eq!(
        all_about(&mut s, &f),
        [
            "RemoteAbort ShuttingDown: ShuttingDown from the peer",
            "Send Release 4 (reply)"
        ]
    );
}

#[test]
fn an_abort_of_lent_memory_gives_it_back_first() {
    let mut s = passive(ATTACH);
    let f = bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "SendLease 1"]);
    done(s.handle_frame(abort(1, AbortReason::Cancelled)));
    assert_eq!(
        all_about(&mut s, &f),
        ["GiveBack", "RemoteAbort Cancelled: Cancelled from the peer"]
    );
    assert_eq!(s.pending(), 0);
}

#[test]
fn a_release_gives_lent_memory_back_once() {
    let mut s = active(ATTACH);
    let f = F::new();
    let (req, start) = s.open(params(OperationKind::Write, &[8], true, (0, 1)), f.clone());
    assert!(matches!(start, Start::OpenAndLease(Message::Open(_))));
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend"]);
    assert_eq!(s.pending(), 2);
    done(s.handle_frame(Message::Release { req }));
    done(s.handle_frame(Message::Release { req }));
    assert_eq!(all_about(&mut s, &f), ["GiveBack"]);
    assert_eq!(s.pending(), 1);
}

/// Memory whose lease was never sent may be given back at once: nobody
/// copies from it.
#[test]
fn a_lease_never_sent_is_given_back_at_once() {
    let mut s = passive(ATTACH);
    let o = pulled(open(1, OperationKind::Read, &[8]));
    assert!(matches!(
        s.handle_frame(Message::Open(o.clone())),
        Ok(Step::CheckGrant(_))
    ));
    let f = F::new();
    s.bound(&o, Ok(f.clone()));
    // The operation ended between the check and `bound`: no `serve`, and
    // the driver gives the memory back (`unlend`) as well as forgetting
    // the request.
    assert!(s.forget(1));
    s.unlend(1);
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "GiveBack"]);
    assert_eq!(s.pending(), 0);
}

/// A request that lent its memory and ends here (`forget`: the owner
/// cancelled or withdrew it; the driver then sends `Abort`) must keep the
/// memory lent until the peer says it stopped copying: its `Release` (the
/// answer to that `Abort`), its `Finish` (the copy had ended), its own
/// `Abort`, or the end of the connection (`drain`). That is what
/// `Action::GiveBack` promises ("the peer no longer copies from the
/// target's memory") and what `Release` exists for; the TCP transport
/// before the session (`TcpLink::cancel`, `ReqLink::withdrawn`) kept the
/// lease in `Conn::leases` until then.
#[test]
fn a_forgotten_lease_stays_lent_until_the_peer_stops_copying() {
    // The passive side's READ, its lease sent; the owner withdraws it.
    for peer_says in [
        Message::Release { req: 1 },
        finish(1),
        abort(1, AbortReason::Cancelled),
    ] {
        let mut s = passive(ATTACH);
        let f = bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
        assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "SendLease 1"]);
        assert!(s.forget(1));
        assert!(
            acts(&mut s).is_empty(),
            "given back while the peer may copy"
        );
        assert_eq!(s.pending(), 1);
        done(s.handle_frame(peer_says));
        assert_eq!(all_about(&mut s, &f), ["GiveBack"]);
        assert_eq!(s.pending(), 0);
    }
    // The active side's pulled WRITE, cancelled after the `Open` and its
    // `Lease` went out.
    let mut s = active(ATTACH);
    let f = F::new();
    let (req, _) = s.open(params(OperationKind::Write, &[8], true, (0, 1)), f.clone());
    take(&mut s);
    assert!(s.forget(req));
    assert!(
        acts(&mut s).is_empty(),
        "given back while the peer may copy"
    );
    assert_eq!(s.pending(), 1);
    done(s.handle_frame(Message::Release { req }));
    assert_eq!(all_about(&mut s, &f), ["GiveBack"]);
    // The end of the connection hands it back too.
    let mut s = active(ATTACH);
    let (req, _) = s.open(params(OperationKind::Write, &[8], true, (0, 1)), f.clone());
    take(&mut s);
    assert!(s.forget(req));
    assert!(acts(&mut s).is_empty());
    let (reqs, lent) = s.drain();
    assert!(reqs.is_empty());
    assert_eq!(lent.len(), 1);
}

#[test]
fn a_part_finished_while_the_region_closes_confirms_nothing() {
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &part(open(1, OperationKind::Write, &[10]), 1, 2));
    lands(&mut s, data(1, 0, 5, 5), &f);
    take(&mut s);
    // A cancel is closing the region: it tells the peer, not this Finish.
    f.close();
    done(s.handle_frame(finish(1)));
    done(s.handle_frame(finish(1)));
    assert!(acts(&mut s).is_empty());
    assert_eq!(s.pending(), 1);
}

#[test]
fn a_parts_repeated_finish_is_ignored() {
    // At the destination: confirmed once.
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &part(open(1, OperationKind::Write, &[10]), 1, 2));
    lands(&mut s, data(1, 0, 5, 5), &f);
    take(&mut s);
    done(s.handle_frame(finish(1)));
    assert_eq!(all_about(&mut s, &f), ["PartDone", "Send Finish 1 (reply)"]);
    done(s.handle_frame(finish(1)));
    assert!(acts(&mut s).is_empty());
    // At the source: counted once.
    let mut s = active(NO_CAPS);
    let f = F::new();
    let (req, _) = s.open(
        params(OperationKind::Write, &[10], false, (1, 2)),
        f.clone(),
    );
    take(&mut s);
    s.part_sent(req);
    done(s.handle_frame(finish(req)));
    assert_eq!(all_about(&mut s, &f), ["PartDone"]);
    done(s.handle_frame(finish(req)));
    assert!(acts(&mut s).is_empty());
    assert_eq!(s.pending(), 1);
}

#[test]
fn an_abort_on_a_stripe_this_side_is_ending_is_swallowed() {
    // Ending here: not open, not sealed. Whoever ends it tells the peer.
    for (role, index) in [(Role::Passive, 0), (Role::Passive, 1), (Role::Active, 0)] {
        let mut s = Session::new(role, NO_CAPS);
        let (req, f) = if role == Role::Passive {
            let f = bind(
                &mut s,
                &part(open(1, OperationKind::Write, &[10]), index, 2),
            );
            (1, f)
        } else {
            let f = F::new();
            let (req, _) = s.open(
                params(OperationKind::Read, &[10], false, (index, 2)),
                f.clone(),
            );
            (req, f)
        };
        take(&mut s);
        f.close();
        done(s.handle_frame(abort(req, AbortReason::PartFailed)));
        assert!(acts(&mut s).is_empty(), "{role:?} part {index}");
        assert_eq!(s.pending(), 0);
    }
    // Open, or sealed (the peer's to settle): the abort ends the operation.
    for sealed in [false, true] {
        let mut s = passive(NO_CAPS);
        let f = bind(&mut s, &part(open(1, OperationKind::Read, &[10]), 0, 2));
        take(&mut s);
        if sealed {
            f.seal();
            f.close();
        }
        done(s.handle_frame(abort(1, AbortReason::PartFailed)));
        assert_eq!(
            all_about(&mut s, &f),
            ["RemoteAbort PartFailed: PartFailed from the peer"]
        );
    }
    // Not striped: never swallowed.
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &open(1, OperationKind::Write, &[10]));
    take(&mut s);
    f.close();
    done(s.handle_frame(abort(1, AbortReason::Cancelled)));
    assert_eq!(
        all_about(&mut s, &f),
        ["RemoteAbort Cancelled: Cancelled from the peer"]
    );
}

#[test]
fn operation_ended_on_a_further_part_at_the_active_side_is_swallowed() {
    let mut s = active(NO_CAPS);
    let f = F::new();
    let (one, _) = s.open(params(OperationKind::Read, &[10], false, (1, 3)), f.clone());
    let (two, _) = s.open(
        params(OperationKind::Write, &[10], false, (2, 3)),
        f.clone(),
    );
    let (zero, _) = s.open(params(OperationKind::Read, &[10], false, (0, 3)), f.clone());
    take(&mut s);
    for req in [one, two] {
        done(s.handle_frame(abort(req, AbortReason::OperationEnded)));
    }
    assert!(acts(&mut s).is_empty());
    assert_eq!(s.pending(), 1);
    // How it ended comes on part 0.
    done(s.handle_frame(abort(zero, AbortReason::OperationEnded)));
    assert_eq!(
        all_about(&mut s, &f),
        ["RemoteAbort OperationEnded: OperationEnded from the peer"]
    );
    // Another reason on a further part, or the passive side: not swallowed.
    let mut s = active(NO_CAPS);
    let (req, _) = s.open(params(OperationKind::Read, &[10], false, (1, 3)), f.clone());
    take(&mut s);
    done(s.handle_frame(abort(req, AbortReason::Cancelled)));
    assert_eq!(
        acts(&mut s),
        ["RemoteAbort Cancelled: Cancelled from the peer"]
    );
    let mut s = passive(NO_CAPS);
    bind(&mut s, &part(open(1, OperationKind::Write, &[10]), 1, 3));
    take(&mut s);
    done(s.handle_frame(abort(1, AbortReason::OperationEnded)));
    assert_eq!(
        acts(&mut s),
        ["RemoteAbort OperationEnded: OperationEnded from the peer"]
    );
}

#[test]
fn a_refused_open_is_answered_and_leaves_its_number_free() {
    let mut s = passive(NO_CAPS);
    let o = open(1, OperationKind::Write, &[8]);
    assert!(matches!(
        s.handle_frame(Message::Open(o.clone())),
        Ok(Step::CheckGrant(_))
    ));
    s.bound(&o, Err((AbortReason::SizeMismatch, "descriptor 0".into())));
    assert_eq!(
        acts(&mut s),
        ["Send Abort 1 SizeMismatch: descriptor 0 (reply)"]
    );
    assert_eq!(s.pending(), 0);
    bind(&mut s, &o);
    assert_eq!(s.pending(), 1);
}

#[test]
fn a_request_number_is_free_again_once_its_request_ended() {
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &open(1, OperationKind::Write, &[4]));
    lands(&mut s, data(1, 0, 0, 4), &f);
    done(s.handle_frame(finish(1)));
    assert_eq!(all_about(&mut s, &f), ["Via in band", "Commit 1"]);
    let g = bind(&mut s, &open(1, OperationKind::Read, &[4]));
    assert_eq!(
        all_about(&mut s, &g),
        ["Via in band", "Stream 1 Seal Some((0, 0, 4))"]
    );
}

#[test]
fn a_passive_read_lends_only_when_the_peer_can_pull() {
    for (caps, lends) in [
        (ATTACH, true),
        (NO_CAPS, false),
        (
            Caps {
                peer_pulls: false,
                ..ATTACH
            },
            false,
        ),
        (
            Caps {
                attach: false,
                ..ATTACH
            },
            false,
        ),
    ] {
        let mut s = passive(caps);
        let f = bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
        let want: &[&str] = if lends {
            &["Via lent", "Lend", "SendLease 1"]
        } else {
            &["Via in band", "Stream 1 Seal Some((0, 0, 8))"]
        };
        assert_eq!(all_about(&mut s, &f), want, "{caps:?}");
        assert_eq!(s.pending(), if lends { 2 } else { 1 });
    }
    // More descriptors than a lease carries: in band.
    let mut s = passive(ATTACH);
    let sizes = vec![1; MAX_LEASE_SEGMENTS + 1];
    let f = bind(&mut s, &pulled(open(1, OperationKind::Read, &sizes)));
    assert_eq!(
        all_about(&mut s, &f),
        ["Via in band", "Stream 1 Seal Some((0, 0, 1))"]
    );
}

#[test]
fn a_requested_lease_answered_with_data_falls_back_to_band() {
    let mut s = active(ATTACH);
    let f = F::new();
    let (req, start) = s.open(
        params(OperationKind::Read, &[4, 4], true, (0, 1)),
        f.clone(),
    );
    match start {
        Start::Open(Message::Open(o)) => assert!(o.pull),
        other => panic!("{other:?}"),
    }
    // Unknown until the answer.
    assert!(acts(&mut s).is_empty());
    lands(&mut s, data(req, 0, 0, 4), &f);
    lands(&mut s, data(req, 1, 0, 4), &f);
    done(s.handle_frame(finish(req)));
    assert_eq!(
        all_about(&mut s, &f),
        ["Via in band".to_string(), format!("Commit {req}")]
    );
}

#[test]
fn a_striped_request_never_pulls() {
    let mut s = active(ATTACH);
    let f = F::new();
    let (_, start) = s.open(params(OperationKind::Write, &[9], true, (1, 3)), f.clone());
    match start {
        Start::Stream {
            open: Message::Open(o),
            cursor,
            last,
        } => {
            assert!(!o.pull);
            assert_eq!((o.part, o.parts), (1, 3));
            assert_eq!(last, Last::Part);
            assert_eq!(cursor.next_chunk(100), Some((0, 3, 3)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(all_about(&mut s, &f), ["Via in band"]);
}

#[test]
fn the_source_streams_each_part_to_its_end() {
    let mut s = passive(NO_CAPS);
    for (req, index, want) in [
        (1, 0, "Stream 1 SealAfterParts Some((0, 0, 3))"),
        (2, 1, "Stream 2 Part Some((0, 3, 3))"),
        (3, 2, "Stream 3 Part Some((0, 6, 4))"),
    ] {
        let f = bind(
            &mut s,
            &part(open(req, OperationKind::Read, &[10]), index, 3),
        );
        assert_eq!(all_about(&mut s, &f), ["Via in band", want]);
    }
    // The destination of a part waits.
    let f = bind(&mut s, &part(open(4, OperationKind::Write, &[10]), 1, 3));
    assert_eq!(all_about(&mut s, &f), ["Via in band"]);
}

#[test]
fn drain_hands_back_every_request_and_lent_memory() {
    let mut s = passive(ATTACH);
    let a = bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
    let b = bind(&mut s, &open(2, OperationKind::Write, &[8]));
    assert_eq!(s.pending(), 3);
    let (reqs, lent) = s.drain();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[0].is(&a) && reqs[1].is(&b));
    assert_eq!(lent.len(), 1);
    assert!(lent[0].is(&a));
    assert_eq!(s.pending(), 0);
    // Queued actions are dropped with them: a driver polls every action
    // (the `Abort` of an authentication violation included) before it
    // drains.
    assert!(s.poll_action().is_none());
}
