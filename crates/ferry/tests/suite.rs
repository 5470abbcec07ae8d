//! The shared suite, run once per transport, between two connectors of this
//! process: a plain copy, cross-memory attach (to this same process, every
//! size by attach), TCP, and TCP striped over four streams (every transfer of
//! four bytes or more). (The cross-process suite in crates/ferry-cli/tests
//! covers TCP and attach between processes.)

use std::time::Duration;

use ferry::{
    AbortReason, Connector, Descriptor, Error, OperationStatus, RdmaMetadata, TransportKind,
};

mod support;

use support::{cancel_transports, check, descs, pair, transports, Via};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairings_on_every_transport() {
    let mixed: Vec<usize> = vec![
        1,
        7,
        4096,
        4097,
        65_536,
        1 << 20,
        3,
        333_333,
        0,
        12,
        1000,
        8,
        9,
        100,
        65_537,
        5,
    ];
    for t in transports() {
        let (a, b) = pair(t).await;
        for sizes in [vec![1usize], vec![4096], mixed.clone(), vec![64 << 20]] {
            let r = a.create_readable(descs(&sizes, Some(1))).await.unwrap();
            let op = b
                .begin_read(r.metadata(), descs(&sizes, None))
                .await
                .unwrap();
            op.wait_for_completion().await.unwrap();
            r.wait_for_completion().await.unwrap();
            assert_eq!(op.transport(), Some(t.kind));
            check(&op.into_descriptors(), &sizes, 1);

            let w = a.create_writable(descs(&sizes, None)).await.unwrap();
            let op = b
                .begin_write(descs(&sizes, Some(2)), w.metadata())
                .await
                .unwrap();
            op.wait_for_completion().await.unwrap();
            w.wait_for_completion().await.unwrap();
            assert_eq!(w.transport(), Some(t.kind));
            check(&w.into_descriptors(), &sizes, 2);
        }
        assert_eq!(a.exposed_count(), 0);
        assert_eq!(a.pending_count() + b.pending_count(), 0, "{t}");
        if t.kind != TransportKind::Local {
            // One connection per stream: the large transfers were striped.
            assert_eq!(b.connection_count(), t.streams, "{t}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_every_transport() {
    for t in transports() {
        let (a, b) = pair(t).await;
        let w = a.create_writable(descs(&[100], None)).await.unwrap();
        let m = w.metadata().clone();
        assert!(matches!(
            b.begin_read(&m, descs(&[100], None)).await,
            Err(Error::WrongPairing { .. })
        ));
        assert!(matches!(
            b.begin_write(descs(&[99], Some(1)), &m).await,
            Err(Error::SizeMismatch { .. })
        ));
        assert!(matches!(
            b.begin_write(descs(&[100, 1], Some(1)), &m).await,
            Err(Error::CountMismatch { .. })
        ));

        let edit = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
            f(&mut v);
            RdmaMetadata::from_json(&v.to_string()).unwrap()
        };
        let cases: Vec<(RdmaMetadata, usize, AbortReason)> = vec![
            (
                edit(&|v| v["descriptors"][0]["size"] = 200.into()),
                200,
                AbortReason::SizeMismatch,
            ),
            (
                edit(&|v| v["token"] = "0123456789abcdef0123456789abcdef".into()),
                100,
                AbortReason::UnknownOperation,
            ),
            (
                edit(&|v| v["operation_id"] = 424_242.into()),
                100,
                AbortReason::UnknownOperation,
            ),
        ];
        for (forged, size, reason) in cases {
            let op = b
                .begin_write(descs(&[size], Some(1)), &forged)
                .await
                .unwrap();
            let err = op.wait_for_completion().await.unwrap_err();
            assert!(
                matches!(err, Error::Rejected { reason: r, .. } if r == reason),
                "{t}: {err}"
            );
        }
        let flipped = edit(&|v| v["operation_kind"] = 1.into());
        let op = b.begin_read(&flipped, descs(&[100], None)).await.unwrap();
        let err = op.wait_for_completion().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Rejected {
                    reason: AbortReason::WrongKind,
                    ..
                }
            ),
            "{t}: {err}"
        );

        // Untouched by all of that: the genuine write lands, once.
        assert_eq!(w.status(), OperationStatus::Initialized);
        let op = b.begin_write(descs(&[100], Some(3)), &m).await.unwrap();
        op.wait_for_completion().await.unwrap();
        w.wait_for_completion().await.unwrap();
        let again = b.begin_write(descs(&[100], Some(4)), &m).await.unwrap();
        let err = again.wait_for_completion().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Rejected {
                    reason: AbortReason::OperationEnded,
                    ..
                }
            ),
            "{t}: {err}"
        );
        check(&w.into_descriptors(), &[100], 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_on_every_transport() {
    let big = 256usize << 20;
    for t in cancel_transports() {
        let (a, b) = pair(t).await;
        // The writable is cancelled during the transfer: no byte lands after.
        let w = a.create_writable(descs(&[big], None)).await.unwrap();
        let op = b
            .begin_write(vec![vec![7u8; big].into()], w.metadata())
            .await
            .unwrap();
        // Under way (the first operation also sets up the connection,
        // which a busy machine may take a while to do).
        let t0 = std::time::Instant::now();
        while w.status() == OperationStatus::Initialized && t0.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(w.status(), OperationStatus::InProgress, "{t}");
        let back = w.into_descriptors(); // cancels
        let at_cancel: Vec<u8> = back[0].as_slice().unwrap().to_vec();
        let err = op
            .wait_for_completion()
            .await
            .expect_err(&format!("{t}: the writer must learn of the cancel"));
        assert!(matches!(err, Error::RemoteCancelled), "{t}: {err}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            back[0].as_slice().unwrap() == at_cancel.as_slice(),
            "{t}: bytes landed after the cancel"
        );
        assert!(
            at_cancel.contains(&0),
            "{t}: the transfer had finished before the cancel"
        );

        // The write is cancelled during the transfer: the writable learns it.
        let w = a.create_writable(descs(&[big], None)).await.unwrap();
        let op = b
            .begin_write(vec![vec![7u8; big].into()], w.metadata())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        op.cancel();
        assert_eq!(
            op.status(),
            OperationStatus::Cancelled,
            "{t}: the cancel took effect"
        );
        let err = w
            .wait_for_completion_timeout(Duration::from_secs(10))
            .await
            .expect_err(&format!("{t}: the writable must learn of the cancel"));
        assert!(matches!(err, Error::RemoteCancelled), "{t}: {err}");
        assert_eq!(a.exposed_count(), 0);
    }
}

/// Dropping a writable (here: the end of the scope that borrowed its memory)
/// while a remote is writing it: once the drop has returned, not one more
/// byte lands, on every transport. Repeated until the drop has caught a
/// transfer half-way at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_writable_mid_transfer_fences_every_transport() {
    let size = 64usize << 20;
    for t in cancel_transports() {
        let (a, b) = pair(t).await;
        let (a, b) = (std::sync::Arc::new(a), std::sync::Arc::new(b));
        let mut caught_mid_transfer = 0;
        for attempt in 0..20u64 {
            let handle = tokio::runtime::Handle::current();
            let (a2, b2) = (a.clone(), b.clone());
            let delay = Duration::from_micros(500 + attempt * 700);
            let (dest, op) = tokio::task::spawn_blocking(move || {
                let mut dest = vec![0u8; size];
                let op = a2.scope(|s| {
                    handle.block_on(async {
                        let w = s
                            .create_writable(vec![Descriptor::from_mut_slice(&mut dest)])
                            .await
                            .unwrap();
                        let op = b2
                            .begin_write(vec![vec![7u8; size].into()], w.metadata())
                            .await
                            .unwrap();
                        tokio::time::sleep(delay).await;
                        drop(w);
                        op
                    })
                });
                (dest, op)
            })
            .await
            .unwrap();
            // The drop has returned: take a snapshot, let the writer end,
            // give a late byte every chance, and look again.
            let landed = dest.iter().filter(|&&x| x == 7).count();
            let snapshot = dest.clone();
            let _ = op
                .wait_for_completion_timeout(Duration::from_secs(10))
                .await;
            assert!(op.status().is_terminal(), "{t}: the writer never ended");
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                dest == snapshot,
                "{t}: bytes landed after the drop returned"
            );
            if landed > 0 && landed < size {
                caught_mid_transfer += 1;
                assert_eq!(op.status(), OperationStatus::Cancelled, "{t}");
            }
            if caught_mid_transfer >= 2 {
                break;
            }
        }
        assert!(
            caught_mid_transfer > 0,
            "{t}: no drop landed mid-transfer in 20 attempts"
        );
        assert_eq!(a.exposed_count(), 0);
        assert_eq!(a.pending_count() + b.pending_count(), 0, "{t}");
    }
}

/// What a read was doing when the storage it copies from was dropped: its
/// status, and the transport it had learned (`Cma` once its lease arrived).
type AtDrop = Option<(OperationStatus, Option<TransportKind>)>;

/// Storage whose drop records the status of the read copying from it.
struct Watched {
    buf: Vec<u8>,
    read: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<ferry::ReadOperation<'static>>>>,
    seen: std::sync::Arc<std::sync::Mutex<Option<AtDrop>>>,
}

impl AsRef<[u8]> for Watched {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let st = self.read.get().map(|r| (r.status(), r.transport()));
        *self.seen.lock().unwrap() = Some(st);
    }
}

/// A readable dropped while a reader copies from it by cross-memory attach:
/// its storage is freed only once the reader has stopped (the reader's
/// operation has ended), never under the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_dropped_while_lent_lives_until_the_copy_stops() {
    use std::sync::{Arc, Mutex, OnceLock};
    let (a, b) = pair(Via::CMA).await;
    let size = 128usize << 20;
    let mut cancelled_mid_copy = 0;
    for attempt in 0..20u64 {
        let read_slot = Arc::new(OnceLock::new());
        let seen = Arc::new(Mutex::new(None));
        let owner = Watched {
            buf: vec![5u8; size],
            read: read_slot.clone(),
            seen: seen.clone(),
        };
        let r = a
            .create_readable(vec![Descriptor::from_bytes(bytes::Bytes::from_owner(
                owner,
            ))])
            .await
            .unwrap();
        let read = Arc::new(
            b.begin_read(r.metadata(), vec![vec![0u8; size].into()])
                .await
                .unwrap(),
        );
        let _ = read_slot.set(read.clone());
        tokio::time::sleep(Duration::from_micros(300 + attempt * 500)).await;
        drop(r);
        let _ = read
            .wait_for_completion_timeout(Duration::from_secs(10))
            .await;
        let t = std::time::Instant::now();
        let at_drop = loop {
            if let Some(s) = *seen.lock().unwrap() {
                break s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the storage was never released"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let (at_drop, leased) = at_drop.expect("the read existed");
        assert!(read.status().is_terminal());
        // A reader that copied everything says so (`Finish`), which ends
        // the lease before the source's cancel reaches it; one that was
        // interrupted ends the lease only after it stopped, i.e. after its
        // operation ended. A drop that came before the lease went out
        // frees the storage at once: the reader never had its address.
        let copied_all = read.descriptors().unwrap()[0]
            .as_slice()
            .unwrap()
            .iter()
            .all(|&x| x == 5);
        if !copied_all && leased.is_some() {
            assert!(
                at_drop.is_terminal(),
                "the storage was freed while the interrupted reader was {at_drop:?}"
            );
        }
        if read.status() == OperationStatus::Cancelled && !copied_all && leased.is_some() {
            assert_eq!(read.transport(), Some(TransportKind::Cma));
            cancelled_mid_copy += 1;
            if cancelled_mid_copy >= 2 {
                break;
            }
        }
    }
    assert!(cancelled_mid_copy > 0, "no drop landed mid-copy");
    assert_eq!(a.pending_count() + b.pending_count(), 0);
}

/// A dual-stack listener sees the other end as `::ffff:127.0.0.1` while the
/// other end sees `127.0.0.1`: cross-memory attach must still be set up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cma_works_with_a_dual_stack_listener() {
    let mk = |addr: &str| {
        Connector::builder()
            .listen(addr.parse().unwrap())
            .transports(&[TransportKind::Cma, TransportKind::Tcp])
            .cma_threshold(0)
            .build()
    };
    let Ok(a) = mk("[::]:0").await else {
        eprintln!("no IPv6 on this machine: skipped");
        return;
    };
    let b = mk("127.0.0.1:0").await.unwrap();
    let r = a.create_readable(descs(&[4096], Some(9))).await.unwrap();
    let op = b
        .begin_read(r.metadata(), descs(&[4096], None))
        .await
        .unwrap();
    op.wait_for_completion().await.unwrap();
    assert_eq!(op.transport(), Some(TransportKind::Cma));
    check(&op.into_descriptors(), &[4096], 9);
}
