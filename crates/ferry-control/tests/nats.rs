//! The hand-over over NATS, against a real `nats-server` that each test
//! starts on a free port (skipped, with the reason printed, when it is not
//! installed).

mod support;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use ferry_control::{Error, NatsChannel};
use support::{connector, read_and_check, readable, spawn_self, NatsServer};

const SECOND: Duration = Duration::from_secs(1);

async fn channel(s: &NatsServer) -> NatsChannel {
    NatsChannel::connect(&s.url(), 5 * SECOND)
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_fetch_and_read() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let (prefill, decode) = (connector().await, connector().await);
    let (pub_side, fetch_side) = (channel(&server).await, channel(&server).await);
    let op = readable(&prefill, 1, 1 << 20).await;
    let _p = pub_side.publish("req-1", op.metadata()).await.unwrap();
    let got = fetch_side.fetch("req-1", 5 * SECOND).await.unwrap();
    assert_eq!(got.to_json(), op.metadata().to_json());
    read_and_check(&decode, &got, 1, 1 << 20).await;
    op.wait_for_completion_timeout(5 * SECOND).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_withdrawn_and_duplicate_keys() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let prefill = connector().await;
    let ch = channel(&server).await;
    let t = Instant::now();
    let e = ch
        .fetch("nobody", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::NotFound { ref key, .. } if key == "nobody"),
        "{e}"
    );
    assert!(t.elapsed() < 2 * SECOND, "{:?}", t.elapsed());

    let op = readable(&prefill, 2, 64).await;
    let p = ch.publish("k", op.metadata()).await.unwrap();
    let e = ch.publish("k", op.metadata()).await.unwrap_err();
    assert!(matches!(e, Error::AlreadyPublished { .. }), "{e}");
    ch.fetch("k", SECOND).await.unwrap();
    p.withdraw();
    // The unsubscription reaches the server a moment later: a request in
    // between goes unanswered, the next one finds no responder.
    let e = ch.fetch("k", 2 * SECOND).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    // Published again after the withdrawal: served again.
    let _p = ch.publish("k", op.metadata()).await.unwrap();
    ch.fetch("k", SECOND).await.unwrap();

    let e = ch.fetch("a.b", SECOND).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
    let e = ch.clone().with_prefix("bad..prefix").unwrap_err();
    assert!(matches!(e, Error::InvalidPrefix { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_keep_apart() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let prefill = connector().await;
    let a = channel(&server).await.with_prefix("tenant-a.kv").unwrap();
    let b = channel(&server).await.with_prefix("tenant-b.kv").unwrap();
    let op = readable(&prefill, 3, 64).await;
    let _p = a.publish("r", op.metadata()).await.unwrap();
    a.fetch("r", SECOND).await.unwrap();
    let e = b.fetch("r", Duration::from_millis(200)).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_fails_within_the_deadline() {
    let url = format!("nats://127.0.0.1:{}", support::free_port());
    let t = Instant::now();
    let e = NatsChannel::connect(&url, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoServer { .. }), "{e}");
    assert!(t.elapsed() < 3 * SECOND, "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_between_hand_overs() {
    let Some(mut server) = NatsServer::start() else {
        return;
    };
    let (prefill, decode) = (connector().await, connector().await);
    let (pub_side, fetch_side) = (channel(&server).await, channel(&server).await);
    let first = readable(&prefill, 4, 4096).await;
    let _p1 = pub_side.publish("before", first.metadata()).await.unwrap();
    let got = fetch_side.fetch("before", 5 * SECOND).await.unwrap();
    read_and_check(&decode, &got, 4, 4096).await;

    server.restart();
    // Both clients reconnect by themselves; the publisher subscribes again,
    // and one published while reconnecting is subscribed on reconnection.
    let second = readable(&prefill, 5, 4096).await;
    let _p2 = pub_side.publish("after", second.metadata()).await.unwrap();
    let t = Instant::now();
    let got = fetch_side.fetch("after", 10 * SECOND).await.unwrap();
    eprintln!("hand-over after a restart took {:?}", t.elapsed());
    read_and_check(&decode, &got, 5, 4096).await;
    let again = fetch_side.fetch("before", 5 * SECOND).await.unwrap();
    assert_eq!(again.to_json(), first.metadata().to_json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_gone_fails_clearly_within_the_deadline() {
    let Some(mut server) = NatsServer::start() else {
        return;
    };
    let prefill = connector().await;
    let (pub_side, fetch_side) = (channel(&server).await, channel(&server).await);
    let op = readable(&prefill, 6, 64).await;
    let _p = pub_side.publish("k", op.metadata()).await.unwrap();
    server.stop();
    let deadline = Duration::from_millis(1500);
    let t = Instant::now();
    let e = fetch_side.fetch("k", deadline).await.unwrap_err();
    assert!(
        matches!(e, Error::ServerGone { .. } | Error::Timeout { .. }),
        "{e}"
    );
    assert!(t.elapsed() < deadline + SECOND, "{:?}", t.elapsed());
    eprintln!("with the server gone: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_responder_gives_a_typed_error_at_once() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let ch = channel(&server).await;
    // Something else answers on the subject: garbage, then valid JSON of
    // the wrong shape.
    let rogue = ch.client().subscribe("ferry.metadata.rogue").await.unwrap();
    let client = ch.client().clone();
    let answering = tokio::spawn(async move {
        use futures_util::StreamExt;
        let mut rogue = rogue;
        let replies = [&b"\x00\xffnot json"[..], b"{\"v\": 99}"];
        let mut i = 0;
        while let Some(m) = rogue.next().await {
            let reply = replies[i % replies.len()];
            i += 1;
            let _ = client.publish(m.reply.unwrap(), reply.into()).await;
        }
    });
    ch.client().flush().await.unwrap();
    for _ in 0..2 {
        let t = Instant::now();
        let e = ch.fetch("rogue", 5 * SECOND).await.unwrap_err();
        assert!(matches!(e, Error::InvalidMetadata(_)), "{e}");
        assert!(t.elapsed() < SECOND, "not retried: {:?}", t.elapsed());
    }
    answering.abort();
}

/// Child process: the prefill worker of `cross_process_prefill_decode`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_nats_prefill() {
    let Ok(url) = std::env::var("FERRY_CTL_CHILD_NATS") else {
        return;
    };
    let prefill = connector().await;
    let ch = NatsChannel::connect(&url, 5 * SECOND).await.unwrap();
    let op = readable(&prefill, 7, 3 << 20).await;
    let _p = ch.publish("req-xp", op.metadata()).await.unwrap();
    println!("\nREADY");
    op.wait_for_completion_timeout(30 * SECOND).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_process_prefill_decode() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let mut child = spawn_self(
        "child_nats_prefill",
        &[("FERRY_CTL_CHILD_NATS", server.url())],
    );
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    // Reads every line, so that the child never writes to a closed pipe.
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if line.contains("READY") {
                let _ = ready_tx.send(());
            }
        }
    });
    ready
        .recv_timeout(30 * SECOND)
        .expect("the prefill process never got ready");
    let decode = connector().await;
    let ch = channel(&server).await;
    let got = ch.fetch("req-xp", 10 * SECOND).await.unwrap();
    read_and_check(&decode, &got, 7, 3 << 20).await;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the prefill process failed: {status}");
}
