//! Device (GPU) memory that its side cannot stage through host memory
//! never moves in band: the passive side refuses a request over it that
//! would (`AbortReason::DeviceMemory`), lends it to a peer that pulls, and
//! copies into it from a lease; the active side refuses `Data` into it.
//! Host memory, and device memory that stages
//! (`Fence::moves_in_band`), are unchanged.

use super::*;

/// Binds `o` at the passive session `s` to an operation over device memory
/// and serves it, as the driver does.
pub(super) fn bind_device(s: &mut Session<F>, o: &Open) -> F {
    let step = s.handle_frame(Message::Open(o.clone())).unwrap();
    assert!(matches!(&step, Step::CheckGrant(x) if x == o), "{step:?}");
    let f = F::new();
    f.on_device();
    s.bound(o, Ok(f.clone()));
    s.serve(o.req);
    f
}

/// The refusal of request `req`: the abort to the peer, and the end of
/// the operation it was bound to, with the same reason and detail.
fn refused(s: &mut Session<F>, f: &F, req: u64, why: &str) {
    let all = all_about(s, f);
    assert_eq!(all.len(), 2, "{all:?}");
    let abort = format!("Send Abort {req} DeviceMemory: {DEVICE_MEMORY_BY_IPC_ONLY}");
    assert!(all[0].starts_with(&abort), "{all:?}");
    assert!(
        all[0].contains(why) && all[0].ends_with("(reply)"),
        "{all:?}"
    );
    assert!(
        all[1].starts_with(&format!(
            "RemoteAbort DeviceMemory: {DEVICE_MEMORY_BY_IPC_ONLY}"
        )),
        "{all:?}"
    );
    assert_eq!(s.pending(), 0, "nothing left in the tables");
}

#[test]
fn a_pulled_read_of_device_memory_is_lent() {
    let mut s = passive(ATTACH);
    let f = bind_device(&mut s, &pulled(open(1, OperationKind::Read, &[8, 4])));
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "SendLease 1"]);
    done(s.handle_frame(finish(1)));
    assert_eq!(all_about(&mut s, &f), ["GiveBack", "Commit 1 lent"]);
    assert_eq!(s.pending(), 0);
}

#[test]
fn a_pulled_write_into_device_memory_copies_the_lease() {
    let mut s = passive(ATTACH);
    let f = bind_device(&mut s, &pulled(open(1, OperationKind::Write, &[8])));
    assert_eq!(all_about(&mut s, &f), ["Via lent"]);
    done(s.handle_frame(lease(1, &[8])));
    assert_eq!(all_about(&mut s, &f), ["Pull 1 [(4096, 8)]"]);
    // Data frames instead of the copy: refused.
    let mut s = passive(ATTACH);
    let f = bind_device(&mut s, &pulled(open(1, OperationKind::Write, &[8])));
    take(&mut s);
    let v = s.handle_frame(data(1, 0, 0, 8)).unwrap_err();
    assert_eq!(v, Violation::UnexpectedData { req: 1 });
    assert!(all_about(&mut s, &f).is_empty());
}

#[test]
fn device_memory_in_band_is_refused_before_a_byte_moves() {
    use OperationKind::{Read, Write};
    for kind in [Read, Write] {
        // Not pulled: the peer is on another host, or has no attach.
        for caps in [ATTACH, NO_CAPS] {
            let mut s = passive(caps);
            let f = bind_device(&mut s, &open(1, kind, &[8]));
            refused(&mut s, &f, 1, "in-band");
            // Its data, if the peer sends it anyway, is discarded.
            assert!(matches!(
                s.handle_frame(data(1, 0, 0, 8)),
                Ok(Step::Discard { len: 8 })
            ));
        }
        // A part of a striped transfer.
        let mut s = passive(ATTACH);
        let f = bind_device(&mut s, &part(pulled(open(2, kind, &[8])), 1, 2));
        refused(&mut s, &f, 2, "striped");
    }
    // A pulled READ that this side cannot lend: the fallback would stream.
    let one_way = Caps {
        peer_pulls: false,
        ..ATTACH
    };
    let mut s = passive(one_way);
    let f = bind_device(&mut s, &pulled(open(3, Read, &[8])));
    refused(&mut s, &f, 3, "cannot lend");
    let many = super::super::plan::unlendable();
    let mut s = passive(ATTACH);
    let f = bind_device(&mut s, &pulled(open(4, Read, &many)));
    refused(&mut s, &f, 4, "cannot lend");
    // A pulled WRITE whose lease this side could not take.
    let no_pull = Caps {
        can_pull: false,
        ..ATTACH
    };
    let mut s = passive(no_pull);
    let f = bind_device(&mut s, &pulled(open(5, Write, &[8])));
    refused(&mut s, &f, 5, "cannot copy");
}

#[test]
fn host_memory_still_falls_back_to_streaming() {
    let one_way = Caps {
        peer_pulls: false,
        ..ATTACH
    };
    let mut s = passive(one_way);
    let f = bind(&mut s, &pulled(open(1, OperationKind::Read, &[8])));
    let all = all_about(&mut s, &f);
    assert_eq!(all[0], "Via in band");
    assert!(all[1].starts_with("Stream 1 Seal"), "{all:?}");
}

#[test]
fn a_read_into_device_memory_takes_a_lease_and_no_data() {
    let mut s = active(ATTACH);
    let f = F::new();
    f.on_device();
    let (req, start) = s.open(params(OperationKind::Read, &[8], true, (0, 1)), f.clone());
    assert!(matches!(
        start,
        Start::Open(Message::Open(Open { pull: true, .. }))
    ));
    take(&mut s);
    done(s.handle_frame(lease(req, &[8])));
    assert_eq!(
        all_about(&mut s, &f),
        ["Via lent", &format!("Pull {req} [(4096, 8)]")]
    );
}

/// Binds `o` at the passive session `s` to an operation over device memory
/// that this side stages through host memory (moves in band); not served.
fn bind_staged(s: &mut Session<F>, o: &Open) -> F {
    let step = s.handle_frame(Message::Open(o.clone())).unwrap();
    assert!(matches!(&step, Step::CheckGrant(x) if x == o), "{step:?}");
    let f = F::new();
    f.on_staged_device();
    s.bound(o, Ok(f.clone()));
    f
}

#[test]
fn device_memory_is_lent_only_where_both_sides_offered_cuda_ipc() {
    let read = pulled(open(1, OperationKind::Read, &[8]));
    // Both offered: lent, like host memory.
    let mut s = passive(ATTACH);
    let f = bind_staged(&mut s, &read);
    s.serve(1);
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "SendLease 1"]);
    // One did not: staged in band, never lent; host memory is still lent.
    let no_ipc = Caps {
        device: false,
        ..ATTACH
    };
    let mut s = passive(no_ipc);
    let f = bind_staged(&mut s, &read);
    s.serve(1);
    let all = all_about(&mut s, &f);
    assert_eq!(all[0], "Via in band", "{all:?}");
    assert!(all[1].starts_with("Stream 1 Seal"), "{all:?}");
    assert_eq!(all.len(), 2, "{all:?}");
    let mut s = passive(no_ipc);
    let f = bind(&mut s, &read);
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend", "SendLease 1"]);
    // Device memory that cannot stage: refused, saying why.
    let mut s = passive(no_ipc);
    let f = bind_device(&mut s, &read);
    refused(&mut s, &f, 1, "did not both offer CUDA IPC");
}

#[test]
fn a_lend_that_fails_falls_back_to_streaming() {
    let read = pulled(open(1, OperationKind::Read, &[8, 4]));
    let mut s = passive(ATTACH);
    let f = bind_staged(&mut s, &read);
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend"]);
    // The export failed: nothing lent, nothing to give back.
    assert!(s.lend_failed(1, "cuIpcGetMemHandle failed"));
    assert_eq!(all_about(&mut s, &f), ["Via in band"]);
    s.serve(1);
    let all = all_about(&mut s, &f);
    assert!(all[0].starts_with("Stream 1 Seal"), "{all:?}");
    assert_eq!(s.pending(), 1, "the request, and no lease");
    let (reqs, lent) = s.drain();
    assert_eq!((reqs.len(), lent.len()), (1, 0));
    // Device memory that cannot stage: refused instead, the reason kept.
    let mut s = passive(ATTACH);
    let step = s.handle_frame(Message::Open(read.clone())).unwrap();
    assert!(matches!(step, Step::CheckGrant(_)));
    let f = F::new();
    f.on_device();
    s.bound(&read, Ok(f.clone()));
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend"]);
    assert!(s.lend_failed(1, "cuIpcGetMemHandle failed"));
    refused(&mut s, &f, 1, "cuIpcGetMemHandle failed");
    // Not a request that lends (or one already over): nothing to do.
    assert!(s.lend_failed(9, "whatever"));
    assert!(take(&mut s).is_empty());
}

#[test]
fn a_promised_lease_that_cannot_be_lent_is_the_drivers_to_end() {
    // An active WRITE that lends: its lease goes out with the `Open`.
    let mut s = active(ATTACH);
    let f = F::new();
    f.on_staged_device();
    let (req, start) = s.open(params(OperationKind::Write, &[8], true, (0, 1)), f.clone());
    assert!(matches!(start, Start::OpenAndLease(..)));
    assert_eq!(all_about(&mut s, &f), ["Via lent", "Lend"]);
    assert!(!s.lend_failed(req, "cuIpcGetMemHandle failed"));
    // Nothing is lent any more: losing the connection gives nothing back.
    let (reqs, lent) = s.drain();
    assert_eq!(reqs.len(), 1);
    assert!(lent.is_empty());
}

#[test]
fn a_settled_lane_says_whether_device_memory_is_lent() {
    // Whether both sides offered CUDA IPC is the lane's to say (see
    // `transport::pull::cma_offer` in the `ferry` crate); the session keeps
    // its word, even where the lane proved nothing else.
    for device in [true, false] {
        let mut s = passive(NO_CAPS);
        s.handle_frame(offer(LANES[0], 0)).unwrap();
        let offered = LaneAnswer {
            bytes: Some(vec![1]),
            settled: None,
        };
        s.lane_answered(LANES[0], offered).unwrap();
        s.handle_frame(offer(LANES[0], 2)).unwrap();
        let proof = LaneProof {
            device,
            ..LaneProof::default()
        };
        let settled = LaneAnswer {
            bytes: Some(vec![2]),
            settled: Some(proof),
        };
        s.lane_answered(LANES[0], settled).unwrap();
        assert_eq!(s.caps().lends_device(), device);
        assert!(!s.caps().can_pull && !s.caps().peer_pulls);
    }
}
