//! Leases on a connection set up for an RDMA backend (UCX): the source's
//! memory may still be read by gets the destination posted before it
//! stopped, so a lease ends only with the destination's `Finish` or
//! `Release`, never with an `Abort` (see [`Session::rdma_leases`]).

use super::*;
use crate::wire::Rdma;

fn rdma(address: &[u8], verdict: Verdict) -> Message {
    Message::Rdma(Rdma {
        address: address.to_vec(),
        verdict,
        cuda: false,
    })
}

/// A passive side that answered the active side's `Rdma` offer: leases on
/// this connection are RDMA leases from then on, with no driver call.
fn passive_after_rdma() -> Session<F> {
    let mut s = passive(NO_CAPS);
    assert!(matches!(
        s.handle_frame(rdma(&[1; 8], Verdict::Unknown)),
        Ok(Step::RdmaOffer { .. })
    ));
    let answer = s.rdma_answered(true, vec![2; 8], false);
    assert!(matches!(
        answer,
        Message::Rdma(Rdma {
            verdict: Verdict::CanPull,
            ..
        })
    ));
    done(s.handle_frame(rdma(&[], Verdict::CanPull)));
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

/// Device memory is lent through UCX only where both sides' UCX moves CUDA
/// memory and this side reached the peer; each side's answer says its own.
#[test]
fn ucx_lends_device_memory_only_where_both_move_cuda_memory() {
    for (peer, mine, reached) in [
        (true, true, true),
        (true, false, true),
        (false, true, true),
        (true, true, false),
    ] {
        let mut s = passive(NO_CAPS);
        let offer = Message::Rdma(Rdma {
            address: vec![1; 8],
            verdict: Verdict::Unknown,
            cuda: peer,
        });
        assert!(matches!(s.handle_frame(offer), Ok(Step::RdmaOffer { .. })));
        let answer = s.rdma_answered(reached, vec![2; 8], mine);
        let Message::Rdma(a) = answer else {
            panic!("{answer:?}")
        };
        assert_eq!(a.cuda, mine && reached, "the answer says this side's own");
        done(s.handle_frame(rdma(&[], Verdict::CanPull)));
        let both = peer && mine && reached;
        assert_eq!(s.caps().ucx_cuda, both, "{peer} {mine} {reached}");
        assert!(!s.caps().cuda_ipc, "never CUDA IPC with UCX");
        assert_eq!(
            crate::session::can_lend(&[4096], true, s.caps()),
            both,
            "device memory lent: {peer} {mine} {reached}"
        );
        // Host memory is lent wherever UCX is set up both ways.
        assert_eq!(crate::session::can_lend(&[4096], false, s.caps()), reached);
    }
}
