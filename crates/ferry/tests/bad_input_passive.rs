//! Bad input, the other direction (see `bad_input.rs`): a hostile passive
//! side. The test listens where forged metadata points, answers the active
//! connector's hello, and sends it bad frames; the active operation fails
//! with the right error, memory outside the grant is untouched, and the
//! active connector's other operations go on.

use ferry::{Error, OperationKind, OperationStatus, PeerMisbehaved, Violation};
use ferry_proto::wire::{Message, Open};
use ferry_proto::Token;

mod support;

use support::*;

async fn hostile_reply_to_a_read(reply: impl FnOnce(u64) -> Vec<u8>, landed: usize) {
    let reader = connector().await;
    let (l, meta) = fake_passive(OperationKind::Read, &[32, 16]).await;
    let (op, (mut raw, open)) = tokio::join!(
        reader.begin_read(&meta, vec![untouched(32), untouched(16)]),
        accept_active(&l, FAKE_WORKER)
    );
    let op = op.unwrap();
    let req = open.unwrap().req;
    let _ = raw.send_raw(&reply(req)).await;
    let _ = raw.closed().await;
    let err = within(op.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    assert_eq!(op.status(), OperationStatus::Errored);
    let got = op.into_descriptors();
    let s = got[0].as_slice().unwrap();
    assert!(s[..landed].iter().all(|&b| b == 1), "{s:?}");
    assert!(s[landed..].iter().all(|&b| b == UNTOUCHED), "{s:?}");
    assert_all(&got[1], UNTOUCHED, "descriptor 1");
    active_side_still_works(&reader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_past_the_end_of_a_read_is_refused() {
    // 32 + 16 bytes: a frame may run on into descriptor 1, not past it.
    hostile_reply_to_a_read(|req| data_frame(req, 0, 0, &[1u8; 49]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_with_overflowing_offset_is_refused() {
    hostile_reply_to_a_read(|req| data_frame(req, 0, u64::MAX - 3, &[1u8; 8]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_with_a_gap_is_refused() {
    hostile_reply_to_a_read(
        |req| {
            let mut f = data_frame(req, 0, 0, &[1u8; 8]);
            f.extend(data_frame(req, 1, 0, &[1u8; 8]));
            f
        },
        8,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_finish_before_all_data_is_refused() {
    hostile_reply_to_a_read(
        |req| {
            let mut f = data_frame(req, 0, 0, &[1u8; 32]);
            f.extend(Message::Finish { req }.to_vec());
            f
        },
        32,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_open_sent_to_the_active_side_is_refused() {
    hostile_reply_to_a_read(
        |req| {
            Message::Open(Open {
                req,
                op_id: 1,
                token: Token::from_bytes([7; 16]),
                kind: OperationKind::Write,
                sizes: vec![32, 16].into(),
                pull: false,
                part: 0,
                parts: 1,
            })
            .to_vec()
        },
        0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_into_a_write_is_refused() {
    let writer = connector().await;
    let (l, meta) = fake_passive(OperationKind::Write, &[32]).await;
    let (op, (mut raw, open)) = tokio::join!(
        writer.begin_write(vec![pattern(1, 32).into()], &meta),
        accept_active(&l, FAKE_WORKER)
    );
    let op = op.unwrap();
    let req = open.unwrap().req;
    let _ = raw.send_raw(&data_frame(req, 0, 0, &[1u8; 32])).await;
    for m in raw.closed().await {
        assert!(
            matches!(m, Message::Data(_) | Message::Finish { .. }),
            "{m:?}"
        );
    }
    let err = within(op.wait_for_completion()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Protocol {
                violation: PeerMisbehaved::Session(Violation::UnexpectedData { req: r }),
                ..
            } if r == req
        ),
        "{err:?}"
    );
    assert_eq!(
        op.into_descriptors()[0].as_slice().unwrap(),
        &pattern(1, 32)[..],
        "a write's source is never written"
    );
    active_side_still_works(&writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_answering_as_another_worker_is_refused() {
    let reader = connector().await;
    let (l, meta) = fake_passive(OperationKind::Read, &[32]).await;
    let (op, _raw) = tokio::join!(
        reader.begin_read(&meta, vec![untouched(32)]),
        accept_active(&l, "someone-else")
    );
    let err = op.unwrap_err();
    assert!(
        matches!(err, Error::WrongWorker { ref found, .. } if found == "someone-else"),
        "{err}"
    );
    active_side_still_works(&reader).await;
}

/// The WRITE-side twin of `read_confirmation_before_all_data_is_refused`:
/// the passive side confirms a write before the writer has sent its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_write_confirmation_before_all_data_is_refused() {
    let writer = connector().await;
    let (l, meta) = fake_passive(OperationKind::Write, &[8 << 20]).await;
    let (op, (mut raw, open)) = tokio::join!(
        writer.begin_write(vec![vec![0x11u8; 8 << 20].into()], &meta),
        accept_active(&l, FAKE_WORKER)
    );
    let op = op.unwrap();
    let req = open.unwrap().req;
    // Confirm at once, having read at most the first chunk of 8 MiB.
    raw.send(&Message::Finish { req }).await;
    let outcome = within(op.wait_for_completion()).await;
    assert!(
        matches!(
            outcome,
            Err(Error::Protocol {
                violation: PeerMisbehaved::Session(Violation::FinishBeforeAllData { req: r }),
                ..
            }) if r == req
        ),
        "the write ended with {outcome:?} ({})",
        op.status()
    );
    drop(raw);
    active_side_still_works(&writer).await;
}
