//! A relay between two workers that share a secret.
//!
//! The relay has no secret. It sits where the metadata says the passive
//! worker is (its address was altered), connects to the real one, and
//! forwards the bytes of each connection in both directions. Forwarding them
//! unchanged is harmless; altering or injecting any byte after the handshake
//! must make the transfer fail on both sides (a protocol violation or a lost
//! connection), never complete with the relay's bytes.

use std::net::SocketAddr;
use std::time::Duration;

use ferry::{Connector, Error, OperationStatus, RdmaMetadata, TransportKind};
use ferry_proto::wire::{self, Data, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &str = "the-deployment-secret-the-relay-lacks";
const WAIT: Duration = Duration::from_secs(10);

async fn connector() -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .secret(SECRET)
        .build()
        .await
        .unwrap()
}

/// What the relay does to the bytes it forwards.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// Nothing: every byte as it came.
    None,
    /// Flips the highest bit of byte `n` of the stream to the passive side.
    FlipToPassive(usize),
    /// Flips the highest bit of byte `n` of the stream to the active side.
    FlipToActive(usize),
    /// Forwards the passive side's first two frames (its `Hello` and its
    /// handshake), then, before the passive side's answer to the first
    /// request, injects a `Data` frame of `len` bytes of 0xBB and a `Finish`
    /// for request 1 (the first request of a connection).
    InjectToActive(u32),
}

/// Starts a relay to `target`; returns its address.
async fn relay(target: SocketAddr, tamper: Tamper) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((active, _)) = l.accept().await {
            let Ok(passive) = TcpStream::connect(target).await else {
                return;
            };
            let (ar, aw) = active.into_split();
            let (pr, pw) = passive.into_split();
            let (to_passive, to_active) = match tamper {
                Tamper::FlipToPassive(n) => (Some(n), None),
                Tamper::FlipToActive(n) => (None, Some(n)),
                _ => (None, None),
            };
            tokio::spawn(pump(ar, pw, to_passive, None));
            let inject = match tamper {
                Tamper::InjectToActive(len) => Some(len),
                _ => None,
            };
            tokio::spawn(pump(pr, aw, to_active, inject));
        }
    });
    addr
}

/// Copies `from` to `to`, flipping a bit of byte `flip` if set, injecting
/// frames after the first two if `inject` is set.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    flip: Option<usize>,
    inject: Option<u32>,
) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut at = 0usize;
    // Bytes of the first two frames still to forward before injecting.
    let mut before_inject: Option<usize> = None;
    let mut head = Vec::new();
    if let Some(len) = inject {
        // Read the two handshake frames exactly.
        let mut left = 2;
        while left > 0 {
            let mut h = [0u8; wire::HEADER_LEN];
            if from.read_exact(&mut h).await.is_err() {
                return;
            }
            let body = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
            let mut b = vec![0u8; body];
            if from.read_exact(&mut b).await.is_err() {
                return;
            }
            head.extend_from_slice(&h);
            head.extend_from_slice(&b);
            left -= 1;
        }
        if to.write_all(&head).await.is_err() {
            return;
        }
        before_inject = Some(len as usize);
    }
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(len) = before_inject.take() {
            // The passive side answers the first request: our frames first.
            let mut forged = Message::Data(Data {
                req: 1,
                desc: 0,
                offset: 0,
                len: len as u32,
            })
            .to_vec();
            forged.resize(forged.len() + len, 0xBB);
            Message::Finish { req: 1 }.encode(&mut forged);
            if to.write_all(&forged).await.is_err() {
                break;
            }
        }
        if let Some(f) = flip {
            if (at..at + n).contains(&f) {
                buf[f - at] ^= 0x80;
            }
        }
        at += n;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The metadata with its address replaced by the relay's.
fn via(relay: SocketAddr, real: SocketAddr, m: &RdmaMetadata) -> RdmaMetadata {
    let json = m.to_json();
    let altered = json.replace(&real.to_string(), &relay.to_string());
    assert_ne!(json, altered, "the metadata names {real}");
    RdmaMetadata::from_json(&altered).unwrap()
}

fn is_refusal(e: &Error) -> bool {
    matches!(e, Error::Protocol { .. } | Error::ConnectionLost { .. })
}

/// Writes `size` bytes of 0x01 through a relay; returns both sides' results
/// and what the destination holds.
async fn write_through(
    size: usize,
    tamper: Tamper,
) -> (
    ferry::Result<()>,
    ferry::Result<()>,
    OperationStatus,
    Vec<u8>,
) {
    let (a, p) = (connector().await, connector().await);
    let w = p
        .create_writable(vec![vec![0u8; size].into()])
        .await
        .unwrap();
    let r = relay(p.local_addr(), tamper).await;
    let m = via(r, p.local_addr(), w.metadata());
    let op = a
        .begin_write(vec![vec![1u8; size].into()], &m)
        .await
        .unwrap();
    let active = op.wait_for_completion_timeout(WAIT).await;
    let passive = w.wait_for_completion_timeout(WAIT).await;
    let status = w.status();
    let held = w.into_descriptors()[0].as_slice().unwrap().to_vec();
    (active, passive, status, held)
}

/// Reads `size` bytes of 0x01 through a relay; returns both sides' results
/// and what the destination holds.
async fn read_through(
    size: usize,
    tamper: Tamper,
) -> (
    ferry::Result<()>,
    ferry::Result<()>,
    OperationStatus,
    OperationStatus,
    Vec<u8>,
) {
    let (a, p) = (connector().await, connector().await);
    let readable = p
        .create_readable(vec![vec![1u8; size].into()])
        .await
        .unwrap();
    let r = relay(p.local_addr(), tamper).await;
    let m = via(r, p.local_addr(), readable.metadata());
    let op = a
        .begin_read(&m, vec![vec![0u8; size].into()])
        .await
        .unwrap();
    let active = op.wait_for_completion_timeout(WAIT).await;
    let passive = readable.wait_for_completion_timeout(WAIT).await;
    let (sa, sp) = (op.status(), readable.status());
    let held = op.into_descriptors()[0].as_slice().unwrap().to_vec();
    (active, passive, sa, sp, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_forwards_every_byte_unchanged_is_harmless() {
    for size in [4096, 64 << 10, 4 << 20] {
        let (active, passive, status, held) = write_through(size, Tamper::None).await;
        active.unwrap();
        passive.unwrap();
        assert_eq!(status, OperationStatus::Complete);
        assert!(held.iter().all(|&b| b == 1), "write of {size}");
        let (active, passive, _, _, held) = read_through(size, Tamper::None).await;
        active.unwrap();
        passive.unwrap();
        assert!(held.iter().all(|&b| b == 1), "read of {size}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_alters_a_byte_of_a_write_is_refused() {
    // 1 MiB: the `Open` travels first, then the payload; byte 40,000 of the
    // stream lies inside the payload whatever the handshake's length.
    let (active, passive, status, held) =
        write_through(1 << 20, Tamper::FlipToPassive(40_000)).await;
    let active = active.expect_err("the writer must not complete");
    assert!(is_refusal(&active), "{active}");
    assert_ne!(status, OperationStatus::Complete, "{passive:?}");
    if let Err(e) = &passive {
        assert!(is_refusal(e) || matches!(e, Error::Timeout(_)), "{e}");
    }
    assert!(
        held.iter().all(|&b| b == 0 || b == 1),
        "the relay's byte reached the destination"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_alters_a_byte_of_a_read_is_refused() {
    let (active, passive, sa, sp, held) = read_through(1 << 20, Tamper::FlipToActive(40_000)).await;
    let active = active.expect_err("the reader must not complete");
    assert!(is_refusal(&active), "{active}");
    assert_eq!(sa, OperationStatus::Errored);
    let passive = passive.expect_err("the exposing side must not complete");
    assert!(is_refusal(&passive), "{passive}");
    assert_eq!(sp, OperationStatus::Errored);
    assert!(
        held.iter().all(|&b| b == 0 || b == 1),
        "the relay's byte reached the destination"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_injects_frames_of_its_own_is_refused() {
    let size = 64 << 10;
    let (active, passive, sa, sp, held) =
        read_through(size, Tamper::InjectToActive(size as u32)).await;
    let active = active.expect_err("the reader must not complete with the relay's bytes");
    assert!(is_refusal(&active), "{active}");
    assert_eq!(sa, OperationStatus::Errored);
    let passive = passive.expect_err("the exposing side must not complete");
    assert!(is_refusal(&passive), "{passive}");
    assert_eq!(sp, OperationStatus::Errored);
    assert!(
        !held.contains(&0xBB),
        "the relay's bytes reached the destination"
    );
}
