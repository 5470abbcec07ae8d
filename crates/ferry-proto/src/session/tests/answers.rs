//! The answers to frames that look odd but break no rule: data and leases
//! for requests that ended, aborts while pulling or on a stripe, released
//! and forgotten leases, how a request chooses its path, and `drain`.

use super::*;

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
    assert!(matches!(
        start,
        Start::OpenAndLease(Message::Open(_), LaneId::CMA)
    ));
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

/// The owner withdraws a READ it lends after the grant but before the
/// lease goes out (the driver's `serve` comes after the withdrawal): the
/// memory comes back at once, and nothing is sent.
#[test]
fn a_lease_withdrawn_before_it_went_out_is_given_back() {
    let mut s = passive(ATTACH);
    let o = pulled(open(7, OperationKind::Read, &[8]));
    assert!(matches!(
        s.handle_frame(Message::Open(o.clone())),
        Ok(Step::CheckGrant(_))
    ));
    let f = F::new();
    s.bound(&o, Ok(f.clone()));
    assert!(s.forget(7));
    s.serve(7);
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "GiveBack"]);
    assert_eq!(s.pending(), 0);
}
