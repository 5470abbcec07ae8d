//! Hostile peers that break the frame-level rules of
//! `crates/ferry/tests/bad_input.rs`, each facing an honest `Session`
//! driven by `support/pair_world.rs` (see `tests/session_pair.rs` for
//! honest pairs).

#[path = "support/pair_world.rs"]
mod pair_world;

use ferry_proto::session::{Caps, Fence, Role, Violation};
use ferry_proto::wire::{Abort, AbortReason, Lease, Message, Open};
use ferry_proto::{OperationKind, Token};
use pair_world::*;

// ---------------------------------------------------------------------------
// Hostile peers (the frame-level rules of `crates/ferry/tests/bad_input.rs`):
// the honest session names the violation, closes, and every operation on
// the connection fails; memory outside what was sent stays untouched.

fn open_frame(req: u64, kind: OperationKind, meta: &Meta, pull: bool, part: (u16, u16)) -> Message {
    Message::Open(Open {
        req,
        op_id: meta.op_id,
        token: meta.token,
        kind,
        sizes: meta.sizes.as_slice().into(),
        pull,
        part: part.0,
        parts: part.1,
    })
}

fn assert_errored(op: &H, v: &Violation) {
    assert_eq!(op.outcome(), Some(Outcome::Errored(v.to_string())));
}

#[test]
fn hostile_writer_sends_data_outside_its_part() {
    let mut w = World::new();
    let (x, y) = (
        w.facing_script(Role::Passive, IN_BAND),
        w.facing_script(Role::Passive, IN_BAND),
    );
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&[10]));
    w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 2)));
    w.inject(y, open_frame(1, OperationKind::Write, &meta, false, (1, 2)));
    w.run();
    // Part 0 writes into part 1's range [5, 10).
    w.inject_data(x, 1, 0, 5, &[1; 5]);
    w.run();
    let v = w.violation(x).expect("a violation");
    assert!(matches!(v, Violation::DataOutOfOrder(_)), "{v:?}");
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), untouched(&[10]));
    // The other part's request ended with the operation, and was told.
    assert!(w.sent(x).is_empty());
    assert_eq!(w.sent(y), [abort(1, AbortReason::PartFailed)]);
    w.assert_idle();
}

#[test]
fn hostile_reader_sends_data_outside_its_part() {
    let mut w = World::new();
    let (x, y) = (
        w.facing_script(Role::Active, IN_BAND),
        w.facing_script(Role::Active, IN_BAND),
    );
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![10],
    };
    let dst = w.op(untouched(&[10]), 2);
    let r0 = w.start(x, OperationKind::Read, &dst, &meta, false, (0, 2));
    let r1 = w.start(y, OperationKind::Read, &dst, &meta, false, (1, 2));
    // Part 1 is [5, 10); the passive side sends byte 4.
    w.inject_data(y, r1, 0, 4, &[1; 6]);
    w.run();
    let v = w.violation(y).expect("a violation");
    assert!(matches!(v, Violation::DataOutOfOrder(_)), "{v:?}");
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), untouched(&[10]));
    let opens = w.sent(x);
    assert_eq!(opens.last(), Some(&abort(r0, AbortReason::PartFailed)));
    w.assert_idle();
}

#[test]
fn hostile_writer_finishes_before_all_data() {
    let mut w = World::new();
    let x = w.facing_script(Role::Passive, IN_BAND);
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&[8, 8]));
    w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 1)));
    w.inject_data(x, 1, 0, 0, &[1; 8]);
    w.inject_data(x, 1, 1, 0, &[2; 4]);
    w.inject(x, Message::Finish { req: 1 });
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::FinishBeforeAllData { req: 1 });
    assert_errored(&dst, &v);
    // What was sent landed; the rest is untouched; nothing was confirmed.
    let want = vec![vec![1; 8], [vec![2; 4], vec![UNTOUCHED; 4]].concat()];
    assert_eq!(dst.bytes(), want);
    assert!(w.sent(x).is_empty());
    w.assert_idle();
}

#[test]
fn hostile_reader_finishes_before_all_data() {
    let mut w = World::new();
    let x = w.facing_script(Role::Active, IN_BAND);
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![8],
    };
    let dst = w.op(untouched(&[8]), 1);
    let req = w.start(x, OperationKind::Read, &dst, &meta, false, (0, 1));
    w.inject_data(x, req, 0, 0, &[3; 7]);
    w.inject(x, Message::Finish { req });
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::FinishBeforeAllData { req });
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), [[vec![3; 7], vec![UNTOUCHED]].concat()]);
    w.assert_idle();
}

#[test]
fn hostile_destination_confirms_a_part_before_it_was_sent() {
    let mut w = World::new();
    let (x, y) = (
        w.facing_script(Role::Active, IN_BAND),
        w.facing_script(Role::Active, IN_BAND),
    );
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![100],
    };
    let src = w.op(patterns(&[100], 9), 2);
    let r0 = w.start(x, OperationKind::Write, &src, &meta, false, (0, 2));
    let r1 = w.start(y, OperationKind::Write, &src, &meta, false, (1, 2));
    // One frame of part 1 is out; the confirmation comes at once.
    w.turn(&[y]);
    w.inject(y, Message::Finish { req: r1 });
    w.run();
    let v = w.violation(y).expect("a violation");
    assert_eq!(v, Violation::PartConfirmedBeforeSent { part: 1 });
    assert_errored(&src, &v);
    assert!(!src.is_sealed());
    // Part 0 stopped and was told; it never sealed.
    let to_x = w.sent(x);
    assert_eq!(to_x.last(), Some(&abort(r0, AbortReason::PartFailed)));
    assert!(!to_x.contains(&Message::Finish { req: r0 }));
    w.assert_idle();
}

#[test]
fn hostile_writer_leases_memory_of_another_shape() {
    for lens in [vec![37, 0, 1], vec![37, 0, 1, 65], vec![37, 1, 0, 64]] {
        let mut w = World::new();
        let x = w.facing_script(Role::Passive, ATTACH);
        let (dst, meta) = w.expose(OperationKind::Write, untouched(&SIZES));
        w.inject(x, open_frame(1, OperationKind::Write, &meta, true, (0, 1)));
        let segments: Vec<(u64, u64)> = lens.iter().map(|&l| (0x1000, l)).collect();
        w.inject(
            x,
            Message::Lease(Lease {
                lane: ferry_proto::lane::LaneId::CMA,
                req: 1,
                segments: segments.into(),
                key: vec![],
            }),
        );
        w.run();
        let v = w.violation(x).expect("a violation");
        assert_eq!(v, Violation::LeaseShapeMismatch { req: 1 });
        assert_errored(&dst, &v);
        assert_eq!(dst.bytes(), untouched(&SIZES));
        w.assert_idle();
    }
}

#[test]
fn hostile_passive_lends_memory_of_another_shape() {
    let mut w = World::new();
    let x = w.facing_script(Role::Active, ATTACH);
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![8, 8],
    };
    let dst = w.op(untouched(&[8, 8]), 1);
    let req = w.start(x, OperationKind::Read, &dst, &meta, true, (0, 1));
    w.inject(
        x,
        Message::Lease(Lease {
            lane: ferry_proto::lane::LaneId::CMA,
            req,
            segments: vec![(0x1000, 16)].into(),
            key: vec![],
        }),
    );
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::LeaseShapeMismatch { req });
    assert_errored(&dst, &v);
    assert_eq!(dst.via(), Vec::<bool>::new());
    w.assert_idle();
}

#[test]
fn hostile_writer_reuses_a_request_number() {
    let mut w = World::new();
    let x = w.facing_script(Role::Passive, IN_BAND);
    let (first, m1) = w.expose(OperationKind::Write, untouched(&[8]));
    let (second, m2) = w.expose(OperationKind::Write, untouched(&[8]));
    w.inject(x, open_frame(1, OperationKind::Write, &m1, false, (0, 1)));
    w.inject_data(x, 1, 0, 0, &[4; 3]);
    w.inject(x, open_frame(1, OperationKind::Write, &m2, false, (0, 1)));
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::RequestNumberInUse(1));
    assert_errored(&first, &v);
    // The second `Open` bound nothing: its operation is untouched, and
    // an honest writer on another connection still completes it.
    assert_eq!(second.outcome(), None);
    let (a, _) = w.pair(IN_BAND, IN_BAND);
    let src = w.op(vec![pattern(8, 10)], 1);
    w.start(a, OperationKind::Write, &src, &m2, false, (0, 1));
    w.run();
    assert_eq!(second.outcome(), Some(Outcome::Complete));
    assert_eq!(second.bytes(), src.bytes());
    w.assert_idle();
}

#[test]
fn hostile_passive_sends_an_open() {
    let mut w = World::new();
    let x = w.facing_script(Role::Active, IN_BAND);
    let meta = Meta {
        op_id: 1,
        token: Token::from_bytes([1; 16]),
        sizes: vec![8],
    };
    let dst = w.op(untouched(&[8]), 1);
    w.start(x, OperationKind::Read, &dst, &meta, false, (0, 1));
    w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 1)));
    w.run();
    let v = w.violation(x).expect("a violation");
    assert_eq!(v, Violation::OpenToActiveSide);
    assert_errored(&dst, &v);
    assert_eq!(dst.bytes(), untouched(&[8]));
    w.assert_idle();
}

#[test]
fn hostile_peer_authenticates_again_and_is_told() {
    for (secret, want) in [
        (true, Violation::UnexpectedAuth),
        (false, Violation::AuthWithoutSecret),
    ] {
        let mut w = World::new();
        let x = w.facing_script(Role::Passive, Caps { secret, ..IN_BAND });
        let (dst, meta) = w.expose(OperationKind::Write, untouched(&[8]));
        w.inject(x, open_frame(1, OperationKind::Write, &meta, false, (0, 1)));
        w.inject(
            x,
            Message::Auth(ferry_proto::wire::Auth {
                handshake: vec![0; 32],
            }),
        );
        w.run();
        assert_eq!(w.violation(x), Some(want.clone()));
        assert_errored(&dst, &want);
        let told = Message::Abort(Abort {
            req: 0,
            reason: AbortReason::Unauthenticated,
            detail: want.to_string(),
        });
        assert_eq!(w.sent(x), [told]);
        w.assert_idle();
    }
}

/// A violation on one connection fails its operations only: a transfer
/// on another connection between the same two sides completes.
#[test]
fn a_violation_ends_only_its_own_connection() {
    let mut w = World::new();
    let (a, _) = w.pair(IN_BAND, IN_BAND);
    let x = w.facing_script(Role::Passive, IN_BAND);
    let (hit, m1) = w.expose(OperationKind::Write, untouched(&[8]));
    let (dst, m2) = w.expose(OperationKind::Write, untouched(&SIZES));
    let src = w.op(patterns(&SIZES, 11), 1);
    w.start(a, OperationKind::Write, &src, &m2, false, (0, 1));
    w.inject(x, open_frame(3, OperationKind::Write, &m1, false, (0, 1)));
    w.inject_data(x, 3, 0, 1, &[1]);
    w.run();
    assert!(matches!(w.violation(x), Some(Violation::DataOutOfOrder(_))));
    assert!(matches!(hit.outcome(), Some(Outcome::Errored(_))));
    assert_eq!(src.outcome(), Some(Outcome::Complete));
    assert_eq!(dst.outcome(), Some(Outcome::Complete));
    assert_eq!(dst.bytes(), src.bytes());
    assert!(!w.conns[a].closed);
    w.assert_idle();
}
