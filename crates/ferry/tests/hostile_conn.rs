//! Connections that announce large frames and send nothing more cost the
//! listener only the bytes they actually sent.
//!
//! Alone in its test binary: it measures this process's resident memory.

use std::time::Duration;

use ferry::{Connector, TransportKind};
use ferry_proto::wire::{self, Hello, Message, MAX_BODY, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connections of each kind.
const N: usize = 500;

/// This process's resident memory, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// An `Open` header announcing the largest body a frame may have.
fn big_header() -> Vec<u8> {
    let mut h = vec![2u8, 0, 0, 0];
    h.extend_from_slice(&MAX_BODY.to_le_bytes());
    h
}

async fn transfer_works(c: &Connector) {
    let other = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .build()
        .await
        .unwrap();
    let w = c
        .create_writable(vec![vec![0u8; 1 << 20].into()])
        .await
        .unwrap();
    let op = other
        .begin_write(vec![vec![3u8; 1 << 20].into()], w.metadata())
        .await
        .unwrap();
    op.wait_for_completion_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    w.wait_for_completion().await.unwrap();
}

/// Connection `i` of the test, from its own share of loopback addresses
/// (127.0.0.2 and up, 8 each; the connector groups them by address), so
/// that the per-group bound closes none of them.
async fn connect_from(c: &Connector, i: usize) -> TcpStream {
    let per = 8;
    let n = 2 + i / per;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(
        format!("127.0.{}.{}:0", n / 250, 2 + n % 250)
            .parse()
            .unwrap(),
    )
    .unwrap();
    sock.connect(c.local_addr()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_frames_cost_nothing_until_their_bytes_arrive() {
    // Room for every connection of the test (the admission bounds would
    // otherwise close most of them, and the memory bound could not fail).
    let c = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .max_connections(16 * 1024)
        .admission_prefixes(32, 128)
        .build()
        .await
        .unwrap();
    transfer_works(&c).await;
    let before = rss_kib();

    // Half announce a 256 KiB frame instead of a hello; the other half say
    // hello first. None sends a byte of the announced body.
    let mut early = Vec::with_capacity(N);
    let mut after_hello = Vec::with_capacity(N);
    let hello = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "announcer".into(),
    })
    .to_vec();
    for i in 0..N {
        let mut s = connect_from(&c, 2 * i).await;
        s.write_all(&big_header()).await.unwrap();
        early.push(s);
        let mut s = connect_from(&c, 2 * i + 1).await;
        let mut first = hello.clone();
        first.extend_from_slice(&big_header());
        s.write_all(&first).await.unwrap();
        after_hello.push(s);
    }
    // The listener has answered every hello: it has read the announcements.
    for s in &mut after_hello {
        let mut h = [0u8; wire::HEADER_LEN];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut h))
            .await
            .expect("the listener answers the hello")
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss_kib().saturating_sub(before);
    eprintln!(
        "resident memory grew by {grown} KiB for {} connections that announced {} KiB each",
        2 * N,
        MAX_BODY / 1024
    );

    // Announced but never sent: 2 x 500 x 256 KiB would be 250 MiB.
    assert!(
        grown < (2 * N as u64) * 16,
        "resident memory grew by {grown} KiB for {} connections that announced {} KiB each and sent 8 bytes",
        2 * N,
        MAX_BODY / 1024
    );
    // A first frame larger than any hello is refused at once.
    for s in &mut early {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b))
            .await
            .expect("the listener closes a connection whose first frame cannot be a hello");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }
    transfer_works(&c).await;
    drop(after_hello);
}
