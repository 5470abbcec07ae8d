//! A spent capability keeps no place on the listener: a connection counts
//! as proven only while it carries a live operation, and its idle clock
//! runs from the last one, whatever frames it sends afterwards. (The
//! listener's other bounds: `admission.rs`.)

use std::time::Duration;

use ferry::{Connector, OperationKind, TransportKind};
use ferry_proto::wire::Message;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod support;

use support::*;

/// Parts of each striped transfer (`wire::MAX_PARTS`).
const PARTS: u16 = 16;

/// Room for the test's connections in this process (both ends of each):
/// the soft limit on open files up to the hard one.
fn enough_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is valid for writes of one `rlimit`.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid `rlimit` (the soft limit up to the hard one).
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert!(
        lim.rlim_max >= 4096,
        "this test needs 4,096 open files (the hard limit is {})",
        lim.rlim_max
    );
}

fn target(idle: Duration) -> ferry::ConnectorBuilder {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .idle_timeout(idle)
        .max_connections(ferry::DEFAULT_MAX_CONNECTIONS)
}

/// Uses one capability: a striped WRITE of `PARTS` parts, one byte each, on
/// `PARTS` connections of its own, every part confirmed and the whole
/// committed. Returns the connections, which stay open.
async fn spend(t: &Connector) -> Vec<Raw> {
    let w = t
        .create_writable(vec![untouched(PARTS as usize)])
        .await
        .unwrap();
    let m = w.metadata().clone();
    let mut conns = Vec::new();
    for _ in 0..PARTS {
        conns.push(Raw::connect_as(t, "spender").await);
    }
    for (i, r) in conns.iter_mut().enumerate() {
        r.send(&part_open(1, &m, OperationKind::Write, i as u16, PARTS))
            .await;
    }
    // Part 0 last: its commit ends the operation.
    for i in (0..PARTS as usize).rev() {
        let r = &mut conns[i];
        r.send_raw(&data_frame(1, 0, i as u64, &[i as u8]))
            .await
            .unwrap();
        r.send(&Message::Finish { req: 1 }).await;
        match r.next().await {
            Some((Message::Finish { req: 1 }, _)) => {}
            other => panic!("expected part {i} to be confirmed, got {other:?}"),
        }
    }
    within(w.wait_for_completion()).await.unwrap();
    let want: Vec<u8> = (0..PARTS as u8).collect();
    assert_eq!(w.into_descriptors()[0].as_slice().unwrap(), &want[..]);
    conns
}

/// Whether the other end still holds `s` open (what it sent is skipped).
fn still_open(s: &tokio::net::TcpStream) -> bool {
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

/// Sends junk on every connection every `every` (a `Finish` for a request
/// that does not exist, which the listener ignores) until `stop`; then
/// returns how many the listener has closed.
fn junk(
    mut conns: Vec<Raw>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<usize> {
    tokio::spawn(async move {
        let frame = Message::Finish { req: 999 }.to_vec();
        let mut closed = vec![false; conns.len()];
        loop {
            for (r, c) in conns.iter_mut().zip(&mut closed) {
                if !*c && r.send_raw(&frame).await.is_err() {
                    *c = true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        // A closed connection reads its end (or a reset).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut n = 0;
        for (r, c) in conns.iter().zip(&closed) {
            n += usize::from(*c || !still_open(&r.s));
        }
        n
    })
}

/// 64 capabilities, each spent on a striped transfer over 16 connections
/// (1,024, the default bound), whose connections then send junk to look
/// busy: a new peer still gets in at once, a spent connection making room
/// (that they are also closed once idle, junk or not, is the next test's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_spent_capabilities_do_not_lock_the_listener() {
    enough_files();
    // Long enough that no spent connection idles out before the new peer
    // comes: it gets in by eviction alone.
    let idle = Duration::from_secs(30);
    let t = target(idle).build().await.unwrap();
    let mut conns = Vec::new();
    for _ in 0..64 {
        conns.extend(spend(&t).await);
    }
    assert_eq!(conns.len(), ferry::DEFAULT_MAX_CONNECTIONS);
    let (stop, stop_rx) = watch::channel(false);
    let junk = junk(conns, Duration::from_millis(200), stop_rx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A new peer, and then another (both kept, with their connections).
    let mut peers = Vec::new();
    for _ in 0..2 {
        peers.push(connector().await);
        let peer = &peers[peers.len() - 1];
        let w = t.create_writable(vec![untouched(4096)]).await.unwrap();
        let op = peer
            .begin_write(vec![vec![5u8; 4096].into()], w.metadata())
            .await
            .expect("a new peer connects to a listener full of spent connections");
        op.wait_for_completion_timeout(Duration::from_secs(10))
            .await
            .expect("a new peer's transfer completes");
        within(w.wait_for_completion()).await.unwrap();
    }
    stop.send_replace(true);
    let closed = junk.await.unwrap();
    assert!(closed >= 2, "{closed} spent connections made room");
    assert_no_library_panic();
}

/// The idle clock of a spent connection runs whatever frames it sends:
/// every one is closed within a few idle timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_frames_do_not_keep_a_spent_connection_open() {
    let idle = Duration::from_millis(500);
    let t = target(idle).build().await.unwrap();
    let conns = spend(&t).await;
    let (stop, stop_rx) = watch::channel(false);
    let junk = junk(conns, Duration::from_millis(100), stop_rx);
    tokio::time::sleep(idle * 6).await;
    stop.send_replace(true);
    let closed = junk.await.unwrap();
    assert_eq!(
        closed, PARTS as usize,
        "spent connections sending junk were kept open for 6 idle timeouts"
    );
    legit_transfers_still_work(&t).await;
}

/// A connection that carries a live operation stays while it does (its
/// clock runs from the last moment it did), and its operation completes.
/// (The hand-made peer stays silent for four idle timeouts and answers no
/// heartbeat: liveness is off here, `tests/liveness.rs` tests it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_a_live_operation_is_not_idle() {
    let idle = Duration::from_millis(300);
    let t = target(idle).liveness(Duration::ZERO).build().await.unwrap();
    let w = t.create_writable(vec![untouched(4)]).await.unwrap();
    let m = w.metadata().clone();
    let mut r = Raw::connect(&t).await;
    r.send(&open_frame(1, &m, OperationKind::Write)).await;
    r.send_raw(&data_frame(1, 0, 0, &[1, 2])).await.unwrap();
    tokio::time::sleep(idle * 4).await;
    r.send_raw(&data_frame(1, 0, 2, &[3, 4])).await.unwrap();
    r.send(&Message::Finish { req: 1 }).await;
    match r.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    assert_eq!(w.into_descriptors()[0].as_slice().unwrap(), &[1, 2, 3, 4]);
    // Spent now: closed once idle.
    tokio::time::timeout(idle * 10, r.closed())
        .await
        .expect("the spent connection was closed once idle");
}
