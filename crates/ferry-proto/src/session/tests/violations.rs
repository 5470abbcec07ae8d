//! Every [`Violation`], each provoked by the frames that break its rule,
//! and the guard that each variant has a test of its own (more frames
//! that break each rule: `rules.rs`).

use super::*;
use crate::cursor::CursorError;
use crate::wire::Auth;

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

fn unknown_lane() -> Violation {
    // Either side: a lane this side does not set up by offers.
    let mut s = passive(ATTACH);
    let v = s.handle_frame(offer(LaneId(77), 0)).unwrap_err();
    assert_eq!(v, Violation::UnknownLane { lane: 77 });
    assert!(acts(&mut s).is_empty());
    let mut s = active(ATTACH);
    s.set_lanes(&LANES);
    assert_eq!(
        s.handle_frame(offer(LaneId(9), 1)).unwrap_err(),
        Violation::UnknownLane { lane: 9 }
    );
    // A passive side that was told no lanes knows none.
    let mut s: Session<F> = Session::new(Role::Passive, NO_CAPS);
    assert_eq!(
        s.handle_frame(offer(LANES[0], 0)).unwrap_err(),
        Violation::UnknownLane { lane: 1 }
    );
    v
}

fn lane_out_of_turn() -> Violation {
    let (cma, ucx) = (LANES[0], LANES[1]);
    let turn = |lane: LaneId, round| Violation::LaneOutOfTurn {
        lane: lane.0,
        round,
    };
    // To the active side, a lane it did not open, whatever the round.
    let mut s = active(ATTACH);
    s.set_lanes(&LANES);
    for round in [0, 1, 2, 3] {
        assert_eq!(
            s.handle_frame(offer(cma, round)).unwrap_err(),
            turn(cma, round)
        );
    }
    assert!(acts(&mut s).is_empty());
    // A verdict before any offer.
    let mut s = passive(NO_CAPS);
    let v = s.handle_frame(offer(cma, 2)).unwrap_err();
    assert_eq!(v, turn(cma, 2));
    assert_eq!(s.handle_frame(offer(ucx, 1)).unwrap_err(), turn(ucx, 1));
    // A second offer while the first is being answered.
    let mut s = passive(NO_CAPS);
    assert!(matches!(
        s.handle_frame(offer(ucx, 0)),
        Ok(Step::LaneOffer { round: 0, .. })
    ));
    assert_eq!(s.handle_frame(offer(ucx, 0)).unwrap_err(), turn(ucx, 0));
    assert_eq!(s.handle_frame(offer(ucx, 2)).unwrap_err(), turn(ucx, 2));
    // An earlier lane after a later one began: lanes go in order of ids.
    assert_eq!(s.handle_frame(offer(cma, 0)).unwrap_err(), turn(cma, 0));
    // A lane set up that proved a way: no other lane after it.
    let proved = LaneAnswer {
        bytes: None,
        settled: Some(LaneProof {
            can_pull: true,
            peer_pulls: true,
            ..LaneProof::default()
        }),
    };
    let mut s = passive(NO_CAPS);
    s.handle_frame(offer(cma, 0)).unwrap();
    let answer = LaneAnswer {
        bytes: Some(vec![1]),
        settled: None,
    };
    assert!(s.lane_answered(cma, answer).is_some());
    s.handle_frame(offer(cma, 2)).unwrap();
    assert_eq!(s.lane_answered(cma, proved), None);
    assert!(s.caps().attach && s.caps().can_pull && s.caps().peer_pulls);
    assert_eq!(s.handle_frame(offer(ucx, 0)).unwrap_err(), turn(ucx, 0));
    // Nor a round after its exchange ended.
    assert_eq!(s.handle_frame(offer(cma, 4)).unwrap_err(), turn(cma, 4));
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

fn grant_frame(request: bool) -> Message {
    use crate::grant::BlockRef;
    use crate::wire::{GrantAnswer, GrantReply, GrantRequest};
    if request {
        Message::GrantRequest(GrantRequest {
            req: 1,
            grant: 1,
            token: Token::from_bytes([3; 16]),
            kind: OperationKind::Read,
            last: true,
            offset: 0,
            len: 8,
            blocks: vec![BlockRef::new(0, 0)],
            notify: None,
            bytes: Vec::new(),
        })
    } else {
        Message::GrantReply(GrantReply {
            req: 1,
            answer: GrantAnswer::Done,
        })
    }
}

fn grant_request_to_active_side() -> Violation {
    let mut s = active(NO_CAPS);
    let v = s.handle_frame(grant_frame(true)).unwrap_err();
    assert_eq!(v, Violation::GrantRequestToActiveSide);
    assert!(acts(&mut s).is_empty());
    // The passive side serves it (and is told nothing of replies).
    let mut p = passive(NO_CAPS);
    assert!(matches!(
        p.handle_frame(grant_frame(true)),
        Ok(Step::ServeGrant(_))
    ));
    let mut a = active(NO_CAPS);
    assert!(matches!(
        a.handle_frame(grant_frame(false)),
        Ok(Step::GrantReply(_))
    ));
    v
}

fn grant_reply_to_passive_side() -> Violation {
    let mut s = passive(NO_CAPS);
    let v = s.handle_frame(grant_frame(false)).unwrap_err();
    assert_eq!(v, Violation::GrantReplyToPassiveSide);
    v
}

fn offer_frame(claim: bool) -> Message {
    use crate::grant::GrantError;
    use crate::wire::{OfferAnswer, OfferClaim, OfferReply};
    if claim {
        Message::OfferClaim(OfferClaim {
            req: 1,
            offer: 1,
            token: Token::from_bytes([3; 16]),
        })
    } else {
        Message::OfferReply(OfferReply {
            req: 1,
            answer: OfferAnswer::Refused(GrantError::Revoked),
        })
    }
}

fn offer_claim_to_active_side() -> Violation {
    let mut s = active(NO_CAPS);
    let v = s.handle_frame(offer_frame(true)).unwrap_err();
    assert_eq!(v, Violation::OfferClaimToActiveSide);
    assert!(acts(&mut s).is_empty());
    let mut p = passive(NO_CAPS);
    assert!(matches!(
        p.handle_frame(offer_frame(true)),
        Ok(Step::ServeClaim(_))
    ));
    let mut a = active(NO_CAPS);
    assert!(matches!(
        a.handle_frame(offer_frame(false)),
        Ok(Step::OfferReply(_))
    ));
    v
}

fn offer_reply_to_passive_side() -> Violation {
    let mut s = passive(NO_CAPS);
    let v = s.handle_frame(offer_frame(false)).unwrap_err();
    assert_eq!(v, Violation::OfferReplyToPassiveSide);
    v
}

/// The variant's position, by an exhaustive match (no wildcard): a new
/// variant does not compile until it is counted here and provoked below.
fn variant(v: &Violation) -> usize {
    match v {
        Violation::UnexpectedHello => 0,
        Violation::UnexpectedAuth => 1,
        Violation::AuthWithoutSecret => 2,
        Violation::UnknownLane { .. } => 3,
        Violation::LaneOutOfTurn { .. } => 4,
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
        Violation::DataForDeviceMemory { .. } => 17,
        Violation::MissingDigest { .. } => 18,
        Violation::UnexpectedDigest { .. } => 19,
        Violation::GrantRequestToActiveSide => 20,
        Violation::GrantReplyToPassiveSide => 21,
        Violation::OfferClaimToActiveSide => 22,
        Violation::OfferReplyToPassiveSide => 23,
    }
}
const VARIANTS: usize = 24;

type Provoker = fn() -> Violation;

const PROVOKERS: [(&str, Provoker); VARIANTS] = [
    ("unexpected_hello", unexpected_hello),
    ("unexpected_auth", unexpected_auth),
    ("auth_without_secret", auth_without_secret),
    ("unknown_lane", unknown_lane),
    ("lane_out_of_turn", lane_out_of_turn),
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
    ("data_for_device_memory", data_for_device_memory),
    ("missing_digest", missing_digest),
    ("unexpected_digest", unexpected_digest),
    ("grant_request_to_active_side", grant_request_to_active_side),
    ("grant_reply_to_passive_side", grant_reply_to_passive_side),
    ("offer_claim_to_active_side", offer_claim_to_active_side),
    ("offer_reply_to_passive_side", offer_reply_to_passive_side),
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
    unknown_lane,
    lane_out_of_turn,
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
    data_for_device_memory,
    missing_digest,
    unexpected_digest,
    grant_request_to_active_side,
    grant_reply_to_passive_side,
    offer_claim_to_active_side,
    offer_reply_to_passive_side,
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
