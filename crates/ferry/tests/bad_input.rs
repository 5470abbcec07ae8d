//! Bad input on a real TCP connection to a connector's listener: bytes
//! before the hello, broken framing, data the capability does not cover,
//! and tokens that are wrong, ended or for another shape.
//!
//! Each test plays a hostile or broken peer: it opens a plain `TcpStream` to
//! the listener and speaks raw bytes or hand-made `ferry_proto::wire` frames,
//! with tokens and operation ids taken from real metadata. Every test then
//! checks that the connection was answered with the right `Abort` or closed,
//! that nothing in the library panicked, that exposed memory outside what the
//! capability grants is untouched, that the attacked operation is in the
//! state it should be, and that a separate legitimate transfer on the same
//! connector still completes.
//!
//! The same hostile peer (in `support/`) also replays and floods
//! (`bad_input_replays.rs`), plays a hostile passive side
//! (`bad_input_passive.rs`) and sends the parts of striped transfers
//! (`bad_input_stripes.rs`).

use std::time::Duration;

use ferry::{AbortReason, Error, OperationKind, OperationStatus, PeerMisbehaved, Violation};
use ferry_proto::wire::{
    self, Abort, Data, Hello, Message, Open, MAX_BODY, MAX_CHUNK, PROTOCOL_VERSION,
};
use ferry_proto::Token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

mod support;

use support::*;

// ---------------------------------------------------------------------------
// Before the hello.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_on_the_listener_port_are_dropped() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let meta = w.metadata().clone();
    let mut bad_magic = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "x".into(),
    })
    .to_vec();
    bad_magic[wire::HEADER_LEN] = b'X';
    let mut bad_utf8 = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "ab".into(),
    })
    .to_vec();
    let n = bad_utf8.len();
    bad_utf8[n - 1] = 0xff;
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        (
            "http request",
            b"GET / HTTP/1.1\r\nHost: ferry\r\n\r\n".to_vec(),
        ),
        ("random bytes", noise(4096, 7)),
        ("zeros", vec![0u8; 64]),
        ("hello with bad magic", bad_magic),
        ("hello with invalid utf-8 worker id", bad_utf8),
        (
            "hello of another protocol version",
            Message::Hello(Hello {
                version: PROTOCOL_VERSION + 1,
                worker_id: "x".into(),
            })
            .to_vec(),
        ),
        (
            // A valid Open with the real token, but no hello first.
            "open before hello",
            open_frame(1, &meta, OperationKind::Write).to_vec(),
        ),
    ];
    for (what, bytes) in inputs {
        let mut raw = Raw::connect_bare(target.local_addr()).await;
        let _ = raw.send_raw(&bytes).await;
        let got = raw.closed().await;
        assert!(
            got.is_empty(),
            "{what}: no hello may come back, got {got:?}"
        );
    }
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    legit_transfers_still_work(&target).await;
}

/// A connection that says nothing, or half a hello, is dropped after the
/// 10 s hello timeout (virtual time: the test runs in milliseconds).
#[tokio::test(start_paused = true)]
async fn silent_connection_is_dropped_after_the_hello_timeout() {
    let target = connector().await;
    for prefix in [&[][..], &[1u8, 0, 0][..]] {
        let mut raw = Raw::connect_bare(target.local_addr()).await;
        raw.send_raw(prefix).await.unwrap();
        let start = tokio::time::Instant::now();
        let mut tmp = [0u8; 16];
        let r = timeout(Duration::from_secs(60), raw.s.read(&mut tmp))
            .await
            .expect("the connector drops a silent connection");
        assert!(
            matches!(r, Ok(0)) || r.as_ref().is_err_and(is_closed),
            "{r:?}"
        );
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
            "dropped after {waited:?}"
        );
    }
    tokio::time::resume();
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Framing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_the_hello_closes_the_connection() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", noise(1000, 99)),
        ("unknown frame type", header(9, 0)),
        ("frame type zero", header(0, 8)),
        ("reserved header bytes set", vec![4, 1, 0, 0, 8, 0, 0, 0]),
        (
            "a second hello",
            Message::Hello(Hello {
                version: PROTOCOL_VERSION,
                worker_id: "again".into(),
            })
            .to_vec(),
        ),
        ("finish with a trailing byte", {
            let mut v = header(4, 9);
            v.extend_from_slice(&[0; 9]);
            v
        }),
        ("open with zero descriptors", {
            let mut body = vec![0u8; 8 + 8 + 16];
            body.push(2);
            body.extend_from_slice(&0u32.to_le_bytes());
            let mut v = header(2, body.len() as u32);
            v.extend_from_slice(&body);
            v
        }),
        ("open with kind 3", {
            let mut body = vec![0u8; 8 + 8 + 16];
            body.push(3);
            body.extend_from_slice(&1u32.to_le_bytes());
            body.extend_from_slice(&64u64.to_le_bytes());
            let mut v = header(2, body.len() as u32);
            v.extend_from_slice(&body);
            v
        }),
    ];
    for (what, bytes) in inputs {
        let mut raw = Raw::connect(&target).await;
        let _ = raw.send_raw(&bytes).await;
        let got = raw.closed().await;
        assert!(
            got.is_empty(),
            "{what}: expected a plain close, got {got:?}"
        );
    }
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_body_length_closes_the_connection_at_once() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    for ty in 1..=5u8 {
        for len in [u32::MAX, MAX_BODY + 1, 1 << 31] {
            // After the hello, and in place of the hello.
            let mut raw = Raw::connect(&target).await;
            let _ = raw.send_raw(&header(ty, len)).await;
            raw.expect_closed().await;
            let mut raw = Raw::connect_bare(target.local_addr()).await;
            let _ = raw.send_raw(&header(ty, len)).await;
            raw.expect_closed().await;
        }
    }
    // A Data frame may announce at most MAX_CHUNK payload bytes.
    let mut raw = Raw::connect(&target).await;
    let _ = raw
        .send_raw(
            &Message::Data(Data {
                req: 1,
                desc: 0,
                offset: 0,
                len: MAX_CHUNK + 1,
            })
            .to_vec(),
        )
        .await;
    raw.expect_closed().await;
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frame_then_close() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let meta = w.metadata().clone();

    // Half a header, half an Open (with the real token), and a header that
    // announces more body than ever comes: then the write side is closed.
    let open = open_frame(1, &meta, OperationKind::Write).to_vec();
    let mut long = header(2, MAX_BODY);
    long.extend_from_slice(&[0; 100]);
    for bytes in [vec![2u8, 0, 0], open[..open.len() / 2].to_vec(), long] {
        let mut raw = Raw::connect(&target).await;
        raw.send_raw(&bytes).await.unwrap();
        raw.s.shutdown().await.unwrap();
        raw.expect_closed().await;
    }
    assert_eq!(w.status(), OperationStatus::Initialized, "never opened");

    // An opened WRITE whose Data payload stops half-way: the bytes that
    // came lie inside the grant; the operation fails; nothing else changes.
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, &meta, OperationKind::Write)).await;
    let mut d = Message::Data(Data {
        req: 1,
        desc: 0,
        offset: 0,
        len: 64,
    })
    .to_vec();
    d.extend_from_slice(&[1u8; 20]);
    raw.send_raw(&d).await.unwrap();
    raw.s.shutdown().await.unwrap();
    raw.expect_closed().await;
    let err = within(w.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert_eq!(w.status(), OperationStatus::Errored);
    assert_eq!(target.exposed_count(), 0);
    let got = w.into_descriptors();
    let s = got[0].as_slice().unwrap();
    assert!(s[..20].iter().all(|&b| b == 1), "{s:?}");
    assert!(s[20..].iter().all(|&b| b == UNTOUCHED), "{s:?}");
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Data that the capability does not cover.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_a_request_never_opened_is_skipped() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let w2 = target.create_writable(vec![untouched(100)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    // Data for requests that were never opened (or were aborted): the
    // payload is read and thrown away, whatever its header says.
    let mut bytes = data_frame(77, 0, 0, &[1u8; 1000]);
    bytes.extend(data_frame(78, u32::MAX, u64::MAX, &vec![2u8; 1 << 20]));
    bytes.extend(Message::Finish { req: 77 }.to_vec());
    bytes.extend(
        Message::Abort(Abort {
            req: 79,
            reason: AbortReason::Cancelled,
            detail: String::new(),
        })
        .to_vec(),
    );
    raw.send_raw(&bytes).await.unwrap();
    // The stream is still in step: a proper WRITE on the same connection works.
    raw.send(&open_frame(1, w2.metadata(), OperationKind::Write))
        .await;
    raw.send_raw(&data_frame(1, 0, 0, &[5u8; 100]))
        .await
        .unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    match raw.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w2.wait_for_completion()).await.unwrap();
    assert_all(&w2.into_descriptors()[0], 5, "written buffer");
    assert_eq!(w.status(), OperationStatus::Initialized);
    raw.expect_quiet(Duration::from_millis(50)).await;
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "other exposed buffer");
    legit_transfers_still_work(&target).await;
}

/// Opens a WRITE of the writable [32, 16] with the real token, sends
/// `frames`, and checks that the connector closes the connection, errors the
/// operation, and that only the first `landed` bytes of descriptor 0 changed
/// (to 1).
async fn bad_data_case(frames: Vec<u8>, landed: usize) {
    let target = connector().await;
    let w = target
        .create_writable(vec![untouched(32), untouched(16)])
        .await
        .unwrap();
    let bystander = target.create_writable(vec![untouched(32)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    let _ = raw.send_raw(&frames).await;
    raw.expect_closed().await;
    expect_errored_protocol(&w).await;
    assert_eq!(target.exposed_count(), 1, "only the bystander is left");
    let got = w.into_descriptors();
    let s = got[0].as_slice().unwrap();
    assert!(s[..landed].iter().all(|&b| b == 1), "{s:?}");
    assert!(s[landed..].iter().all(|&b| b == UNTOUCHED), "{s:?}");
    assert_all(&got[1], UNTOUCHED, "descriptor 1");
    assert_eq!(bystander.status(), OperationStatus::Initialized);
    holder_can_still_write(bystander).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_past_the_end_of_the_last_descriptor_is_refused() {
    // 32 + 16 bytes in all: a frame may run from one into the next
    // (protocol 7), never past the last.
    bad_data_case(data_frame(1, 0, 0, &[1u8; 49]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_data_frame_may_span_descriptors() {
    let target = connector().await;
    let w = target
        .create_writable(vec![
            untouched(32),
            untouched(0),
            untouched(16),
            untouched(8),
        ])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    let bytes: Vec<u8> = (0..56u8).collect();
    // 20 bytes of descriptor 0, then one frame over the rest of it, the
    // empty one, all of descriptor 2 and half of descriptor 3, then the
    // last 4 bytes.
    let mut f = data_frame(1, 0, 0, &bytes[..20]);
    f.extend(data_frame(1, 0, 20, &bytes[20..52]));
    f.extend(data_frame(1, 3, 4, &bytes[52..]));
    raw.send_raw(&f).await.unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    match raw.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    let got = w.into_descriptors();
    assert_eq!(got[0].as_slice().unwrap(), &bytes[..32]);
    assert_eq!(got[1].size(), 0);
    assert_eq!(got[2].as_slice().unwrap(), &bytes[32..48]);
    assert_eq!(got[3].as_slice().unwrap(), &bytes[48..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spanning_frame_that_starts_in_the_wrong_place_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 8]);
    // Where descriptor 0 stands is offset 8: a span from 16 leaves a gap.
    f.extend(data_frame(1, 0, 16, &[1u8; 24]));
    bad_data_case(f, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_at_an_offset_past_the_end_is_refused() {
    bad_data_case(data_frame(1, 0, 32, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_whose_offset_plus_length_overflows_is_refused() {
    bad_data_case(data_frame(1, 0, u64::MAX - 7, &[1u8; 16]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_at_offset_u64_max_is_refused() {
    bad_data_case(data_frame(1, 0, u64::MAX, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_a_descriptor_that_does_not_exist_is_refused() {
    bad_data_case(data_frame(1, 2, 0, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_descriptor_u32_max_is_refused() {
    bad_data_case(data_frame(1, u32::MAX, 0, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_with_a_gap_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 8]);
    f.extend(data_frame(1, 0, 16, &[1u8; 8]));
    bad_data_case(f, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_going_back_over_written_bytes_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 8]);
    f.extend(data_frame(1, 0, 4, &[1u8; 8]));
    bad_data_case(f, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_jumping_to_the_next_descriptor_early_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 8]);
    f.extend(data_frame(1, 1, 0, &[1u8; 8]));
    bad_data_case(f, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_of_length_zero_is_refused() {
    bad_data_case(data_frame(1, 0, 0, &[]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_before_all_data_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 32]);
    f.extend(Message::Finish { req: 1 }.to_vec());
    bad_data_case(f, 32).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_sent_into_a_read_is_refused() {
    let target = connector().await;
    let secret = pattern(40, 32);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    let _ = raw.send_raw(&data_frame(1, 0, 0, &[1u8; 32])).await;
    // The connector may have started to stream the readable before it saw
    // the Data; whatever came, the connection ends and the read fails.
    for m in raw.closed().await {
        assert!(
            matches!(m, Message::Data(_) | Message::Finish { req: 1 }),
            "{m:?}"
        );
    }
    let err = within(r.wait_for_completion()).await.unwrap_err();
    // The typed violation, not only its words.
    assert!(
        matches!(
            err,
            Error::Protocol {
                violation: PeerMisbehaved::Session(Violation::UnexpectedData { req: 1 }),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("request 1"), "{err}");
    assert_eq!(r.status(), OperationStatus::Errored);
    assert_eq!(r.into_descriptors()[0].as_slice().unwrap(), &secret[..]);
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Capabilities.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_token_with_the_wrong_kind_or_shape_is_refused() {
    let target = connector().await;
    let w = target
        .create_writable(vec![untouched(16), untouched(8)])
        .await
        .unwrap();
    let secret = pattern(8, 24);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;

    // READ against a writable, WRITE against a readable.
    raw.send(&open_frame(1, w.metadata(), OperationKind::Read))
        .await;
    let detail = raw.expect_abort(1, AbortReason::WrongKind).await;
    assert!(detail.contains("WritableOperation"), "{detail}");
    raw.send(&open_frame(2, r.metadata(), OperationKind::Write))
        .await;
    raw.expect_abort(2, AbortReason::WrongKind).await;
    // Data that follows a refused Open is skipped, not written.
    let _ = raw.send_raw(&data_frame(2, 0, 0, &[1u8; 24])).await;

    // Right token and kind, wrong count or sizes.
    let shapes: Vec<(Vec<u64>, AbortReason)> = vec![
        (vec![16], AbortReason::CountMismatch),
        (vec![16, 8, 1], AbortReason::CountMismatch),
        (
            vec![1; ferry_proto::MAX_DESCRIPTORS],
            AbortReason::CountMismatch,
        ),
        (vec![16, 9], AbortReason::SizeMismatch),
        (vec![u64::MAX, 8], AbortReason::SizeMismatch),
    ];
    for (i, (sizes, reason)) in shapes.into_iter().enumerate() {
        let req = 10 + i as u64;
        raw.send(&Message::Open(Open {
            req,
            op_id: w.metadata().operation_id(),
            token: *w.metadata().token(),
            kind: OperationKind::Write,
            sizes: sizes.into(),
            pull: false,
            part: 0,
            parts: 1,
        }))
        .await;
        raw.expect_abort(req, reason).await;
    }
    // Neither operation was started nor consumed by the refusals.
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_eq!(r.status(), OperationStatus::Initialized);
    raw.expect_quiet(Duration::from_millis(50)).await;
    holder_can_still_write(w).await;
    holder_can_still_read(r, &secret).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_refused_and_does_not_burn_the_capability() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let other = target.create_writable(vec![untouched(64)]).await.unwrap();
    let good = *w.metadata().token().as_bytes();
    let mut one_bit = good;
    one_bit[15] ^= 1;
    let tokens = [
        one_bit,
        [0u8; 16],
        [0xff; 16],
        *other.metadata().token().as_bytes(),
    ];
    let mut raw = Raw::connect(&target).await;
    for (i, t) in tokens.into_iter().enumerate() {
        let req = i as u64 + 1;
        raw.send(&Message::Open(Open {
            req,
            op_id: w.metadata().operation_id(),
            token: Token::from_bytes(t),
            kind: OperationKind::Write,
            sizes: vec![64].into(),
            pull: false,
            part: 0,
            parts: 1,
        }))
        .await;
        let detail = raw.expect_abort(req, AbortReason::UnknownOperation).await;
        assert!(detail.is_empty(), "{detail}");
        // Data after the refusal goes nowhere.
        let _ = raw.send_raw(&data_frame(req, 0, 0, &[1u8; 64])).await;
    }
    raw.barrier(100).await;
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_eq!(other.status(), OperationStatus::Initialized);
    assert_all(&other.into_descriptors()[0], UNTOUCHED, "other buffer");
    holder_can_still_write(w).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_all_get_the_same_refusal() {
    let target = connector().await;
    let live = target.create_writable(vec![untouched(8)]).await.unwrap();
    let ended = target.create_writable(vec![untouched(8)]).await.unwrap();
    let ended_meta = ended.metadata().clone();
    drop(ended);
    // A striped WRITE that failed: its peer ("owner") bound part 0 of 2,
    // then lost its connection; the end's cause is kept for that peer.
    let striped = target.create_writable(vec![untouched(10)]).await.unwrap();
    let sm = striped.metadata().clone();
    let mut owner = Raw::connect_as(&target, "owner").await;
    owner
        .send(&part_open(1, &sm, OperationKind::Write, 0, 2))
        .await;
    owner.barrier(2).await;
    drop(owner);
    within(async {
        while !striped.status().is_terminal() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;

    let wrong = Token::from_bytes([0x5A; 16]);
    let (live_id, ended_id, striped_id) = (
        live.metadata().operation_id(),
        ended_meta.operation_id(),
        sm.operation_id(),
    );
    let cases = [
        // Never issued.
        (0, wrong, 1),
        (striped_id + 1, wrong, 1),
        (u64::MAX, wrong, 1),
        // Live, with a wrong token, or the token of another operation.
        (live_id, wrong, 1),
        (live_id, *ended_meta.token(), 1),
        // Ended.
        (ended_id, wrong, 1),
        (ended_id, *live.metadata().token(), 1),
        // Ended striped, whose cause is stored.
        (striped_id, wrong, 2),
        (striped_id, wrong, 1),
    ];
    let mut raw = Raw::connect_as(&target, "stranger").await;
    for (i, (op_id, token, parts)) in cases.into_iter().enumerate() {
        let req = i as u64 + 1;
        raw.send(&Message::Open(Open {
            req,
            op_id,
            token,
            kind: OperationKind::Write,
            sizes: vec![8].into(),
            pull: false,
            part: parts - 1,
            parts,
        }))
        .await;
        match raw.next().await {
            Some((Message::Abort(a), _)) => assert_eq!(
                (a.req, a.reason, a.detail.as_str()),
                (req, AbortReason::UnknownOperation, ""),
                "case {i}: op {op_id}, {parts} part(s): a refusal without a valid token must \
                 not tell live, ended and unknown operations apart"
            ),
            other => panic!("case {i}: expected an abort, got {other:?}"),
        }
    }
    // Whoever holds an ended operation's token learns that it ended...
    let req = 100;
    raw.send(&open_frame(req, &ended_meta, OperationKind::Write))
        .await;
    let detail = raw.expect_abort(req, AbortReason::OperationEnded).await;
    assert!(detail.contains("has ended"), "{detail}");
    // ... but how a striped one failed is told to its own peer only.
    raw.send(&part_open(101, &sm, OperationKind::Write, 1, 2))
        .await;
    let detail = raw.expect_abort(101, AbortReason::OperationEnded).await;
    assert!(detail.contains("has ended"), "{detail}");
    let mut owner = Raw::connect_as(&target, "owner").await;
    owner
        .send(&part_open(1, &sm, OperationKind::Write, 1, 2))
        .await;
    let detail = owner.expect_abort(1, AbortReason::PartFailed).await;
    assert!(!detail.is_empty(), "the owner is told the cause");

    assert_eq!(live.status(), OperationStatus::Initialized);
    holder_can_still_write(live).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_a_completed_operation_is_refused() {
    let target = connector().await;
    let peer = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let op = peer
        .begin_write(vec![vec![7u8; 64].into()], w.metadata())
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    let secret = pattern(1, 64);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let op = peer
        .begin_read(r.metadata(), vec![vec![0u8; 64].into()])
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(r.wait_for_completion()).await.unwrap();

    expect_ended(&target, w.metadata()).await;
    expect_ended(&target, r.metadata()).await;
    // The peer that completed them cannot use them again either.
    let again = peer
        .begin_write(vec![vec![8u8; 64].into()], w.metadata())
        .await
        .unwrap();
    let err = within(again.wait_for_completion()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::OperationEnded,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(w.status(), OperationStatus::Complete);
    assert_eq!(r.status(), OperationStatus::Complete);
    assert_all(&w.into_descriptors()[0], 7, "completed buffer");
    assert_eq!(target.exposed_count(), 0);
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_a_cancelled_operation_is_refused() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let r = target
        .create_readable(vec![pattern(2, 64).into()])
        .await
        .unwrap();
    w.cancel();
    r.cancel();
    expect_ended(&target, w.metadata()).await;
    expect_ended(&target, r.metadata()).await;
    assert_eq!(w.status(), OperationStatus::Cancelled);
    assert_eq!(r.status(), OperationStatus::Cancelled);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "cancelled buffer");
    assert_eq!(target.exposed_count(), 0);
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_a_dropped_operation_is_refused() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let r = target
        .create_readable(vec![pattern(2, 64).into()])
        .await
        .unwrap();
    let (wm, rm) = (w.metadata().clone(), r.metadata().clone());
    drop(w);
    drop(r);
    assert_eq!(target.exposed_count(), 0);
    expect_ended(&target, &wm).await;
    expect_ended(&target, &rm).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_an_operation_cancelled_mid_transfer_is_refused() {
    let target = connector().await;
    let w = target
        .create_writable(vec![untouched(64), untouched(64)])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    raw.send_raw(&data_frame(1, 0, 0, &[1u8; 64]))
        .await
        .unwrap();
    raw.barrier(2).await;
    assert_eq!(w.status(), OperationStatus::InProgress);
    w.cancel();
    // The owner's cancel reaches the remote...
    raw.expect_abort(1, AbortReason::Cancelled).await;
    // ...and the rest of the remote's data, and its Finish, go nowhere.
    raw.send_raw(&data_frame(1, 1, 0, &[1u8; 64]))
        .await
        .unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    raw.barrier(3).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    expect_ended(&target, w.metadata()).await;
    assert_eq!(w.status(), OperationStatus::Cancelled);
    let got = w.into_descriptors();
    assert_all(&got[0], 1, "descriptor written before the cancel");
    assert_all(&got[1], UNTOUCHED, "descriptor after the cancel");
    legit_transfers_still_work(&target).await;
}
