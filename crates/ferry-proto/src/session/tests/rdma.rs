//! Leases on a connection set up for an RDMA backend (UCX): the source's
//! memory may still be read by gets the destination posted before it
//! stopped, so a lease ends only with the destination's `Finish` or
//! `Release`, never with an `Abort` (see [`Session::rdma_leases`]).

use super::*;

/// A UCX-like lane's exchange on the passive side: the active side's
/// round 0, this side's answer, the active side's verdict; the lane
/// settles with `proof`.
fn set_up(s: &mut Session<F>, proof: LaneProof) {
    let lane = LANES[1];
    assert!(matches!(
        s.handle_frame(offer(lane, 0)),
        Ok(Step::LaneOffer { round: 0, .. })
    ));
    let answer = LaneAnswer {
        bytes: Some(vec![2; 8]),
        settled: None,
    };
    assert!(matches!(
        s.lane_answered(lane, answer),
        Some(Message::LaneOffer(LaneOffer { round: 1, .. }))
    ));
    assert!(matches!(
        s.handle_frame(offer(lane, 2)),
        Ok(Step::LaneOffer { round: 2, .. })
    ));
    let settled = LaneAnswer {
        bytes: None,
        settled: Some(proof),
    };
    assert_eq!(s.lane_answered(lane, settled), None);
}

/// A passive side whose lane settled with RDMA leases: leases on this
/// connection are RDMA leases from then on, with no driver call.
fn passive_after_rdma() -> Session<F> {
    let mut s = passive(NO_CAPS);
    set_up(
        &mut s,
        LaneProof {
            can_pull: true,
            peer_pulls: true,
            device: false,
            release_leases: true,
        },
    );
    s
}

#[test]
fn an_abort_leaves_lent_memory_lent_until_the_release() {
    for reason in [AbortReason::Cancelled, AbortReason::ShuttingDown] {
        let mut s = passive_after_rdma();
        let f = bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
        assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "SendLease 1"]);
        done(s.handle_frame(abort(1, reason)));
        let seen = all_about(&mut s, &f);
        assert!(
            !seen.iter().any(|a| a == "GiveBack"),
            "given back while gets may be in flight: {seen:?}"
        );
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].starts_with("RemoteAbort"), "{seen:?}");
        assert_eq!(s.pending(), 1, "the lease is still out");
        done(s.handle_frame(Message::Release { req: 1 }));
        assert_eq!(all_about(&mut s, &f), ["GiveBack"]);
        assert_eq!(s.pending(), 0);
    }
}

#[test]
fn without_rdma_the_same_abort_gives_the_memory_back() {
    // The contrast: a cross-memory attach lease ends with the abort.
    let mut s = passive(ATTACH);
    let f = bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
    take(&mut s);
    done(s.handle_frame(abort(1, AbortReason::Cancelled)));
    assert_eq!(all_about(&mut s, &f)[0], "GiveBack");
}

#[test]
fn a_destination_stopped_by_an_abort_releases_only_once_its_copy_ended() {
    // The active side pulls a READ over an RDMA connection.
    let mut s = active(ATTACH);
    s.rdma_leases();
    let f = F::new();
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), f.clone());
    done(s.handle_frame(lease(req, &[8])));
    take(&mut s);
    done(s.handle_frame(abort(req, AbortReason::Cancelled)));
    // The operation ends, but no Release yet: gets may be in flight.
    assert_eq!(
        all_about(&mut s, &f),
        ["RemoteAbort Cancelled: Cancelled from the peer"]
    );
    // The driver's copy stopped (its gets drained): now the Release.
    assert!(matches!(
        s.pull_ended(req, false),
        Some(Message::Release { req: r }) if r == req
    ));
    // A copy that completed says Finish, RDMA or not.
    assert!(matches!(
        s.pull_ended(req, true),
        Some(Message::Finish { .. })
    ));
    // Without RDMA leases the abort already released it; a stopped copy
    // sends nothing more.
    let mut s = active(ATTACH);
    let (req, _) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), f.clone());
    done(s.handle_frame(lease(req, &[8])));
    take(&mut s);
    done(s.handle_frame(abort(req, AbortReason::Cancelled)));
    assert!(all_about(&mut s, &f).contains(&format!("Send Release {req} (reply)")));
    assert!(s.pull_ended(req, false).is_none());
}

#[test]
fn an_active_writer_keeps_its_lent_memory_until_the_release() {
    // The active side lends a WRITE's source over RDMA and cancels it:
    // forgetting the request gives nothing back; only the Release does.
    let mut s = active(ATTACH);
    s.rdma_leases();
    let f = F::new();
    let (req, _) = s.open(params(OperationKind::Write, &[8], true, (0, 1)), f.clone());
    take(&mut s);
    assert!(s.forget(req));
    assert!(acts(&mut s).is_empty(), "given back while gets may run");
    done(s.handle_frame(abort(req, AbortReason::Cancelled)));
    assert!(!all_about(&mut s, &f).contains(&"GiveBack".to_string()));
    done(s.handle_frame(Message::Release { req }));
    assert_eq!(all_about(&mut s, &f), ["GiveBack"]);
}

/// Device memory is lent through the lane only where its proof says both
/// sides move it (the lane decides that from both offers: see
/// `transport::pull::ucx_offer` in the `ferry` crate).
#[test]
fn a_lane_lends_device_memory_only_where_its_proof_says_so() {
    for (device, reached) in [(true, true), (false, true), (true, false)] {
        let mut s = passive(NO_CAPS);
        let proof = LaneProof {
            can_pull: reached,
            peer_pulls: reached,
            device: device && reached,
            release_leases: true,
        };
        set_up(&mut s, proof);
        let both = device && reached;
        assert_eq!(s.caps().lends_device(), both, "{device} {reached}");
        assert_eq!(
            crate::session::can_lend(&[4096], true, s.caps()),
            both,
            "device memory lent: {device} {reached}"
        );
        // Host memory is lent wherever the lane is set up both ways.
        assert_eq!(crate::session::can_lend(&[4096], false, s.caps()), reached);
    }
}
