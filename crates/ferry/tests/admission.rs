//! Connections that prove nothing cost little and cannot lock real peers
//! out: a connection that says hello and then stalls is closed once idle,
//! and a flood of connections that present no capability is bounded while
//! real peers keep working (their connections are never evicted while they
//! carry an operation, nor by a flood from other networks before their
//! first one). Spent capabilities: `admission_spent.rs`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferry::{Connector, Descriptor, RdmaMetadata, TransportKind};
use ferry_proto::wire::{self, Hello, Message, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

async fn target(idle: Duration, max: usize) -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .idle_timeout(idle)
        .max_connections(max)
        .build()
        .await
        .unwrap()
}

/// A raw connection that says hello (and reads the answer) from `from`.
async fn hello(c: &Connector, from: &str) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = sock.connect(c.local_addr()).await.unwrap();
    let h = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "mute".into(),
    });
    s.write_all(&h.to_vec()).await.unwrap();
    let mut answer = [0u8; 8];
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut answer)).await;
    s
}

/// Whether the other end has closed `s` (within `wait`).
async fn closed(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let end = Instant::now() + wait;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

async fn transfer(from: &Connector, to: &Connector) {
    let w = to
        .create_writable(vec![Descriptor::from_vec(vec![0u8; 4096])])
        .await
        .unwrap();
    let op = from
        .begin_write(vec![Descriptor::from_vec(vec![7u8; 4096])], w.metadata())
        .await
        .unwrap();
    op.wait_for_completion_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    w.wait_for_completion().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_says_hello_and_stalls_is_closed_once_idle() {
    let t = target(Duration::from_millis(300), 64).await;
    let mut s = hello(&t, "127.0.0.1").await;
    assert!(
        closed(&mut s, Duration::from_secs(10)).await,
        "a connection idle for 30 times its idle timeout was kept"
    );
    // A real peer's pooled connection idles out (or is replaced when idle
    // for half the timeout): the next transfer reconnects and completes.
    let peer = target(Duration::from_millis(300), 64).await;
    transfer(&peer, &t).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        peer.connection_count(),
        0,
        "the idle connection left the pool"
    );
    transfer(&peer, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_capability_cannot_lock_real_peers_out() {
    let max = 64;
    let t = target(Duration::from_secs(60), max).await;
    // A real peer whose connection is proven before the flood.
    let early = target(Duration::from_secs(60), max).await;
    transfer(&early, &t).await;
    // The flood, from two addresses.
    let mut flood = Vec::new();
    for i in 0..(3 * max) {
        let from = if i % 4 == 0 { "127.0.0.2" } else { "127.0.0.1" };
        flood.push(hello(&t, from).await);
    }
    // A new real peer still gets in, and the early one keeps its connection.
    let late = target(Duration::from_secs(60), max).await;
    transfer(&late, &t).await;
    transfer(&early, &t).await;
    assert_eq!(early.connection_count(), 1);
    // What the flood still holds is bounded.
    let mut open = 0;
    for s in &mut flood {
        if !closed(s, Duration::from_millis(20)).await {
            open += 1;
        }
    }
    let unproven = ferry::unproven_cap(max);
    assert!(
        open <= unproven,
        "{open} of {} connections that presented nothing are still open (bound {unproven})",
        flood.len()
    );
}

/// Whether the other end still holds `s` open (what it sent is skipped).
fn still_open(s: &TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// One frame read whole from `from` (its header, then its body).
async fn read_frame(from: &mut tokio::net::tcp::OwnedReadHalf) -> std::io::Result<Vec<u8>> {
    let mut f = vec![0u8; wire::HEADER_LEN];
    from.read_exact(&mut f).await?;
    let body = u32::from_le_bytes([f[4], f[5], f[6], f[7]]) as usize;
    f.resize(wire::HEADER_LEN + body, 0);
    from.read_exact(&mut f[wire::HEADER_LEN..]).await?;
    Ok(f)
}

/// A relay to `target` for one connection: it passes the peer's first
/// `handshake` frames (its `Hello`, and with a secret its `Auth`) and the
/// listener's answers, then holds what the peer sends next (its first
/// `Open`: the listener has accepted the connection and finished its
/// handshake by then) until `gate` opens, and says so on `held`.
async fn gated_relay(
    target: SocketAddr,
    handshake: usize,
    held: oneshot::Sender<()>,
    mut gate: watch::Receiver<bool>,
) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (active, _) = l.accept().await.unwrap();
        let passive = TcpStream::connect(target).await.unwrap();
        let (mut ar, mut aw) = active.into_split();
        let (mut pr, mut pw) = passive.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut pr, &mut aw).await;
            let _ = aw.shutdown().await;
        });
        for _ in 0..handshake {
            let Ok(f) = read_frame(&mut ar).await else {
                return;
            };
            if pw.write_all(&f).await.is_err() {
                return;
            }
        }
        let mut first = vec![0u8; 64 * 1024];
        let Ok(n) = ar.read(&mut first).await else {
            return;
        };
        let _ = held.send(());
        let _ = gate.wait_for(|open| *open).await;
        if pw.write_all(&first[..n]).await.is_ok() {
            let _ = tokio::io::copy(&mut ar, &mut pw).await;
        }
        let _ = pw.shutdown().await;
    });
    addr
}

/// The metadata with its address replaced by the relay's.
fn via(relay: SocketAddr, real: SocketAddr, m: &RdmaMetadata) -> RdmaMetadata {
    let json = m.to_json();
    let altered = json.replace(&real.to_string(), &relay.to_string());
    assert_ne!(json, altered, "the metadata names {real}");
    RdmaMetadata::from_json(&altered).unwrap()
}

const SECRET: &str = "the-deployment-secret-of-the-admission-tests";

fn builder(secret: bool) -> ferry::ConnectorBuilder {
    let b = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .idle_timeout(Duration::from_secs(60))
        .max_connections(ferry::DEFAULT_MAX_CONNECTIONS);
    if secret {
        b.secret(SECRET)
    } else {
        b
    }
}

/// Flood connection `i` (of 400): from 200 addresses of ten /24 networks
/// of the loopback range (127.10.0.1 to 127.19.0.20), none the network of
/// the real peers (127.0.0.1), two connections each.
fn flood_source(i: usize) -> String {
    let a = i % 200;
    format!("127.{}.0.{}", 10 + a / 20, 1 + a % 20)
}

/// A peer whose connection has been accepted (with a secret: has
/// authenticated) but whose first `Open` has not arrived yet, and 400
/// connections from 200 other addresses that say hello (or, with a
/// secret, that cannot authenticate): the peer's transfer completes.
async fn a_flood_from_200_addresses_while_a_peer_is_about_to_open(secret: bool) {
    let t = builder(secret).build().await.unwrap();
    let peer = builder(secret).build().await.unwrap();
    let w = t
        .create_writable(vec![Descriptor::from_vec(vec![0u8; 4096])])
        .await
        .unwrap();
    let (held_tx, held) = oneshot::channel();
    let (gate, gate_rx) = watch::channel(false);
    let handshake = if secret { 2 } else { 1 };
    let relay = gated_relay(t.local_addr(), handshake, held_tx, gate_rx).await;
    let m = via(relay, t.local_addr(), w.metadata());
    let write = tokio::spawn(async move {
        let op = peer
            .begin_write(vec![Descriptor::from_vec(vec![7u8; 4096])], &m)
            .await?;
        op.wait_for_completion_timeout(Duration::from_secs(20))
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("the peer connected through the relay")
        .unwrap();
    let mut flood = Vec::new();
    for i in 0..400 {
        flood.push(hello(&t, &flood_source(i)).await);
    }
    // A new peer gets in meanwhile.
    let late = builder(secret).build().await.unwrap();
    transfer(&late, &t).await;
    gate.send_replace(true);
    let r = write.await.unwrap();
    assert!(
        r.is_ok(),
        "the peer's connection was closed by the flood before its first Open: {r:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), w.wait_for_completion())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.into_descriptors()[0].as_slice().unwrap(), &[7u8; 4096]);
    // What the flood still holds is bounded (once the evicted have closed).
    let bound = ferry::unproven_cap(ferry::DEFAULT_MAX_CONNECTIONS);
    let mut open = usize::MAX;
    for _ in 0..100 {
        open = flood.iter().filter(|s| still_open(s)).count();
        if open <= bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        open <= bound,
        "{open} flood connections are open (bound {bound})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_200_addresses_cannot_evict_a_capability_holder() {
    a_flood_from_200_addresses_while_a_peer_is_about_to_open(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_200_addresses_cannot_evict_a_holder_of_the_secret() {
    a_flood_from_200_addresses_while_a_peer_is_about_to_open(true).await;
}

/// With a secret, connections that authenticated are evicted only after
/// every one that did not, wherever the flood comes from: here 200
/// networks, one connection each, none more crowded than the peer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_flood_from_200_networks_cannot_evict_an_authenticated_peer() {
    let t = builder(true).build().await.unwrap();
    let peer = builder(true).build().await.unwrap();
    let w = t
        .create_writable(vec![Descriptor::from_vec(vec![0u8; 4096])])
        .await
        .unwrap();
    let (held_tx, held) = oneshot::channel();
    let (gate, gate_rx) = watch::channel(false);
    let relay = gated_relay(t.local_addr(), 2, held_tx, gate_rx).await;
    let m = via(relay, t.local_addr(), w.metadata());
    let write = tokio::spawn(async move {
        let op = peer
            .begin_write(vec![Descriptor::from_vec(vec![7u8; 4096])], &m)
            .await?;
        op.wait_for_completion_timeout(Duration::from_secs(20))
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    let mut flood = Vec::new();
    for i in 0..200 {
        flood.push(hello(&t, &format!("127.{}.{}.1", 1 + i / 100, i % 100)).await);
    }
    gate.send_replace(true);
    let r = write.await.unwrap();
    assert!(r.is_ok(), "the authenticated peer was evicted: {r:?}");
    tokio::time::timeout(Duration::from_secs(10), w.wait_for_completion())
        .await
        .unwrap()
        .unwrap();
}
