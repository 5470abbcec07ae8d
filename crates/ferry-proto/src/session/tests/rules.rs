//! More frames that break each rule of the session (beyond the one
//! provoker per [`Violation`] in `violations.rs`): lane exchanges out of
//! turn, data outside a request, finishes and leases out of order.

use super::*;

#[test]
fn a_lane_exchange_goes_round_by_round_on_both_sides() {
    let cma = LANES[0];
    let mut a = active(NO_CAPS);
    let mut p = passive(Caps {
        attach: true,
        ..NO_CAPS
    });
    // Only the active side opens, and only once.
    assert_eq!(p.lane_open(cma, vec![1]), None);
    let m = a.lane_open(cma, vec![1]).expect("round 0");
    assert_eq!(a.lane_open(cma, vec![1]), None, "once");
    assert_eq!(a.lane_state(cma), Some(LaneState::Awaiting(1)));
    // Each side answers the other's round with the next one, until one
    // side's lane settles.
    let mut to_passive = Some(m);
    let mut rounds = vec![];
    for turn in 0..4u8 {
        let (me, msg) = if turn % 2 == 0 {
            (&mut p, to_passive.take().unwrap())
        } else {
            (&mut a, to_passive.take().unwrap())
        };
        let Ok(Step::LaneOffer { lane, round, bytes }) = me.handle_frame(msg) else {
            panic!("turn {turn}")
        };
        assert_eq!((lane, round, bytes), (cma, turn, vec![turn + 1]));
        rounds.push(round);
        let last = turn == 3;
        let answer = LaneAnswer {
            bytes: (!last).then(|| vec![turn + 2]),
            settled: (turn >= 2).then_some(LaneProof {
                can_pull: true,
                peer_pulls: turn == 3,
                device: true,
                release_leases: false,
            }),
        };
        to_passive = me.lane_answered(lane, answer);
        assert_eq!(to_passive.is_some(), !last, "turn {turn}");
    }
    assert_eq!(rounds, [0, 1, 2, 3]);
    // What each side's lane proved is the connection's.
    assert!(p.caps().attach && p.caps().can_pull && !p.caps().peer_pulls);
    assert!(p.caps().lends_device());
    assert!(a.caps().attach && a.caps().can_pull && a.caps().peer_pulls);
    assert!(matches!(a.lane_state(cma), Some(LaneState::Settled(_))));
    // An answer nobody asked for sends nothing.
    assert_eq!(a.lane_answered(cma, LaneAnswer::default()), None);
    assert!(acts(&mut a).is_empty() && acts(&mut p).is_empty());
}

#[test]
fn a_lane_that_proved_nothing_leaves_the_next_one_its_turn() {
    let (cma, ucx) = (LANES[0], LANES[1]);
    let mut s = passive(Caps {
        attach: true,
        ..NO_CAPS
    });
    s.handle_frame(offer(cma, 0)).unwrap();
    let declined = LaneAnswer {
        bytes: Some(vec![0]),
        settled: None,
    };
    s.lane_answered(cma, declined).unwrap();
    s.handle_frame(offer(cma, 2)).unwrap();
    let nothing = LaneAnswer {
        bytes: Some(vec![2]),
        settled: Some(LaneProof::default()),
    };
    assert!(matches!(
        s.lane_answered(cma, nothing),
        Some(Message::LaneOffer(LaneOffer { round: 3, .. }))
    ));
    assert!(!s.caps().can_pull && !s.caps().peer_pulls);
    // The next lane may begin; where it proves a way, its leases end as
    // it says.
    s.handle_frame(offer(ucx, 0)).unwrap();
    s.lane_answered(ucx, declined_then(vec![5])).unwrap();
    s.handle_frame(offer(ucx, 2)).unwrap();
    let proof = LaneProof {
        can_pull: true,
        peer_pulls: true,
        device: false,
        release_leases: true,
    };
    let settled = LaneAnswer {
        bytes: None,
        settled: Some(proof),
    };
    assert_eq!(s.lane_answered(ucx, settled), None);
    assert!(s.caps().can_pull && s.caps().peer_pulls && !s.caps().lends_device());
    assert_eq!(s.lane_state(ucx), Some(LaneState::Settled(proof)));
}

fn declined_then(bytes: Vec<u8>) -> LaneAnswer {
    LaneAnswer {
        bytes: Some(bytes),
        settled: None,
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
