//! Peers that come and go leave nothing behind: after many peers have
//! connected, transferred and exited (or never answered), this process's
//! open file descriptors and pooled connections are back where they were,
//! and a peer that restarts under the same name and address is reached
//! again.

use std::time::{Duration, Instant};

use ferry::{Connector, Descriptor, RdmaMetadata, TransportKind};

const PEERS: usize = 200;

async fn connector(worker: Option<&str>, port: u16) -> Connector {
    let mut b = Connector::builder()
        .listen(format!("127.0.0.1:{port}").parse().unwrap())
        .transports(&[TransportKind::Tcp]);
    if let Some(w) = worker {
        b = b.worker_id(w);
    }
    b.build().await.unwrap()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Reads 4 KiB from a readable of `peer` into `me`.
async fn transfer(me: &Connector, peer: &Connector, byte: u8) {
    let r = peer
        .create_readable(vec![Descriptor::from_vec(vec![byte; 4096])])
        .await
        .unwrap();
    let read = me
        .begin_read(r.metadata(), vec![Descriptor::from_vec(vec![0; 4096])])
        .await
        .unwrap();
    read.wait_for_completion().await.unwrap();
    r.wait_for_completion().await.unwrap();
    assert!(read.into_descriptors()[0]
        .as_slice()
        .unwrap()
        .iter()
        .all(|&b| b == byte));
}

/// `m` with another worker id and address: a peer that is not there.
fn elsewhere(m: &RdmaMetadata, worker: &str, addr: &str) -> RdmaMetadata {
    let mut v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
    v["worker_id"] = worker.into();
    v["addresses"] = serde_json::json!([addr]);
    RdmaMetadata::from_json(&v.to_string()).unwrap()
}

async fn settle(what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(20), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_come_and_go_leave_no_socket_and_no_pool_entry() {
    let me = connector(None, 0).await;
    // Warm up what the runtime keeps (its threads, the first connection's
    // lazily made state), then take the baseline.
    {
        let peer = connector(None, 0).await;
        transfer(&me, &peer, 1).await;
    }
    settle("the warm-up peer's connection did not end", || {
        me.connection_count() == 0
    })
    .await;
    let baseline = open_fds();

    for i in 0..PEERS {
        let peer = connector(None, 0).await;
        transfer(&me, &peer, i as u8).await;
        drop(peer);
    }
    // Peers that never answer: one whose listener closes every connection
    // at once, one where nothing listens.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_addr = mute.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in mute.incoming() {
            drop(s);
        }
    });
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_addr = gone.local_addr().unwrap().to_string();
    drop(gone);
    let template = connector(None, 0).await;
    let r = template
        .create_readable(vec![Descriptor::from_vec(vec![0; 16])])
        .await
        .unwrap();
    for i in 0..PEERS / 2 {
        for addr in [&mute_addr, &gone_addr] {
            let m = elsewhere(r.metadata(), &format!("{i:032x}"), addr);
            let read = me
                .begin_read(&m, vec![Descriptor::from_vec(vec![0; 16])])
                .await;
            if let Ok(read) = read {
                assert!(read.wait_for_completion().await.is_err());
            }
        }
    }
    drop(r);
    drop(template);

    settle(
        &format!(
            "pool entries stayed: {} (baseline 0)",
            me.connection_count()
        ),
        || me.connection_count() == 0,
    )
    .await;
    let mut now = open_fds();
    let t = Instant::now();
    while now > baseline + 2 && t.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        now = open_fds();
    }
    assert!(
        now <= baseline + 2,
        "{now} descriptors open after {PEERS} peers came and went and {PEERS} never answered \
         (baseline {baseline})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_reached_again() {
    let me = connector(None, 0).await;
    let peer = connector(Some("restarting-peer"), 0).await;
    let port = peer.local_addr().port();
    transfer(&me, &peer, 1).await;
    drop(peer);
    settle("the connection to the exited peer did not end", || {
        me.connection_count() == 0
    })
    .await;
    // The same worker, back on the same port.
    let t = Instant::now();
    let peer = loop {
        let b = Connector::builder()
            .listen(format!("127.0.0.1:{port}").parse().unwrap())
            .transports(&[TransportKind::Tcp])
            .worker_id("restarting-peer")
            .build()
            .await;
        match b {
            Ok(c) => break c,
            Err(e) => {
                assert!(t.elapsed() < Duration::from_secs(20), "rebinding: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    transfer(&me, &peer, 2).await;
    assert_eq!(me.connection_count(), 1);
}
