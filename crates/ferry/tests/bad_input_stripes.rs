//! Bad input on striped transfers (see `bad_input.rs`): the parts of one
//! operation on several connections, played by a hostile peer on either
//! side — parts out of their range, committed early, bound twice or by
//! another worker, finished before their bytes, a stream dropped.

use ferry::{AbortReason, Error, OperationKind, OperationStatus};
use ferry_proto::wire::{Abort, Message};

mod support;

use support::*;

/// A WRITE of 10 bytes in two parts ([0, 5) and [5, 10)) on two connections:
/// each part lands in its range only, the second is confirmed on its own
/// connection, and the commit on the first completes the whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striped_parts_land_in_their_ranges_and_commit_on_the_first() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.send(&part_open(7, &m, OperationKind::Write, 1, 2)).await;
    b.send_raw(&data_frame(7, 0, 5, &[2u8; 5])).await.unwrap();
    b.send(&Message::Finish { req: 7 }).await;
    match b.next().await {
        Some((Message::Finish { req: 7 }, _)) => {}
        other => panic!("expected part 1 to be confirmed, got {other:?}"),
    }
    assert_eq!(w.status(), OperationStatus::InProgress);
    a.send_raw(&data_frame(1, 0, 0, &[1u8; 5])).await.unwrap();
    a.send(&Message::Finish { req: 1 }).await;
    match a.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    assert_eq!(
        w.into_descriptors()[0].as_slice().unwrap(),
        &[1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    );
    assert_eq!(target.pending_count(), 0);
    legit_transfers_still_work(&target).await;
}

/// Bytes of another part's range, and a commit before every other part is
/// confirmed, break the protocol: the connection closes, the operation
/// fails, and bytes outside the part's range are never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_writing_outside_its_range_or_committing_early_is_refused() {
    for early_commit in [false, true] {
        let target = connector().await;
        let w = target.create_writable(vec![untouched(10)]).await.unwrap();
        let m = w.metadata().clone();
        let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
        a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
        b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
        b.barrier(2).await;
        if early_commit {
            a.send_raw(&data_frame(1, 0, 0, &[1u8; 5])).await.unwrap();
            let _ = a.send_raw(&Message::Finish { req: 1 }.to_vec()).await;
        } else {
            // Part 0 writes into part 1's range.
            let _ = a.send_raw(&data_frame(1, 0, 5, &[1u8; 5])).await;
        }
        // Closed, after at most the abort of the request that broke it.
        let got = a.closed().await;
        assert!(
            got.iter()
                .all(|m| matches!(m, Message::Abort(x) if x.req == 1)),
            "{got:?}"
        );
        expect_errored_protocol(&w).await;
        let d = w.into_descriptors();
        assert_all(
            &d[0].as_slice().unwrap()[5..].to_vec().into(),
            UNTOUCHED,
            "part 1's range",
        );
        // The other part's request ended with the operation.
        match b.next().await {
            Some((Message::Abort(x), _)) => {
                assert_eq!((x.req, x.reason), (1, AbortReason::PartFailed), "{x:?}")
            }
            other => panic!("expected part 1 to be aborted, got {other:?}"),
        }
        assert_eq!(target.pending_count(), 0);
        legit_transfers_still_work(&target).await;
    }
}

/// A part may be bound once, by the worker that bound the others, with the
/// same number of parts; anything else is `Busy` and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_bound_twice_or_by_another_worker_is_busy() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let mut a = Raw::connect(&target).await;
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    a.barrier(2).await;
    let mut b = Raw::connect(&target).await;
    b.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.expect_abort(1, AbortReason::Busy).await;
    b.send(&part_open(2, &m, OperationKind::Write, 1, 3)).await;
    b.expect_abort(2, AbortReason::Busy).await;
    b.send(&open_frame(3, &m, OperationKind::Write)).await;
    b.expect_abort(3, AbortReason::Busy).await;
    let mut other = Raw::connect_as(&target, "another-worker").await;
    other
        .send(&part_open(1, &m, OperationKind::Write, 1, 2))
        .await;
    other.expect_abort(1, AbortReason::Busy).await;
    // The rightful sender completes it.
    b.send(&part_open(4, &m, OperationKind::Write, 1, 2)).await;
    b.send_raw(&data_frame(4, 0, 5, &[2u8; 5])).await.unwrap();
    b.send(&Message::Finish { req: 4 }).await;
    assert!(matches!(
        b.next().await,
        Some((Message::Finish { req: 4 }, _))
    ));
    a.send_raw(&data_frame(1, 0, 0, &[1u8; 5])).await.unwrap();
    a.send(&Message::Finish { req: 1 }).await;
    assert!(matches!(
        a.next().await,
        Some((Message::Finish { req: 1 }, _))
    ));
    within(w.wait_for_completion()).await.unwrap();
    assert_eq!(
        w.into_descriptors()[0].as_slice().unwrap(),
        &[1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    );
    legit_transfers_still_work(&target).await;
}

/// When one stream of a striped transfer is lost, the operation fails and
/// the requests of the other parts are ended and told (`PartFailed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_stream_fails_the_transfer_and_aborts_the_other_parts() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
    b.send_raw(&data_frame(1, 0, 5, &[2u8; 3])).await.unwrap();
    b.barrier(2).await;
    drop(b);
    let err = within(w.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    let detail = a.expect_abort(1, AbortReason::PartFailed).await;
    assert!(detail.contains("connection"), "{detail}");
    assert_eq!(target.pending_count(), 0);
    assert_eq!(target.exposed_count(), 0);
    legit_transfers_still_work(&target).await;
}

/// The active side: when the passive side drops one stream of a striped
/// READ, the READ fails, and the other part is aborted on its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_read_fails_when_the_passive_drops_one_stream() {
    let reader = striped_connector(2).await;
    let (l, meta) = fake_passive(OperationKind::Read, &[64]).await;
    // The reader connects both streams before it sends either `Open`.
    let hello = || accept_hello(&l);
    let (op, (mut first, mut second)) =
        tokio::join!(reader.begin_read(&meta, vec![untouched(64)]), async {
            (hello().await, hello().await)
        });
    let op = op.unwrap();
    let (open0, open1) = (
        expect_open(&mut first).await,
        expect_open(&mut second).await,
    );
    assert_eq!(
        (open0.part, open0.parts, open1.part, open1.parts),
        (0, 2, 1, 2)
    );
    // Half of part 1, then the stream is gone.
    second
        .send_raw(&data_frame(open1.req, 0, 32, &[5u8; 16]))
        .await
        .unwrap();
    drop(second);
    let err = within(op.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    let detail = first.expect_abort(open0.req, AbortReason::PartFailed).await;
    assert!(detail.contains("connection"), "{detail}");
    assert_eq!(reader.pending_count(), 0);
    let _ = op.into_descriptors();
    active_side_still_works(&reader).await;
}

/// A part that has landed and been confirmed still belongs to the
/// operation until it ends: an `Abort` on it, or its connection lost, ends
/// the operation (it would otherwise stay in progress, exposed, forever,
/// since part 0 never arrives); a replayed `Finish` changes nothing, and
/// its request number stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_part_still_carries_an_abort_or_a_lost_connection() {
    for abort in [true, false] {
        let target = connector().await;
        let w = target.create_writable(vec![untouched(10)]).await.unwrap();
        let m = w.metadata().clone();
        let mut b = Raw::connect(&target).await;
        b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
        b.send_raw(&data_frame(1, 0, 5, &[2u8; 5])).await.unwrap();
        b.send(&Message::Finish { req: 1 }).await;
        assert!(matches!(
            b.next().await,
            Some((Message::Finish { req: 1 }, _))
        ));
        b.send(&Message::Finish { req: 1 }).await;
        b.barrier(2).await;
        assert_eq!(w.status(), OperationStatus::InProgress);
        if abort {
            b.send(&Message::Abort(Abort {
                req: 1,
                reason: AbortReason::PartFailed,
                detail: "the other stream died".into(),
            }))
            .await;
        } else {
            drop(b);
        }
        let err = within(w.wait_for_completion()).await.unwrap_err();
        assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
        assert_eq!(w.status(), OperationStatus::Errored);
        assert_eq!(target.exposed_count(), 0);
        assert_eq!(target.pending_count(), 0);
        legit_transfers_still_work(&target).await;
    }
    // The request number of a confirmed part stays taken.
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let mut b = Raw::connect(&target).await;
    b.send(&part_open(1, w.metadata(), OperationKind::Write, 1, 2))
        .await;
    b.send_raw(&data_frame(1, 0, 5, &[2u8; 5])).await.unwrap();
    b.send(&Message::Finish { req: 1 }).await;
    assert!(matches!(
        b.next().await,
        Some((Message::Finish { req: 1 }, _))
    ));
    b.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    let got = b.closed().await;
    assert!(
        got.iter().all(|m| matches!(m, Message::Abort(_))),
        "{got:?}"
    );
    assert_eq!(w.status(), OperationStatus::Errored);
}

/// A hostile destination confirms a part of a striped WRITE before the
/// writer has sent all of it: the writer refuses that (the commit would
/// otherwise follow unsent bytes) and the WRITE fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_confirmed_before_it_was_sent_is_refused() {
    let writer = striped_connector(2).await;
    let (l, meta) = fake_passive(OperationKind::Write, &[32 << 20]).await;
    let hello = || accept_hello(&l);
    let (op, (_first, mut second)) = tokio::join!(
        writer.begin_write(vec![vec![0x22u8; 32 << 20].into()], &meta),
        async { (hello().await, hello().await) }
    );
    let op = op.unwrap();
    let open1 = expect_open(&mut second).await;
    assert_eq!((open1.part, open1.parts), (1, 2));
    // 16 MiB are on their way and this side reads none of them: confirm now.
    second.send(&Message::Finish { req: open1.req }).await;
    let outcome = within(op.wait_for_completion()).await;
    assert!(
        matches!(outcome, Err(Error::Protocol { .. })),
        "the write ended with {outcome:?}"
    );
    drop(second);
    active_side_still_works(&writer).await;
}

/// The parts of a striped transfer travel on independent connections, so a
/// part's `Open` may arrive after the owner cancelled: it is told what the
/// bound parts were told (`Cancelled`), not just "ended", so that the
/// remote reads a cancel whichever part it hears of first. A striped
/// operation cancelled before any part was bound is simply "ended".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_arriving_after_a_cancel_is_told_of_the_cancel() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
    b.barrier(2).await;
    w.cancel();
    b.expect_abort(1, AbortReason::Cancelled).await;
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    a.expect_abort(1, AbortReason::Cancelled).await;

    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    w.cancel();
    a.send(&part_open(2, &m, OperationKind::Write, 0, 2)).await;
    a.expect_abort(2, AbortReason::OperationEnded).await;
    legit_transfers_still_work(&target).await;
}

/// A part other than 0 of a striped WRITE that claims to be finished before
/// its bytes arrived is a violation that ends the operation (it once
/// deadlocked the reader: the violation took the table it still held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_finished_before_its_bytes_ends_the_operation() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.send(&part_open(7, &m, OperationKind::Write, 1, 2)).await;
    b.send(&Message::Finish { req: 7 }).await;
    let detail = b.expect_abort(7, AbortReason::PartFailed).await;
    assert!(detail.contains("finish before all data"), "{detail}");
    b.expect_closed().await;
    let r = within(w.wait_for_completion()).await;
    assert!(r.is_err(), "{r:?}");
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "the writable");
    legit_transfers_still_work(&target).await;
    assert_no_library_panic();
}
