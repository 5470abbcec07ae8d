//! The lane that lends is the session's answer, from the lanes the
//! connection agreed on: every `Lend`, `SendLease` and `OpenAndLease`
//! names it, and without an agreed lane nothing is lent.

use super::device::bind_device;
use super::*;

/// The lanes the actions about `f` name, in order.
fn lanes_named(s: &mut Session<F>, f: &F) -> Vec<(&'static str, Option<LaneId>)> {
    take(s)
        .into_iter()
        .filter(|a| target(a).is_some_and(|t| t.is(f)))
        .filter_map(|a| match a {
            Action::Via { lane, .. } => Some(("Via", lane)),
            Action::Lend { lane, .. } => Some(("Lend", Some(lane))),
            Action::SendLease { lane, .. } => Some(("SendLease", Some(lane))),
            _ => None,
        })
        .collect()
}

#[test]
fn the_lease_names_the_lane_the_session_chose() {
    let read = pulled(open(1, OperationKind::Read, &[8]));
    // Host memory by the host lane, device memory by the device lane.
    for (device, lane) in [(false, LaneId::CMA), (true, LaneId::CUDA_IPC)] {
        let mut s = passive(ATTACH);
        let f = if device {
            bind_device(&mut s, &read)
        } else {
            bind(&mut s, &read)
        };
        let l = Some(lane);
        let want = [("Via", l), ("Lend", l), ("SendLease", l)];
        assert_eq!(lanes_named(&mut s, &f), want, "device: {device}");
    }
    // The active side plans by the same lanes: its lending WRITE's lease
    // goes out with the `Open`, naming the planner's lane.
    let mut s = active(ATTACH);
    let lane = s.lane_for(OperationKind::Write, Mem::Host, Mem::Host);
    assert_eq!(lane, Some(LaneId::CMA));
    let p = OpenParams {
        lane,
        ..params(OperationKind::Write, &[8], true, (0, 1))
    };
    let f = F::new();
    let (_, start) = s.open(p, f.clone());
    assert!(matches!(start, Start::OpenAndLease(_, LaneId::CMA)));
    let l = Some(LaneId::CMA);
    assert_eq!(lanes_named(&mut s, &f), [("Via", l), ("Lend", l)]);
    // Device memory into host memory by the device lane; host memory
    // into device memory by none.
    let gpu = s.lane_for(OperationKind::Write, Mem::Device, Mem::Host);
    assert_eq!(gpu, Some(LaneId::CUDA_IPC));
    let none = s.lane_for(OperationKind::Write, Mem::Host, Mem::Device);
    assert_eq!(none, None);
}

#[test]
fn without_an_agreed_lane_nothing_is_lent() {
    // Caps that would lend, but no lane agreed on (the driver never found
    // one): a READ that asked for a lease streams.
    let mut s = Session::new(Role::Passive, ATTACH);
    let read = pulled(open(1, OperationKind::Read, &[8]));
    let f = bind(&mut s, &read);
    assert_eq!(
        all_about(&mut s, &f),
        ["Via in band", "Stream 1 Seal Some((0, 0, 8))"]
    );
    assert_eq!(s.agreed_lanes(), &crate::lane::LaneSet::default());
    // Device memory, which moves only lent: refused, saying why.
    let mut s = Session::new(Role::Passive, ATTACH);
    let f = bind_device(&mut s, &read);
    let all = all_about(&mut s, &f);
    assert!(all[0].starts_with("Send Abort 1 DeviceMemory"), "{all:?}");
    assert!(
        all[0].contains("no lane of this connection lends it"),
        "{all:?}"
    );
    assert!(all[1].starts_with("RemoteAbort DeviceMemory"), "{all:?}");
    assert_eq!(s.pending(), 0);
    // The active side: no lane, so a WRITE asked to lend streams, and its
    // `Open` asks for no lease.
    let mut s: Session<F> = Session::new(Role::Active, ATTACH);
    assert_eq!(s.lane_for(OperationKind::Write, Mem::Host, Mem::Host), None);
    let p = OpenParams {
        lane: None,
        ..params(OperationKind::Write, &[8], true, (0, 1))
    };
    match s.open(p, F::new()).1 {
        Start::Stream {
            open: Message::Open(o),
            ..
        } => assert!(!o.pull),
        other => panic!("{other:?}"),
    }
}
