//! Two `Session`s back to back, an active and a passive one, with the
//! small driver of `support/pair_world.rs` that moves frames between them
//! and runs their actions against memory in `Vec`s: every transfer path
//! (in band, lent, the fallback from a lease to `Data`, striped in three
//! parts) and a cancel in the middle. Every transfer checks the bytes that
//! landed against the source, byte for byte. Hostile peers are in
//! `tests/session_hostile.rs`.

#[path = "support/pair_world.rs"]
mod pair_world;

use ferry_proto::session::{Caps, Fence};
use ferry_proto::wire::AbortReason;
use ferry_proto::OperationKind;
use pair_world::*;

/// A READ or WRITE between one pair; returns the source's and the
/// destination's operations after the run.
fn transfer(kind: OperationKind, active: Caps, passive: Caps, pull: bool) -> (World, H, H) {
    let mut w = World::new();
    let (a, _) = w.pair(active, passive);
    let (src, dst) = match kind {
        OperationKind::Read => {
            let (src, meta) = w.expose(kind, patterns(&SIZES, 1));
            let dst = w.op(untouched(&SIZES), 1);
            w.start(a, kind, &dst, &meta, pull, (0, 1));
            (src, dst)
        }
        OperationKind::Write => {
            let (dst, meta) = w.expose(kind, untouched(&SIZES));
            let src = w.op(patterns(&SIZES, 2), 1);
            w.start(a, kind, &src, &meta, pull, (0, 1));
            (src, dst)
        }
    };
    w.run();
    assert_clean(&w);
    (w, src, dst)
}

fn assert_complete(w: &World, src: &H, dst: &H) {
    assert_eq!(
        src.outcome(),
        Some(Outcome::Complete),
        "source; log {:#?}",
        w.log
    );
    assert_eq!(
        dst.outcome(),
        Some(Outcome::Complete),
        "destination; log {:#?}",
        w.log
    );
    assert_eq!(dst.bytes(), src.bytes(), "the destination's bytes");
    assert!(src.is_sealed(), "the source sealed");
    w.assert_idle();
}

fn assert_clean(w: &World) {
    for c in &w.conns {
        assert_eq!(c.violation, None, "{}", c.name);
        assert!(!c.closed, "{}", c.name);
    }
}

// ---------------------------------------------------------------------------
// Every path.

#[test]
fn read_in_band() {
    let (w, src, dst) = transfer(OperationKind::Read, IN_BAND, IN_BAND, false);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![false], vec![false]));
    // In band even with attach set up, when not asked to pull.
    let (w, src, dst) = transfer(OperationKind::Read, ATTACH, ATTACH, false);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![false], vec![false]));
}

#[test]
fn write_in_band() {
    let (w, src, dst) = transfer(OperationKind::Write, IN_BAND, IN_BAND, false);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![false], vec![false]));
}

#[test]
fn pulled_read() {
    let (w, src, dst) = transfer(OperationKind::Read, ATTACH, ATTACH, true);
    assert_complete(&w, &src, &dst);
    // The passive side lent; the active side copied.
    assert_eq!((src.via(), dst.via()), (vec![true], vec![true]));
    assert_eq!(src.0.lends.get(), 0);
    assert!(
        w.log.iter().any(|l| l == "passive1 commit 1"),
        "{:?}",
        w.log
    );
    assert!(w.log.iter().any(|l| l == "active0 complete"), "{:?}", w.log);
}

#[test]
fn pulled_write() {
    let (w, src, dst) = transfer(OperationKind::Write, ATTACH, ATTACH, true);
    assert_complete(&w, &src, &dst);
    assert_eq!((src.via(), dst.via()), (vec![true], vec![true]));
    assert_eq!(src.0.lends.get(), 0);
    assert!(w.log.iter().any(|l| l == "active0 commit 1"), "{:?}", w.log);
    assert!(
        w.log.iter().any(|l| l == "passive1 complete"),
        "{:?}",
        w.log
    );
}

#[test]
fn a_read_that_asks_for_a_lease_falls_back_to_data() {
    // The passive side may not lend: the peer never proved it can copy.
    for passive in [
        Caps {
            peer_pulls: false,
            ..ATTACH
        },
        Caps {
            attach: false,
            ..ATTACH
        },
        IN_BAND,
    ] {
        let (w, src, dst) = transfer(OperationKind::Read, ATTACH, passive, true);
        assert_complete(&w, &src, &dst);
        assert_eq!(src.via(), [false], "{passive:?}");
        // Known at the active side with the first `Data`.
        assert_eq!(dst.via(), [false], "{passive:?}");
    }
}

// ---------------------------------------------------------------------------
// Striped: three parts over three connections.

/// A striped transfer of `kind` in three parts, each on a connection of
/// its own, the operations on both sides shared by their parts. Nothing
/// has run yet.
fn striped(kind: OperationKind) -> (World, H, H, [(usize, usize); 3]) {
    let sizes = [10usize, 3, 20];
    let mut w = World::new();
    let pairs = [
        w.pair(IN_BAND, IN_BAND),
        w.pair(IN_BAND, IN_BAND),
        w.pair(IN_BAND, IN_BAND),
    ];
    let (src, dst, meta, mine) = match kind {
        OperationKind::Read => {
            let (src, meta) = w.expose(kind, patterns(&sizes, 3));
            let dst = w.op(untouched(&sizes), 3);
            (src, dst.clone(), meta, dst)
        }
        OperationKind::Write => {
            let (dst, meta) = w.expose(kind, untouched(&sizes));
            let src = w.op(patterns(&sizes, 4), 3);
            (src.clone(), dst, meta, src)
        }
    };
    for (i, &(a, _)) in pairs.iter().enumerate() {
        w.start(a, kind, &mine, &meta, true, (i as u16, 3));
    }
    (w, src, dst, pairs)
}

fn events(w: &World, side: &str) -> Vec<String> {
    w.log
        .iter()
        .filter(|l| l.starts_with(side))
        .map(|l| l.split_once(' ').unwrap().1.to_string())
        .collect()
}

#[test]
fn striped_write_and_read_in_three_parts() {
    for kind in [OperationKind::Write, OperationKind::Read] {
        let (mut w, src, dst, _) = striped(kind);
        w.run();
        assert_clean(&w);
        assert_complete(&w, &src, &dst);
        // In band on every part, though a lease was asked for.
        assert_eq!(src.via(), [false; 3]);
        assert_eq!(dst.via(), [false; 3]);
        // On each side, two parts done, then part 0 ends the whole.
        let (committer, completer) = match kind {
            OperationKind::Write => ("passive", "active"),
            OperationKind::Read => ("active", "passive"),
        };
        assert_eq!(
            events(&w, committer),
            ["part done", "part done", "commit 1"],
            "{kind:?}: {:#?}",
            w.log
        );
        assert_eq!(
            events(&w, completer),
            ["part done", "part done", "complete"],
            "{kind:?}: {:#?}",
            w.log
        );
    }
}

/// Part 0 runs alone first: every byte of it arrives, but its sealing
/// `Finish` waits until the source's fence says every other part is
/// confirmed (`can_commit`); and the destination, were it sent early,
/// would refuse it (see the unit tests).
#[test]
fn part_zero_waits_for_the_other_parts() {
    for kind in [OperationKind::Write, OperationKind::Read] {
        let (mut w, src, dst, pairs) = striped(kind);
        let [(a0, p0), (a1, p1), (a2, p2)] = pairs;
        w.run_on(&[a0, p0]);
        // Part 0 of [10, 3, 20] is bytes [0, 11): all of them landed.
        let landed = dst.bytes();
        assert_eq!(landed[0], src.bytes()[0]);
        assert_eq!(landed[1][0], src.bytes()[1][0]);
        assert_eq!(&landed[1][1..], [UNTOUCHED; 2]);
        assert!(!src.can_commit() && !dst.can_commit());
        assert!(!src.is_sealed());
        assert_eq!((src.outcome(), dst.outcome()), (None, None));
        // The source waits with its `Finish`.
        let waiting = w.jobs.iter().filter(|j| [a0, p0].contains(&j.conn()));
        assert_eq!(waiting.count(), 1);

        w.run_on(&[a1, p1]);
        assert_eq!((src.stripe_done(), dst.stripe_done()), (1, 1));
        assert!(!src.can_commit() && !dst.can_commit());
        w.run_on(&[a0, p0]);
        assert_eq!((src.outcome(), dst.outcome()), (None, None));

        w.run_on(&[a2, p2]);
        assert!(src.can_commit() && dst.can_commit());
        assert_eq!((src.outcome(), dst.outcome()), (None, None));
        w.run_on(&[a0, p0]);
        assert_complete(&w, &src, &dst);
    }
}

// ---------------------------------------------------------------------------
// A cancel in the middle.

#[test]
fn a_cancel_in_the_middle_of_a_write() {
    let mut w = World::new();
    let (a, p) = w.pair(IN_BAND, IN_BAND);
    let sizes = [100usize];
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&sizes));
    let src = w.op(patterns(&sizes, 5), 1);
    let req = w.start(a, OperationKind::Write, &src, &meta, false, (0, 1));
    // A few turns: the `Open` and some `Data` are through.
    for _ in 0..4 {
        w.turn(&[a, p]);
    }
    assert!(dst.bytes()[0][..5] == src.bytes()[0][..5]);
    assert!(w.cancel(&src));
    assert_eq!(w.conns[a].s.pending(), 0);
    w.run();
    assert_eq!(src.outcome(), Some(Outcome::Cancelled));
    assert_eq!(
        dst.outcome(),
        Some(Outcome::Aborted(AbortReason::Cancelled))
    );
    assert!(!dst.is_sealed());
    // What landed is a prefix of the source; nothing after it.
    let got = &dst.bytes()[0];
    let n = got.iter().position(|&b| b == UNTOUCHED).unwrap();
    assert!((5..100).contains(&n), "{n}");
    assert_eq!(got[..n], src.bytes()[0][..n]);
    assert!(got[n..].iter().all(|&b| b == UNTOUCHED));
    w.assert_idle();
    assert!(w
        .log
        .contains(&"passive1 remote abort Cancelled".to_string()));
    let _ = req;
}

#[test]
fn a_cancel_in_the_middle_of_a_read() {
    let mut w = World::new();
    let (a, p) = w.pair(IN_BAND, IN_BAND);
    let sizes = [100usize];
    let (src, meta) = w.expose(OperationKind::Read, patterns(&sizes, 6));
    let dst = w.op(untouched(&sizes), 1);
    w.start(a, OperationKind::Read, &dst, &meta, false, (0, 1));
    for _ in 0..5 {
        w.turn(&[a, p]);
    }
    assert!(w.cancel(&dst));
    w.run();
    assert_eq!(dst.outcome(), Some(Outcome::Cancelled));
    assert_eq!(
        src.outcome(),
        Some(Outcome::Aborted(AbortReason::Cancelled))
    );
    // `Data` already on its way to the active side is dropped there.
    assert!(w.conns[a].discarded > 0);
    let got = &dst.bytes()[0];
    let n = got.iter().position(|&b| b == UNTOUCHED).unwrap();
    assert_eq!(got[..n], src.bytes()[0][..n]);
    w.assert_idle();
}

#[test]
fn a_cancel_of_a_pulled_read_gives_the_lent_memory_back() {
    // Before the lease arrives, and after (before the copy runs).
    for lease_first in [false, true] {
        let mut w = World::new();
        let (a, p) = w.pair(ATTACH, ATTACH);
        let (src, meta) = w.expose(OperationKind::Read, patterns(&SIZES, 7));
        let dst = w.op(untouched(&SIZES), 1);
        w.start(a, OperationKind::Read, &dst, &meta, true, (0, 1));
        w.deliver(p);
        assert_eq!(src.0.lends.get(), 1);
        if lease_first {
            w.deliver(a);
            assert_eq!(dst.via(), [true]);
            assert_eq!(w.jobs.len(), 1, "the copy waits");
        }
        assert!(w.cancel(&dst));
        w.run();
        assert_eq!(dst.outcome(), Some(Outcome::Cancelled));
        assert_eq!(
            src.outcome(),
            Some(Outcome::Aborted(AbortReason::Cancelled))
        );
        assert_eq!(dst.bytes(), untouched(&SIZES));
        assert_eq!(src.0.lends.get(), 0);
        w.assert_idle();
    }
}

/// The passive side withdraws a READ it lent while the active side is
/// about to copy it: the copy that starts before the `Abort` arrives must
/// still find the memory lent (the `Release` that answers the `Abort`, or
/// the copy's own `Finish`, gives it back). See the unit test
/// `a_forgotten_lease_stays_lent_until_the_peer_stops_copying`.
#[test]
fn a_withdrawn_lease_stays_lent_while_the_peer_copies() {
    let mut w = World::new();
    let (a, p) = w.pair(ATTACH, ATTACH);
    let (src, meta) = w.expose(OperationKind::Read, patterns(&SIZES, 12));
    let dst = w.op(untouched(&SIZES), 1);
    w.start(a, OperationKind::Read, &dst, &meta, true, (0, 1));
    w.deliver(p);
    w.deliver(a);
    assert!(w.cancel(&src));
    assert_eq!(src.0.lends.get(), 1, "given back while the peer may copy");
    // The copy runs before the `Abort` arrives.
    w.job(a);
    w.run();
    assert_eq!(src.outcome(), Some(Outcome::Cancelled));
    assert_eq!(
        dst.outcome(),
        Some(Outcome::Aborted(AbortReason::Cancelled))
    );
    assert_eq!(src.0.lends.get(), 0);
    w.assert_idle();
}

#[test]
fn a_cancel_after_the_seal_changes_nothing() {
    let mut w = World::new();
    let (a, _) = w.pair(IN_BAND, IN_BAND);
    let (dst, meta) = w.expose(OperationKind::Write, untouched(&SIZES));
    let src = w.op(patterns(&SIZES, 8), 1);
    w.start(a, OperationKind::Write, &src, &meta, false, (0, 1));
    // Only the writer's stream runs: every byte and the `Finish` sent.
    w.run_on(&[a]);
    assert!(src.is_sealed());
    assert!(!w.cancel(&src));
    w.run();
    assert_complete(&w, &src, &dst);
}
