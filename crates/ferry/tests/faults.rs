//! Faults within the protocol: a stalled peer, a reset connection, cancels
//! racing completion. (Faults that need a process to die are in
//! crates/ferry-cli/tests/errors.rs.)

use std::time::{Duration, Instant};

use ferry::{Connector, Descriptor, Error, OperationStatus};
use ferry_proto::wire::{Hello, Message, Open, PROTOCOL_VERSION};
use ferry_proto::OperationKind;
use tokio::io::AsyncWriteExt;

mod support;

use support::{cancel_transports, Via};

async fn connector() -> Connector {
    Via::TCP.connector().await
}

async fn terminal(f: impl Fn() -> OperationStatus) -> OperationStatus {
    let t = Instant::now();
    loop {
        let s = f();
        if s.is_terminal() {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still {s} after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_meets_the_deadline_and_the_cancel() {
    let target = connector().await;
    let size = 256usize << 20;
    let r = target
        .create_readable(vec![Descriptor::from_vec(vec![3u8; size])])
        .await
        .unwrap();
    let m = r.metadata().clone();
    // A peer that opens a READ of 256 MiB and never reads a byte.
    let mut s = tokio::net::TcpStream::connect(target.local_addr())
        .await
        .unwrap();
    let mut frames = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "stalled".into(),
    })
    .to_vec();
    Message::Open(Open {
        req: 1,
        op_id: m.operation_id(),
        token: *m.token(),
        kind: OperationKind::Read,
        sizes: vec![size as u64].into(),
        pull: false,
        part: 0,
        parts: 1,
    })
    .encode(&mut frames);
    s.write_all(&frames).await.unwrap();
    let err = r
        .wait_for_completion_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert_eq!(r.status(), OperationStatus::InProgress);
    let t = Instant::now();
    let back = r.into_descriptors(); // cancels; must not wait for the stalled peer
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "cancel took {:?}",
        t.elapsed()
    );
    assert_eq!(back[0].size(), size);
    assert_eq!(target.exposed_count(), 0);

    // Others are served meanwhile.
    let other = connector().await;
    let w = target
        .create_writable(vec![vec![0u8; 1 << 20].into()])
        .await
        .unwrap();
    let op = other
        .begin_write(vec![vec![5u8; 1 << 20].into()], w.metadata())
        .await
        .unwrap();
    op.wait_for_completion_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    w.wait_for_completion().await.unwrap();
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reset_the_next_operation_reconnects() {
    let a = connector().await;
    let b = connector().await;
    for reset_by_passive in [false, true] {
        let w = a
            .create_writable(vec![vec![0u8; 4096].into()])
            .await
            .unwrap();
        let op = b
            .begin_write(vec![vec![1u8; 4096].into()], w.metadata())
            .await
            .unwrap();
        op.wait_for_completion().await.unwrap();
        w.wait_for_completion().await.unwrap();
        assert_eq!(b.connection_count(), 1);

        if reset_by_passive {
            a.close_connections();
        } else {
            b.close_connections();
        }
        let t = Instant::now();
        while b.connection_count() != 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the reset was not noticed"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }

        let w = a
            .create_writable(vec![vec![0u8; 4096].into()])
            .await
            .unwrap();
        let op = b
            .begin_write(vec![vec![2u8; 4096].into()], w.metadata())
            .await
            .unwrap();
        op.wait_for_completion().await.unwrap();
        w.wait_for_completion().await.unwrap();
        assert_eq!(w.descriptors().unwrap()[0].as_slice().unwrap()[0], 2);
        assert_eq!(b.connection_count(), 1, "reconnected");
    }
    assert_eq!(a.pending_count() + b.pending_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_operations_fail_on_both_sides_when_a_connection_resets() {
    let a = connector().await;
    let b = connector().await;
    let size = 512usize << 20;
    let w = a
        .create_writable(vec![vec![0u8; size].into()])
        .await
        .unwrap();
    let op = b
        .begin_write(vec![vec![1u8; size].into()], w.metadata())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    b.close_connections();
    assert!(matches!(
        op.wait_for_completion().await,
        Err(Error::ConnectionLost { .. })
    ));
    let err = w
        .wait_for_completion_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert_eq!(a.exposed_count(), 0);
}

/// Runs operations whose cancel races their completion, and checks that the
/// two sides agree: both COMPLETE (every byte landed), or neither. A remote
/// that finds the operation already cancelled sees it refused as ended.
async fn cancel_race(kind: OperationKind, cancel_active: bool) {
    for t in cancel_transports() {
        cancel_race_over(t, kind, cancel_active).await;
    }
}

async fn cancel_race_over(t: Via, kind: OperationKind, cancel_active: bool) {
    let a = t.connector().await;
    let b = t.connector().await;
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..200u64 {
        let size = if i % 2 == 0 { 4096 } else { 8 << 20 };
        let spin = Duration::from_micros((i * 37) % 400);
        let (passive_status, active_status, active_err): (
            OperationStatus,
            OperationStatus,
            Option<Error>,
        ) = match kind {
            OperationKind::Write => {
                let w = a
                    .create_writable(vec![vec![0u8; size].into()])
                    .await
                    .unwrap();
                let op = b
                    .begin_write(vec![vec![1u8; size].into()], w.metadata())
                    .await
                    .unwrap();
                let t = Instant::now();
                while t.elapsed() < spin {
                    std::hint::spin_loop();
                }
                if cancel_active {
                    op.cancel()
                } else {
                    w.cancel()
                }
                let ps = terminal(|| w.status()).await;
                let as_ = terminal(|| op.status()).await;
                if ps == OperationStatus::Complete {
                    assert!(w.descriptors().unwrap()[0]
                        .as_slice()
                        .unwrap()
                        .iter()
                        .all(|&x| x == 1));
                }
                (ps, as_, op.wait_for_completion().await.err())
            }
            OperationKind::Read => {
                let r = a
                    .create_readable(vec![vec![1u8; size].into()])
                    .await
                    .unwrap();
                let op = b
                    .begin_read(r.metadata(), vec![vec![0u8; size].into()])
                    .await
                    .unwrap();
                let t = Instant::now();
                while t.elapsed() < spin {
                    std::hint::spin_loop();
                }
                if cancel_active {
                    op.cancel()
                } else {
                    r.cancel()
                }
                let ps = terminal(|| r.status()).await;
                let as_ = terminal(|| op.status()).await;
                if as_ == OperationStatus::Complete {
                    assert!(op.descriptors().unwrap()[0]
                        .as_slice()
                        .unwrap()
                        .iter()
                        .all(|&x| x == 1));
                }
                (ps, as_, op.wait_for_completion().await.err())
            }
        };
        let what = format!(
            "op {i} ({kind:?}, size {size}): {passive_status} / {active_status} {active_err:?}"
        );
        assert_eq!(
            passive_status == OperationStatus::Complete,
            active_status == OperationStatus::Complete,
            "the two sides disagree: {what}"
        );
        if passive_status != OperationStatus::Complete {
            assert_eq!(passive_status, OperationStatus::Cancelled, "{what}");
            if cancel_active {
                // The canceller's own outcome is its cancel, never an error
                // provoked by it (a refusal of a part that arrived late).
                assert_eq!(active_status, OperationStatus::Cancelled, "{what}");
            }
            assert!(
                matches!(
                    active_err,
                    Some(
                        Error::Cancelled
                            | Error::RemoteCancelled
                            | Error::Rejected {
                                reason: ferry::AbortReason::OperationEnded,
                                ..
                            }
                    )
                ),
                "{what}"
            );
        }
        *outcomes
            .entry(format!("{passive_status}/{active_status}"))
            .or_insert(0) += 1;
    }
    eprintln!(
        "{t}: {kind:?} cancelled by the {} side: {outcomes:?}",
        if cancel_active { "active" } else { "passive" }
    );
    assert_eq!(a.exposed_count(), 0);
    // The parts of an operation that ended elsewhere leave their tables a
    // moment later: allow them that moment.
    let t0 = Instant::now();
    while a.pending_count() + b.pending_count() > 0 && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(a.pending_count() + b.pending_count(), 0, "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_completion_of_a_write_by_the_writer() {
    cancel_race(OperationKind::Write, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_completion_of_a_write_by_the_writable() {
    cancel_race(OperationKind::Write, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_completion_of_a_read_by_the_reader() {
    cancel_race(OperationKind::Read, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_completion_of_a_read_by_the_readable() {
    cancel_race(OperationKind::Read, false).await;
}
