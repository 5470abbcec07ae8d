//! Bad input on a real TCP connection, continued (see `bad_input.rs`):
//! replayed and out-of-turn frames, one peer's load (a flood of opens, a
//! reader that stops reading), and the attacks on the cross-memory attach
//! probe (a replayed cookie, unasked leases, a cookie planted in another
//! process).
//!
//! As in `bad_input.rs`, every test checks the answer or the close, that
//! nothing in the library panicked, that memory the capability does not
//! grant is untouched, and that legitimate transfers still complete.

use std::net::SocketAddr;
use std::time::Duration;

use ferry::{AbortReason, Error, OperationKind, OperationStatus};
use ferry_proto::wire::{self, Abort, Hello, Lease, Message, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;
use tokio::time::timeout;

mod support;

use support::*;

// ---------------------------------------------------------------------------
// Replays.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_finish_is_ignored() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    raw.send_raw(&data_frame(1, 0, 0, &[3u8; 64]))
        .await
        .unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    match raw.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    // The same Finish again, and a Finish for a request never opened.
    raw.send(&Message::Finish { req: 1 }).await;
    raw.send(&Message::Finish { req: 999 }).await;
    raw.barrier(2).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    // The request number is free again, but the operation is over.
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    raw.expect_abort(1, AbortReason::OperationEnded).await;
    assert_eq!(w.status(), OperationStatus::Complete);
    assert_all(&w.into_descriptors()[0], 3, "written buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_read_confirmation_is_ignored() {
    let target = connector().await;
    let secret = pattern(5, 100);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    match raw.next().await {
        Some((Message::Data(d), payload)) => {
            assert_eq!((d.req, d.desc, d.offset, d.len), (1, 0, 0, 100));
            assert_eq!(payload, secret);
        }
        other => panic!("expected the data, got {other:?}"),
    }
    match raw.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected finish, got {other:?}"),
    }
    raw.send(&Message::Finish { req: 1 }).await;
    within(r.wait_for_completion()).await.unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    raw.barrier(2).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    assert_eq!(r.status(), OperationStatus::Complete);
    expect_ended(&target, r.metadata()).await;
    legit_transfers_still_work(&target).await;
}

/// A reader's `Finish` confirms that every byte arrived; sent before the
/// readable has even sent them all, it is a lie the passive side can see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_confirmation_before_all_data_is_refused() {
    let target = connector().await;
    let r = target
        .create_readable(vec![vec![0x11u8; 8 << 20].into()])
        .await
        .unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = within(sock.connect(target.local_addr())).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "early-confirmer".into(),
    }))
    .await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    // Confirm at once, without reading a byte of the 8 MiB.
    raw.send(&Message::Finish { req: 1 }).await;
    let outcome = within(r.wait_for_completion()).await;
    assert!(
        matches!(outcome, Err(Error::Protocol { .. })),
        "the readable ended with {outcome:?} ({})",
        r.status()
    );
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_for_an_operation_completed_on_another_connection_is_ignored() {
    let target = connector().await;
    let peer = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let op = peer
        .begin_write(vec![vec![4u8; 64].into()], w.metadata())
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    // Another connection replays completions for the request numbers the
    // legitimate peer used: requests are per connection, so they match nothing.
    let mut raw = Raw::connect(&target).await;
    for req in [0, 1, 2, u64::MAX] {
        raw.send(&Message::Finish { req }).await;
    }
    raw.barrier(3).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    assert_eq!(w.status(), OperationStatus::Complete);
    assert_all(&w.into_descriptors()[0], 4, "written buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_request_number_closes_the_connection() {
    let target = connector().await;
    let w1 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let w2 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(5, w1.metadata(), OperationKind::Write))
        .await;
    raw.barrier(6).await;
    assert_eq!(w1.status(), OperationStatus::InProgress);
    let _ = raw
        .send_raw(&open_frame(5, w2.metadata(), OperationKind::Write).to_vec())
        .await;
    raw.expect_closed().await;
    // The operation bound to the connection fails; the one named by the
    // offending Open was never touched and is still usable.
    expect_errored_protocol(&w1).await;
    assert_all(&w1.into_descriptors()[0], UNTOUCHED, "first buffer");
    assert_eq!(w2.status(), OperationStatus::Initialized);
    holder_can_still_write(w2).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_open_of_an_operation_in_progress_is_busy() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut first = Raw::connect(&target).await;
    first
        .send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    first.barrier(2).await;
    // Someone else with the same metadata, on another connection and on the same.
    let mut second = Raw::connect(&target).await;
    second
        .send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    second.expect_abort(1, AbortReason::Busy).await;
    let _ = second.send_raw(&data_frame(1, 0, 0, &[9u8; 64])).await;
    second.barrier(2).await;
    first
        .send(&open_frame(3, w.metadata(), OperationKind::Write))
        .await;
    first.expect_abort(3, AbortReason::Busy).await;
    // The first remote finishes its transfer undisturbed.
    first
        .send_raw(&data_frame(1, 0, 0, &[6u8; 64]))
        .await
        .unwrap();
    first.send(&Message::Finish { req: 1 }).await;
    match first.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    assert_all(&w.into_descriptors()[0], 6, "written buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_from_the_remote_ends_only_its_operation() {
    let target = connector().await;
    let w1 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let w2 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w1.metadata(), OperationKind::Write))
        .await;
    raw.send(&open_frame(2, w2.metadata(), OperationKind::Write))
        .await;
    for (req, reason) in [
        (1, AbortReason::Cancelled),
        (2, AbortReason::Other(200)),
        (3, AbortReason::Protocol),
    ] {
        raw.send(&Message::Abort(Abort {
            req,
            reason,
            detail: "x".repeat(wire::MAX_DETAIL),
        }))
        .await;
    }
    raw.barrier(4).await;
    let err = within(w1.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::RemoteCancelled), "{err}");
    assert_eq!(w1.status(), OperationStatus::Cancelled);
    let err = within(w2.wait_for_completion()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::Other(200),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(w2.status(), OperationStatus::Errored);
    expect_ended(&target, w1.metadata()).await;
    assert_all(&w1.into_descriptors()[0], UNTOUCHED, "first buffer");
    assert_all(&w2.into_descriptors()[0], UNTOUCHED, "second buffer");
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Load from one peer.

/// A peer that sends Opens as fast as it can and never reads the replies is
/// cut off once 4096 replies are queued; the capability it aimed at is
/// untouched and other connections go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_of_opens_without_reading_replies_is_cut_off() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    // A small receive buffer so that the replies back up quickly.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = within(sock.connect(target.local_addr())).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "flooder".into(),
    }))
    .await;
    // READ against the writable: refused with WrongKind and a long detail.
    let mut batch = Vec::new();
    for req in 0..2000 {
        open_frame(req, w.metadata(), OperationKind::Read).encode(&mut batch);
    }
    let mut sent = 0usize;
    let cut_off = timeout(Duration::from_secs(10), async {
        loop {
            match raw.s.write_all(&batch).await {
                Ok(()) => sent += 2000,
                Err(e) if is_closed(&e) => return,
                Err(e) => panic!("write failed: {e}"),
            }
        }
    })
    .await;
    assert!(
        cut_off.is_ok(),
        "the connector kept serving a peer that never reads ({sent} opens sent)"
    );
    assert!(sent >= 4096, "cut off after only {sent} opens");
    // Whatever replies made it, the connection is over.
    for m in raw.closed().await {
        assert!(
            matches!(
                m,
                Message::Hello(_)
                    | Message::Abort(Abort {
                        reason: AbortReason::WrongKind,
                        ..
                    })
            ),
            "{m:?}"
        );
    }
    assert_eq!(w.status(), OperationStatus::Initialized);
    holder_can_still_write(w).await;
    legit_transfers_still_work(&target).await;
}

/// A peer that opens a large READ and then stops reading holds its own
/// connection's write side; the owner's cancel still fences it out at once:
/// the memory comes back while the transport is blocked mid-chunk, and not
/// one byte of it is read afterwards (the rest of the chunk goes out as zeros).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reader_is_fenced_out_by_cancel() {
    const SIZE: usize = 32 << 20;
    let target = connector().await;
    let r = target
        .create_readable(vec![vec![0x11u8; SIZE].into()])
        .await
        .unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = within(sock.connect(target.local_addr())).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "stalled-reader".into(),
    }))
    .await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    // Let the connector fill the socket and block.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.status(), OperationStatus::InProgress);
    // Other connections are not held up by the stalled one.
    legit_transfers_still_work(&target).await;

    r.cancel();
    assert_eq!(r.status(), OperationStatus::Cancelled);
    let mut back = r.into_descriptors();
    back[0].as_mut_slice().unwrap().fill(0xAA);

    // Now drain: pattern bytes sent before the cancel, then zeros, then an
    // Abort; never a byte written after the memory came back.
    let (mut pattern_bytes, mut zeros) = (0usize, 0usize);
    let mut aborted = false;
    while let Some((m, payload)) = raw.next().await {
        match m {
            Message::Hello(_) => {}
            Message::Data(d) => {
                assert_eq!(d.req, 1);
                assert!(!aborted, "data after the abort");
                for b in payload {
                    match b {
                        0x11 => pattern_bytes += 1,
                        0 => zeros += 1,
                        other => panic!("byte {other:#x} read after the cancel"),
                    }
                }
            }
            Message::Abort(a) => {
                // Both the owner's withdrawal and the interrupted stream say
                // so; the second is redundant but harmless.
                assert_eq!((a.req, a.reason), (1, AbortReason::Cancelled));
                aborted = true;
                if raw.buf.is_empty()
                    && timeout(Duration::from_millis(50), raw.s.readable())
                        .await
                        .is_err()
                {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(aborted, "the reader is told of the cancel");
    assert!(pattern_bytes < SIZE, "the cancel cut the stream short");
    assert!(back[0].as_slice().unwrap().iter().all(|&b| b == 0xAA));
    assert_eq!(target.exposed_count(), 0);
    // Chunks are 2 MiB; unless the cancel fell between two of them, the
    // rest of the interrupted one went out as zeros.
    assert!(zeros > 0 || pattern_bytes % (2 << 20) == 0, "{zeros}");
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Cross-memory attach: attacks on the probe.

/// The attack the probe must stop: learn the connector's cookie on one
/// connection, replay it on another as if it were ours, so that the connector
/// "verifies" itself as our process and copies from addresses we choose.
/// The cookie is bound to its connection, so the replay is refused, and a
/// lease from a peer that did not pass the probe closes the connection
/// without a byte copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_attach_cookie_is_refused_and_its_lease_copies_nothing() {
    let target = attaching_connector().await;
    let secret = [0x5Au8; 64];
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let m = w.metadata().clone();

    let mut first = Raw::connect(&target).await;
    first
        .send(&attach(std::process::id(), 0, [1; 16], Verdict::Unknown))
        .await;
    let offered = expect_attach(&mut first).await;
    assert_ne!(offered.pid, 0, "the connector offers attach on loopback");

    let mut second = Raw::connect(&target).await;
    second
        .send(&attach(std::process::id(), 0, [2; 16], Verdict::Unknown))
        .await;
    let _ = expect_attach(&mut second).await;
    // Replay the connector's own cookie from the first connection.
    second
        .send(&attach(
            offered.pid,
            offered.addr,
            [0; 16],
            Verdict::CanPull,
        ))
        .await;
    let verdict = expect_attach(&mut second).await;
    assert_eq!(verdict.verdict, Verdict::Refused, "{verdict:?}");

    // Now ask it to copy `secret` (this process's memory) into the writable.
    let mut open = open_frame(7, &m, OperationKind::Write);
    if let Message::Open(o) = &mut open {
        o.pull = true;
    }
    second.send(&open).await;
    second
        .send(&Message::Lease(Lease {
            lane: ferry_proto::lane::LaneId::CMA,
            req: 7,
            segments: vec![(secret.as_ptr() as u64, 64)].into(),
            key: vec![],
        }))
        .await;
    let got = second.closed().await;
    assert!(
        got.iter().all(|m| !matches!(m, Message::Finish { .. })),
        "{got:?}"
    );
    within(async {
        while !w.status().is_terminal() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert_eq!(w.status(), OperationStatus::Errored);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    drop(first);
    assert_no_library_panic();
}

/// Leases nobody asked for, and attach frames out of turn, close the
/// connection at once (no reply queue grows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unasked_leases_and_attach_out_of_turn_close_the_connection() {
    let target = attaching_connector().await;
    let mut r = Raw::connect(&target).await;
    let mut flood = Vec::new();
    for req in 0..10_000u64 {
        Message::Lease(Lease {
            lane: ferry_proto::lane::LaneId::CMA,
            req,
            segments: vec![(4096, 16)].into(),
            key: vec![],
        })
        .encode(&mut flood);
    }
    let _ = r.send_raw(&flood).await;
    r.expect_closed().await;

    let mut r = Raw::connect(&target).await;
    r.send(&attach(1, 4096, [0; 16], Verdict::CanPull)).await;
    r.expect_closed().await;
    assert_no_library_panic();
}

fn expected_cookie(na: &[u8; 16], np: &[u8; 16], act: SocketAddr, pas: SocketAddr) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"ferry-cma-cookie-v1\0");
    h.update([1u8]); // the active side's cookie
    h.update(na);
    h.update(np);
    h.update(act.to_string().as_bytes());
    h.update([0u8]);
    h.update(pas.to_string().as_bytes());
    let mut o = [0u8; 16];
    o.copy_from_slice(&h.finalize()[..16]);
    o
}

/// The second attack on the probe: the attacker computes the cookie the
/// connector expects and gets it into the memory of a process that is not
/// the attacker — the connector's own (a `Data` payload for no request
/// passes through its read buffer: the reviewer's proof of concept hit that
/// by guessing addresses) — then names that process's pid and address. Here
/// the planting is made certain: the test process, which runs the
/// connector, puts the bytes at an address it tells the attacker. The bytes
/// are right, the permission is there, but the kernel says the connector's
/// process does not hold the attacker's socket: refused. (Without that
/// check this test gets `CanPull`.) The attacker is another process (this
/// test binary, run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_planted_in_another_process_does_not_pass_the_probe() {
    use std::io::{BufRead, Write};
    const NAME: &str = "a_cookie_planted_in_another_process_does_not_pass_the_probe";
    if let Ok(addr) = std::env::var("FERRY_TEST_ATTACK") {
        return plant_cookie(addr.parse().unwrap()).await;
    }
    let target = attaching_connector().await;
    let addr = target.local_addr().to_string();
    let verdict = tokio::task::spawn_blocking(move || {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("FERRY_TEST_ATTACK", addr)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut stdin = child.stdin.take().unwrap();
        let mut planted: Option<Box<[u8; 16]>> = None;
        let mut verdict = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            // The test harness may print "test NAME ... " first on the line.
            if let Some((_, hex)) = line.split_once("PLANT ") {
                let mut b = [0u8; 16];
                for (i, x) in b.iter_mut().enumerate() {
                    *x = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap();
                }
                let bx = Box::new(b);
                writeln!(stdin, "{}", bx.as_ptr() as u64).unwrap();
                stdin.flush().unwrap();
                planted = Some(bx);
            } else if let Some((_, v)) = line.split_once("VERDICT ") {
                verdict = v.to_string();
                break;
            }
        }
        assert!(
            child.wait().unwrap().success(),
            "the attacker process failed"
        );
        drop(planted);
        verdict
    })
    .await
    .unwrap();
    assert_eq!(verdict, "Refused");
    assert_no_library_panic();
}

/// The attacker's side.
async fn plant_cookie(target: SocketAddr) {
    let mut r = Raw::connect_bare(target).await;
    r.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "attacker".into(),
    }))
    .await;
    assert!(matches!(r.next().await, Some((Message::Hello(_), _))));
    let (act, pas) = (r.s.local_addr().unwrap(), r.s.peer_addr().unwrap());
    let na = [7u8; 16];
    r.send(&attach(1, 0, na, Verdict::Unknown)).await;
    let offered = expect_attach(&mut r).await;
    assert_ne!(offered.pid, std::process::id());
    let planted = expected_cookie(&na, &offered.cookie, act, pas);
    let hex: String = planted.iter().map(|b| format!("{b:02x}")).collect();
    println!("PLANT {hex}");
    let at: u64 = tokio::task::spawn_blocking(|| {
        let mut l = String::new();
        std::io::stdin().read_line(&mut l).unwrap();
        l.trim().parse().unwrap()
    })
    .await
    .unwrap();
    r.send(&attach(offered.pid, at, [0; 16], Verdict::CanPull))
        .await;
    let v = expect_attach(&mut r).await;
    println!("VERDICT {:?}", v.verdict);
}
