//! What the end of a connection ends: not a done part of a sealed
//! operation, whose outcome comes on part 0's connection.

use super::*;

/// An active WRITE striped over two parts: part 1, sent and confirmed.
fn confirmed_part(s: &mut Session<F>) -> F {
    let f = F::new();
    let (req, _) = s.open(
        params(OperationKind::Write, &[10], false, (1, 2)),
        f.clone(),
    );
    take(s);
    s.part_sent(req);
    done(s.handle_frame(finish(req)));
    assert_eq!(all_about(s, &f), ["PartDone"]);
    f
}

#[test]
fn the_end_of_a_done_parts_connection_leaves_a_sealed_operation_alone() {
    // Part 0 sealed the operation: the peer decides, on part 0's
    // connection. This one's end (the peer exited right after it
    // confirmed) must not fail it.
    let mut s = active(NO_CAPS);
    let f = confirmed_part(&mut s);
    f.seal();
    let (reqs, lent) = s.drain();
    assert!(reqs.is_empty() && lent.is_empty());
    assert_eq!(s.pending(), 0);

    // Not sealed yet: the end of any of its connections ends it.
    let mut s = active(NO_CAPS);
    let f = confirmed_part(&mut s);
    let (reqs, _) = s.drain();
    assert_eq!(reqs.len(), 1);
    assert!(reqs[0].is(&f));
}

#[test]
fn the_end_of_part_zeros_connection_or_an_unfinished_parts_always_ends_it() {
    // Part 0, sealed: its confirmation comes on this connection, or never.
    let mut s = active(NO_CAPS);
    let f = F::new();
    s.open(
        params(OperationKind::Write, &[10], false, (0, 2)),
        f.clone(),
    );
    take(&mut s);
    f.seal();
    assert_eq!(s.drain().0.len(), 1);

    // A part not yet confirmed, even of a sealed operation.
    let mut s = active(NO_CAPS);
    let f = F::new();
    s.open(
        params(OperationKind::Write, &[10], false, (1, 2)),
        f.clone(),
    );
    take(&mut s);
    f.seal();
    assert_eq!(s.drain().0.len(), 1);
}

#[test]
fn a_destinations_landed_part_of_a_sealed_operation_is_left_alone() {
    // The passive destination of a striped WRITE: part 1 landed and was
    // confirmed; part 0 committed (sealed) on another connection.
    let mut s = passive(NO_CAPS);
    let f = bind(&mut s, &part(open(1, OperationKind::Write, &[10]), 1, 2));
    lands(&mut s, data(1, 0, 5, 5), &f);
    take(&mut s);
    done(s.handle_frame(finish(1)));
    assert_eq!(all_about(&mut s, &f), ["PartDone", "Send Finish 1 (reply)"]);
    f.seal();
    assert!(s.drain().0.is_empty());
}
