//! The end-to-end digest on the lanes that copy lent memory (cross-memory
//! attach between two connectors of this process, and the same-process
//! lane of the `local` transport): a bit flipped in what
//! landed after the copy ([`CORRUPT_LANDED`], as a late write into a
//! reused block would) is caught by the lending source, and both sides
//! end ERRORED with `Error::DigestMismatch`, the destination never
//! COMPLETE. Clean copies complete with the check on. (The in-band lane:
//! `tests/digest.rs`.)

use std::time::Duration;

use ferry_proto::OperationStatus;

use crate::sync::lock;
use crate::transport::digest::CORRUPT_LANDED;
use crate::{Connector, Error, TransportKind};

const WAIT: Duration = Duration::from_secs(10);

async fn connector() -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Cma, TransportKind::Tcp])
        .cma_threshold(0)
        .digest(true)
        .build()
        .await
        .unwrap()
}

/// Two connectors of this process that find each other: the `local`
/// transport, its same-process lane.
async fn local(digest: bool) -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .digest(digest)
        .build()
        .await
        .unwrap()
}

type Ends = (
    crate::Result<()>,
    crate::Result<()>,
    OperationStatus,
    OperationStatus,
    Option<TransportKind>,
);

/// A READ of `size` bytes: the exposing side lends, the reader copies.
async fn read(a: &Connector, p: &Connector, size: usize) -> Ends {
    let readable = p
        .create_readable(vec![vec![1u8; size].into()])
        .await
        .unwrap();
    let op = a
        .begin_read(readable.metadata(), vec![vec![0u8; size].into()])
        .await
        .unwrap();
    let active = op.wait_for_completion_timeout(WAIT).await;
    let passive = readable.wait_for_completion_timeout(WAIT).await;
    (
        active,
        passive,
        op.status(),
        readable.status(),
        op.transport(),
    )
}

/// A WRITE of `size` bytes: the writer lends, the exposing side copies.
async fn write(a: &Connector, p: &Connector, size: usize) -> Ends {
    let writable = p
        .create_writable(vec![vec![0u8; size].into()])
        .await
        .unwrap();
    let op = a
        .begin_write(vec![vec![1u8; size].into()], writable.metadata())
        .await
        .unwrap();
    let active = op.wait_for_completion_timeout(WAIT).await;
    let passive = writable.wait_for_completion_timeout(WAIT).await;
    (
        active,
        passive,
        op.status(),
        writable.status(),
        op.transport(),
    )
}

fn is_cma(e: &Ends) -> bool {
    if e.4 != Some(TransportKind::Cma) {
        eprintln!("skipped: cross-memory attach is refused here ({:?})", e.4);
        return false;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_what_a_copy_landed_is_caught_on_both_sides() {
    let (a, p) = (connector().await, connector().await);
    // Sizes no other test of this crate moves: the hook flips only these.
    for (i, size) in [4_099usize, (64 << 20) + 3].into_iter().enumerate() {
        let sizes = [size as u64, size as u64 + 2];
        lock(&CORRUPT_LANDED).extend(sizes);
        let reads = read(&a, &p, size).await;
        let writes = write(&a, &p, size + 2).await;
        lock(&CORRUPT_LANDED).retain(|s| !sizes.contains(s));
        if i == 0 && !is_cma(&reads) {
            return;
        }
        for (what, e) in [("read", reads), ("write", writes)] {
            for (side, r) in [("active", &e.0), ("passive", &e.1)] {
                assert!(
                    matches!(r, Err(Error::DigestMismatch { .. })),
                    "{what} of {size}, {side} side: {r:?}"
                );
            }
            assert_eq!(
                (e.2, e.3),
                (OperationStatus::Errored, OperationStatus::Errored)
            );
            assert_eq!(e.4, Some(TransportKind::Cma), "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_check_on_clean_copies_complete() {
    let (a, p) = (connector().await, connector().await);
    for size in [1usize, 4096, 8 << 20] {
        for (what, e) in [
            ("read", read(&a, &p, size).await),
            ("write", write(&a, &p, size).await),
        ] {
            if !is_cma(&e) {
                return;
            }
            assert!(
                e.0.is_ok() && e.1.is_ok(),
                "{what} of {size}: {:?} {:?}",
                e.0,
                e.1
            );
            assert_eq!(
                (e.2, e.3),
                (OperationStatus::Complete, OperationStatus::Complete)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_process_lane_checks_its_copies_too() {
    // The check on at either end is enough.
    let (a, p) = (local(true).await, local(false).await);
    for size in [4_111usize, (2 << 20) + 15] {
        let sizes = [size as u64, size as u64 + 2];
        lock(&CORRUPT_LANDED).extend(sizes);
        let reads = read(&a, &p, size).await;
        let writes = write(&p, &a, size + 2).await;
        lock(&CORRUPT_LANDED).retain(|s| !sizes.contains(s));
        for (what, e) in [("read", reads), ("write", writes)] {
            assert_eq!(e.4, Some(TransportKind::Local), "{what}");
            for (side, r) in [("active", &e.0), ("passive", &e.1)] {
                assert!(
                    matches!(r, Err(Error::DigestMismatch { .. })),
                    "{what} of {size}, {side} side: {r:?}"
                );
            }
            assert_eq!(
                (e.2, e.3),
                (OperationStatus::Errored, OperationStatus::Errored)
            );
        }
        for e in [read(&a, &p, size).await, write(&p, &a, size).await] {
            assert!(e.0.is_ok() && e.1.is_ok(), "{:?} {:?}", e.0, e.1);
        }
    }
}
