//! Every [`Violation`], each provoked by the frames that break its rule;
//! the guard that each variant has a test of its own; and more frames that
//! break each rule.

use super::*;
use crate::cursor::CursorError;
use crate::wire::{Auth, Rdma};

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

fn rdma(address: &[u8], verdict: Verdict) -> Message {
    Message::Rdma(Rdma {
        address: address.to_vec(),
        verdict,
        cuda: false,
    })
}

fn rdma_to_active_side() -> Violation {
    let mut s = active(NO_CAPS);
    let v = s.handle_frame(rdma(&[1; 8], Verdict::Unknown)).unwrap_err();
    assert_eq!(v, Violation::RdmaToActiveSide);
    assert!(acts(&mut s).is_empty());
    v
}

fn rdma_out_of_turn() -> Violation {
    // A verdict before any address.
    let mut s = passive(NO_CAPS);
    let v = s.handle_frame(rdma(&[], Verdict::CanPull)).unwrap_err();
    assert_eq!(v, Violation::RdmaOutOfTurn);
    // An empty offer.
    let mut s = passive(NO_CAPS);
    assert_eq!(
        s.handle_frame(rdma(&[], Verdict::Unknown)).unwrap_err(),
        Violation::RdmaOutOfTurn
    );
    // A second offer while the first is being answered.
    let mut s = passive(NO_CAPS);
    assert!(matches!(
        s.handle_frame(rdma(&[1; 8], Verdict::Unknown)),
        Ok(Step::RdmaOffer { .. })
    ));
    assert_eq!(
        s.handle_frame(rdma(&[1; 8], Verdict::Unknown)).unwrap_err(),
        Violation::RdmaOutOfTurn
    );
    // RDMA set up, then an attach: one way of lending per connection.
    let _ = s.rdma_answered(true, vec![2; 8], false);
    assert!(matches!(
        s.handle_frame(rdma(&[], Verdict::CanPull)),
        Ok(Step::Done)
    ));
    assert!(s.caps().attach && s.caps().can_pull && s.caps().peer_pulls);
    assert_eq!(
        s.handle_frame(attach(Verdict::Unknown)).unwrap_err(),
        Violation::AttachOutOfTurn
    );
    Violation::RdmaOutOfTurn
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

fn data_for_device_memory() -> Violation {
    // A READ into device memory asked for a lease; the source streams
    // instead (as it may for host memory).
    let mut s = active(ATTACH);
    let f = F::new();
    f.on_device();
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), f);
    take(&mut s);
    let v = s.handle_frame(data(req, 0, 0, 8)).unwrap_err();
    assert_eq!(v, Violation::DataForDeviceMemory { req });
    assert!(acts(&mut s).is_empty(), "no payload is landed");
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

fn missing_digest() -> Violation {
    // The check is on here; the source's `Finish` came without a digest.
    let mut s = passive(NO_CAPS);
    s.set_digest(true);
    let f = bind(&mut s, &open(1, OperationKind::Write, &[4]));
    take(&mut s);
    lands(&mut s, data(1, 0, 0, 4), &f);
    let v = s.handle_frame(finish(1)).unwrap_err();
    assert_eq!(v, Violation::MissingDigest { req: 1 });
    assert!(acts(&mut s).is_empty());
    v
}

fn unexpected_digest() -> Violation {
    // A digest sent to the side that streams the bytes.
    let mut s = passive(NO_CAPS);
    bind(&mut s, &open(1, OperationKind::Read, &[4]));
    take(&mut s);
    let d = Message::Digest(crate::wire::Digest {
        req: 1,
        crc32: Some(0),
    });
    let v = s.handle_frame(d).unwrap_err();
    assert_eq!(v, Violation::UnexpectedDigest { req: 1 });
    v
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
        Violation::RdmaToActiveSide => 17,
        Violation::RdmaOutOfTurn => 18,
        Violation::DataForDeviceMemory { .. } => 19,
        Violation::MissingDigest { .. } => 20,
        Violation::UnexpectedDigest { .. } => 21,
    }
}
const VARIANTS: usize = 22;

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
    ("rdma_to_active_side", rdma_to_active_side),
    ("rdma_out_of_turn", rdma_out_of_turn),
    ("data_for_device_memory", data_for_device_memory),
    ("missing_digest", missing_digest),
    ("unexpected_digest", unexpected_digest),
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
    rdma_to_active_side,
    data_for_device_memory,
    rdma_out_of_turn,
    missing_digest,
    unexpected_digest,
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
    s.attach_offered(Some(([9; 16], [8; 16])), [5; 16], false);
    assert_eq!(
        s.handle_frame(attach(Verdict::Unknown)).unwrap_err(),
        Violation::AttachOutOfTurn
    );
    // A fifth frame after the exchange.
    let mut s = passive(ATTACH);
    s.handle_frame(attach(Verdict::Unknown)).unwrap();
    s.attach_offered(None, [5; 16], false);
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
    // The proof bytes this side placed; the test's verdicts carry [9; 16]
    // (see `attach`), and echo them where the peer read them.
    let (read, not_read) = ([9; 16], [4; 16]);
    for (offer, verdict, proof, ok) in [
        (Some(nonces), Verdict::CanPull, read, true),
        (Some(nonces), Verdict::CanPull, not_read, false),
        (Some(nonces), Verdict::Refused, read, false),
        (None, Verdict::CanPull, read, false),
    ] {
        let mut s = passive(Caps {
            attach: true,
            ..NO_CAPS
        });
        match s.handle_frame(attach(Verdict::Unknown)) {
            Ok(Step::AttachOffer { nonce }) => assert_eq!(nonce, [9; 16]),
            other => panic!("{other:?}"),
        }
        s.attach_offered(offer, proof, false);
        match s.handle_frame(attach(verdict)) {
            Ok(Step::AttachVerify { nonces, pid, addr }) => {
                assert_eq!((nonces, pid, addr), (offer, 42, 0x5000))
            }
            other => panic!("{other:?}"),
        }
        // The peer may copy from this side only if it read our offer and
        // proved it (its word alone is not enough).
        assert_eq!(s.caps().peer_pulls, ok, "{offer:?} {verdict:?} {proof:?}");
        assert!(!s.caps().can_pull);
        for probe in [None, Some([7; 16])] {
            let m = s.attach_verified(probe);
            let want = if probe.is_some() {
                Verdict::CanPull
            } else {
                Verdict::Refused
            };
            assert!(matches!(
                m,
                Message::Attach(Attach { pid: 0, addr: 0, verdict, cookie, .. })
                    if verdict == want && cookie == probe.unwrap_or_default()
            ));
            assert_eq!(s.caps().can_pull, probe.is_some());
        }
        assert!(acts(&mut s).is_empty());
    }
}

#[test]
fn a_verdict_without_its_proof_bytes_proves_nothing() {
    let with = |verdict, cookie| Attach {
        pid: 0,
        addr: 0,
        cookie,
        verdict,
        cuda_ipc: false,
    };
    assert!(proves(&with(Verdict::CanPull, [3; 16]), &[3; 16]));
    assert!(!proves(&with(Verdict::CanPull, [3; 16]), &[4; 16]));
    assert!(!proves(&with(Verdict::Refused, [3; 16]), &[3; 16]));
    assert!(!proves(&with(Verdict::Unknown, [3; 16]), &[3; 16]));
    // Zeros, what a verdict without a proof carries, never count.
    assert!(!proves(&with(Verdict::CanPull, [0; 16]), &[0; 16]));
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
        (0, 0, 17),       // past the last descriptor
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
    // A span across both descriptors is one frame's worth.
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &open(1, OperationKind::Write, &[8, 8]));
    lands(&mut s, data(1, 0, 0, 4), &f);
    lands(&mut s, data(1, 0, 4, 10), &f);
    assert!(matches!(
        s.handle_frame(data(1, 1, 6, 3)),
        Err(Violation::DataOutOfOrder(_))
    ));
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
