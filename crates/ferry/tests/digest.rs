//! The opt-in end-to-end integrity check (`ConnectorBuilder::digest`) on
//! the in-band TCP lane: a relay without a secret flips one bit of the
//! payload on its way (a plain connection has no other check that would
//! see it); both sides must end ERRORED with `Error::DigestMismatch`, the
//! destination never COMPLETE. With the check on and nothing altered,
//! transfers complete as before, striped ones included. (The lanes that
//! copy lent memory are tested in `transport::tcp::digest_tests`.)

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry::{Connector, ConnectorBuilder, Error, OperationStatus, RdmaMetadata, TransportKind};
use ferry_proto::wire::{decode_frame, Message, HEADER_LEN};
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
    from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    flip: Option<usize>,
) {
    pump_into(from, to, flip, None).await
}

/// [`pump`], keeping a copy of every byte in `seen`.
async fn pump_into(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    flip: Option<usize>,
    seen: Option<Arc<Mutex<Vec<u8>>>>,
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
        if let Some(s) = &seen {
            s.lock().unwrap().extend_from_slice(&buf[..n]);
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

/// A relay that keeps what each side sent: `(to the passive side, to the
/// active side)`.
async fn recording_relay(target: SocketAddr) -> (SocketAddr, [Arc<Mutex<Vec<u8>>>; 2]) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen: [Arc<Mutex<Vec<u8>>>; 2] = Default::default();
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((active, _)) = l.accept().await {
            let Ok(passive) = TcpStream::connect(target).await else {
                return;
            };
            let (ar, aw) = active.into_split();
            let (pr, pw) = passive.into_split();
            tokio::spawn(pump_into(ar, pw, None, Some(kept[0].clone())));
            tokio::spawn(pump_into(pr, aw, None, Some(kept[1].clone())));
        }
    });
    (addr, seen)
}

/// The names of the frames of a plain (unencrypted) stream, in order.
fn frames(stream: &[u8]) -> Vec<&'static str> {
    let (mut at, mut out) = (0, Vec::new());
    while let Ok(Some((m, used))) = decode_frame(&stream[at..]) {
        at += used;
        out.push(match m {
            Message::Data(d) => {
                at += d.len as usize;
                "data"
            }
            Message::Digest(_) => "digest",
            Message::Finish { .. } => "finish",
            _ => "other",
        });
    }
    assert!(at + HEADER_LEN > stream.len(), "a frame did not decode");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_digest_travels_before_the_first_finish_only_when_on() {
    for on in [false, true] {
        let (a, p) = (connector(on).await, connector(on).await);
        for size in [4096usize, 1 << 20] {
            // A WRITE: the source is the active side.
            let w = p
                .create_writable(vec![vec![0u8; size].into()])
                .await
                .unwrap();
            let (r, seen) = recording_relay(p.local_addr()).await;
            let m = via(r, p.local_addr(), w.metadata());
            let op = a
                .begin_write(vec![vec![1u8; size].into()], &m)
                .await
                .unwrap();
            op.wait_for_completion_timeout(WAIT).await.unwrap();
            w.wait_for_completion_timeout(WAIT).await.unwrap();
            // The confirmation may still be on its way to the active side.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let to_passive = frames(&seen[0].lock().unwrap());
            let to_active = frames(&seen[1].lock().unwrap());
            let tail: Vec<_> = to_passive.iter().rev().take(2).rev().copied().collect();
            if on {
                assert_eq!(tail, ["digest", "finish"], "{size}");
            } else {
                assert_eq!(tail, ["data", "finish"], "{size}");
            }
            assert_eq!(
                to_passive.iter().filter(|f| **f == "digest").count(),
                usize::from(on)
            );
            // The confirmation carries none.
            assert!(!to_active.contains(&"digest"), "{to_active:?}");
        }
    }
}
