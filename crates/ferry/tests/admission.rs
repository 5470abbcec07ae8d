//! Connections that prove nothing cost little and cannot lock real peers
//! out: a connection that says hello and then stalls is closed once idle,
//! and a flood of connections that present no capability is bounded while
//! real peers keep working (their proven connections are never evicted).

use std::time::{Duration, Instant};

use ferry::{Connector, Descriptor, TransportKind};
use ferry_proto::wire::{Hello, Message, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    let unproven = (max / 8).max(ferry::UNPROVEN_PER_ADDRESS).min(max);
    assert!(
        open <= unproven,
        "{open} of {} connections that presented nothing are still open (bound {unproven})",
        flood.len()
    );
}
