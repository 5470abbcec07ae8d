//! The opt-in end-to-end integrity check (`ConnectorBuilder::digest`) on
//! the in-band TCP lane: a relay without a secret flips one bit of the
//! payload on its way (a plain connection has no other check that would
//! see it); both sides must end ERRORED with `Error::DigestMismatch`, the
//! destination never COMPLETE. With the check on and nothing altered,
//! transfers complete as before, striped ones included. (The lanes that
//! copy lent memory are tested in `transport::tcp::digest_tests`.)

use std::net::SocketAddr;
use std::time::Duration;

use ferry::{Connector, ConnectorBuilder, Error, OperationStatus, RdmaMetadata, TransportKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(10);

fn builder(digest: bool) -> ConnectorBuilder {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .digest(digest)
}

async fn connector(digest: bool) -> Connector {
    builder(digest).build().await.unwrap()
}

/// Starts a relay to `target` that flips the top bit of byte `flip` of
/// each connection's stream towards the passive side (`to_passive`) or
/// towards the active side; returns its address.
async fn relay(target: SocketAddr, flip: Option<usize>, to_passive: bool) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((active, _)) = l.accept().await {
            let Ok(passive) = TcpStream::connect(target).await else {
                return;
            };
            let (ar, aw) = active.into_split();
            let (pr, pw) = passive.into_split();
            let (a, b) = if to_passive {
                (flip, None)
            } else {
                (None, flip)
            };
            tokio::spawn(pump(ar, pw, a));
            tokio::spawn(pump(pr, aw, b));
        }
    });
    addr
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    flip: Option<usize>,
) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut at = 0usize;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(f) = flip.filter(|f| (at..at + n).contains(f)) {
            buf[f - at] ^= 0x80;
        }
        at += n;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

fn via(relay: SocketAddr, real: SocketAddr, m: &RdmaMetadata) -> RdmaMetadata {
    let json = m.to_json();
    let altered = json.replace(&real.to_string(), &relay.to_string());
    assert_ne!(json, altered, "the metadata names {real}");
    RdmaMetadata::from_json(&altered).unwrap()
}

struct Ends {
    active: ferry::Result<()>,
    passive: ferry::Result<()>,
    active_status: OperationStatus,
    passive_status: OperationStatus,
    held: Vec<u8>,
}

/// Writes `size` bytes of 0x01 from `a` to `p` through a relay that flips
/// byte `flip` of the stream to the passive side.
async fn write(a: &Connector, p: &Connector, size: usize, flip: Option<usize>) -> Ends {
    let w = p
        .create_writable(vec![vec![0u8; size].into()])
        .await
        .unwrap();
    let r = relay(p.local_addr(), flip, true).await;
    let m = via(r, p.local_addr(), w.metadata());
    let op = a
        .begin_write(vec![vec![1u8; size].into()], &m)
        .await
        .unwrap();
    let active = op.wait_for_completion_timeout(WAIT).await;
    let passive = w.wait_for_completion_timeout(WAIT).await;
    let (active_status, passive_status) = (op.status(), w.status());
    let held = w.into_descriptors()[0].as_slice().unwrap().to_vec();
    Ends {
        active,
        passive,
        active_status,
        passive_status,
        held,
    }
}

/// Reads `size` bytes of 0x01 from `p` into `a` through a relay that flips
/// byte `flip` of the stream to the active side.
async fn read(a: &Connector, p: &Connector, size: usize, flip: Option<usize>) -> Ends {
    let readable = p
        .create_readable(vec![vec![1u8; size].into()])
        .await
        .unwrap();
    let r = relay(p.local_addr(), flip, false).await;
    let m = via(r, p.local_addr(), readable.metadata());
    let op = a
        .begin_read(&m, vec![vec![0u8; size].into()])
        .await
        .unwrap();
    let active = op.wait_for_completion_timeout(WAIT).await;
    let passive = readable.wait_for_completion_timeout(WAIT).await;
    let (active_status, passive_status) = (op.status(), readable.status());
    let held = op.into_descriptors()[0].as_slice().unwrap().to_vec();
    Ends {
        active,
        passive,
        active_status,
        passive_status,
        held,
    }
}

fn mismatch(r: &ferry::Result<()>, side: &str) {
    match r {
        Err(Error::DigestMismatch { detail }) => assert!(!detail.is_empty()),
        other => panic!("{side}: expected a digest mismatch, got {other:?}"),
    }
}

fn caught(e: &Ends) {
    mismatch(&e.active, "active side");
    mismatch(&e.passive, "passive side");
    assert_eq!(e.active_status, OperationStatus::Errored);
    assert_eq!(e.passive_status, OperationStatus::Errored);
}

fn clean(e: &Ends, what: &str) {
    assert!(e.active.is_ok(), "{what}: {:?}", e.active);
    assert!(e.passive.is_ok(), "{what}: {:?}", e.passive);
    assert_eq!(e.active_status, OperationStatus::Complete, "{what}");
    assert_eq!(e.passive_status, OperationStatus::Complete, "{what}");
    assert!(e.held.iter().all(|&b| b == 1), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_of_a_write_in_band_is_caught_on_both_sides() {
    let (a, p) = (connector(true).await, connector(true).await);
    // 4 KiB goes out as one write (`small_frames`), 1 MiB in chunks: byte
    // 2,000 and byte 600,000 of the stream are payload whatever the
    // handshake's length.
    for (size, at) in [(4096, 2_000), (1 << 20, 600_000)] {
        let e = write(&a, &p, size, Some(at)).await;
        caught(&e);
        assert_eq!(e.held.iter().filter(|&&b| b != 1).count(), 1, "{size}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_of_a_read_in_band_is_caught_on_both_sides() {
    let (a, p) = (connector(true).await, connector(true).await);
    for (size, at) in [(4096, 2_000), (1 << 20, 600_000)] {
        caught(&read(&a, &p, size, Some(at)).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_check_on_clean_transfers_complete() {
    let (a, p) = (connector(true).await, connector(true).await);
    for size in [0, 1, 4096, 1 << 20, 3 << 20] {
        if size > 0 {
            clean(&write(&a, &p, size, None).await, "write");
        }
        clean(&read(&a, &p, size.max(1), None).await, "read");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_part_of_a_striped_transfer_is_checked() {
    let striped = || async {
        builder(true)
            .tcp_streams(4)
            .stripe_threshold(1 << 20)
            .build()
            .await
            .unwrap()
    };
    let (a, p) = (striped().await, striped().await);
    clean(&write(&a, &p, 8 << 20, None).await, "striped write");
    clean(&read(&a, &p, 8 << 20, None).await, "striped read");
    // The relay flips byte 300,000 of every connection: every part.
    let e = write(&a, &p, 8 << 20, Some(300_000)).await;
    assert!(
        matches!(e.passive, Err(Error::DigestMismatch { .. })),
        "{:?}",
        e.passive
    );
    assert_ne!(e.passive_status, OperationStatus::Complete);
    assert!(e.active.is_err(), "{:?}", e.active);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_check_is_refused_by_a_side_that_requires_it() {
    // The exposing side streams a READ without a digest; the reader
    // requires one: a protocol violation, on both sides.
    let (a, p) = (connector(true).await, connector(false).await);
    let e = read(&a, &p, 4096, None).await;
    assert!(
        matches!(&e.active, Err(Error::Protocol { violation, .. })
            if violation.to_string().contains("without a digest")),
        "{:?}",
        e.active
    );
    assert_eq!(e.active_status, OperationStatus::Errored);
    assert_ne!(e.passive_status, OperationStatus::Complete);
    // The other way round, the side with the check off compares the
    // digest it was sent: the write completes, checked.
    clean(
        &write(&a, &p, 4096, None).await,
        "write to a side with the check off",
    );
}
