//! The hand-over over HTTP, against the real server on loopback, and
//! against hostile or broken servers and clients.

mod support;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use ferry_control::{Error, HttpClient, HttpServer, HTTP_PATH};
use support::{connector, read_and_check, readable, spawn_self};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_fetch_and_read() {
    let (prefill, decode) = (connector().await, connector().await);
    let server = HttpServer::bind("127.0.0.1:0").await.unwrap();
    let op = readable(&prefill, 1, 1 << 20).await;
    let p = server.publish("req-1", op.metadata()).unwrap();
    assert_eq!(p.key(), "req-1");
    assert_eq!(server.published(), 1);
    let client = HttpClient::new(format!("http://{}/", server.local_addr()));
    let got = client.fetch("req-1", 5 * SECOND).await.unwrap();
    assert_eq!(got.to_json(), op.metadata().to_json());
    read_and_check(&decode, &got, 1, 1 << 20).await;
    op.wait_for_completion_timeout(5 * SECOND).await.unwrap();
    drop(p);
    assert_eq!(server.published(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_withdrawn_duplicate_and_invalid_keys() {
    let prefill = connector().await;
    let server = HttpServer::bind("127.0.0.1:0").await.unwrap();
    let client = HttpClient::new(server.local_addr().to_string());
    let t = Instant::now();
    let e = client
        .fetch("nobody", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::NotFound { ref key, .. } if key == "nobody"),
        "{e}"
    );
    assert!(t.elapsed() < 2 * SECOND, "{:?}", t.elapsed());

    let op = readable(&prefill, 2, 64).await;
    let p = server.publish("k", op.metadata()).unwrap();
    let e = server.publish("k", op.metadata()).unwrap_err();
    assert!(matches!(e, Error::AlreadyPublished { .. }), "{e}");
    client.fetch("k", SECOND).await.unwrap();
    p.withdraw();
    let e = client.fetch_once_within("k", SECOND).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");

    for bad in ["", "a/b", "a b", &"k".repeat(129)] {
        let e = client.fetch(bad, SECOND).await.unwrap_err();
        assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
        assert!(matches!(
            server.publish(bad, op.metadata()),
            Err(Error::InvalidKey { .. })
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_then_a_late_one() {
    let port = support::free_port();
    let client = HttpClient::new(format!("127.0.0.1:{port}"));
    let t = Instant::now();
    let e = client
        .fetch("k", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoServer { .. }), "{e}");
    assert!(t.elapsed() < 2 * SECOND, "{:?}", t.elapsed());

    // A fetch that starts before the server (and its publication) is up.
    let prefill = connector().await;
    let op = readable(&prefill, 3, 64).await;
    let fetch = tokio::spawn(async move { client.fetch("k", 10 * SECOND).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let server = HttpServer::bind(&format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _p = server.publish("k", op.metadata()).unwrap();
    let got = fetch.await.unwrap().unwrap();
    assert_eq!(got.to_json(), op.metadata().to_json());

    // Dropping the server stops it.
    drop(server);
    let client = HttpClient::new(format!("127.0.0.1:{port}"));
    let e = client
        .fetch("k", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoServer { .. }), "{e}");
    let e = HttpServer::bind("256.0.0.1:1").await.unwrap_err();
    assert!(matches!(e, Error::Bind { .. }), "{e}");
}

/// A server that answers every connection with `reply` (then closes).
async fn fake_server(reply: &'static [u8]) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_servers_give_typed_errors() {
    let deadline = Duration::from_millis(400);
    let check = |addr: String, what: &'static str| async move {
        let t = Instant::now();
        let e = HttpClient::new(addr)
            .fetch("k", deadline)
            .await
            .unwrap_err();
        assert!(t.elapsed() < deadline + SECOND, "{what}: {:?}", t.elapsed());
        e
    };
    // Accepts, reads the request, closes without a word.
    let e = check(fake_server(b"").await, "silent close").await;
    assert!(matches!(e, Error::ServerGone { .. }), "{e}");
    let e = check(fake_server(b"SSH-2.0-OpenSSH\r\n\r\n").await, "not HTTP").await;
    assert!(matches!(e, Error::BadReply { .. }), "{e}");
    let e = check(
        fake_server(b"HTTP/1.1 500 Internal\r\ncontent-length: 4\r\n\r\noops").await,
        "500",
    )
    .await;
    assert!(
        matches!(e, Error::Refused { status: 500, ref reason, .. } if reason == "oops"),
        "{e}"
    );
    let e = check(
        fake_server(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{\"v\": 99}").await,
        "not metadata",
    )
    .await;
    assert!(matches!(e, Error::InvalidMetadata(_)), "{e}");
    let e = check(
        fake_server(b"HTTP/1.1 200 OK\r\ncontent-length: 99999999\r\n\r\n{").await,
        "oversized",
    )
    .await;
    assert!(matches!(e, Error::BadReply { .. }), "{e}");
    // Accepts and never answers: the deadline.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let hold = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            conns.push(s);
        }
    });
    let e = check(addr, "mute").await;
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    hold.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_do_not_stall_the_server() {
    let prefill = connector().await;
    let server = HttpServer::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr();
    let op = readable(&prefill, 4, 64).await;
    let _p = server.publish("k", op.metadata()).unwrap();
    // Connections that send nothing, half a request, or garbage.
    let mut idle = Vec::new();
    for junk in [&b""[..], b"GET /ferry/v1/met", b"\x00\xff garbage\r\n\r\n"] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(junk).await.unwrap();
        idle.push(s);
    }
    let raw = |req: String| async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(2 * SECOND, s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    };
    let close = "connection: close\r\n\r\n";
    let r = raw(format!(
        "GET {HTTP_PATH}a..b HTTP/1.1\r\nhost: x\r\n{close}"
    ))
    .await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    let r = raw(format!("POST {HTTP_PATH}k HTTP/1.1\r\nhost: x\r\n{close}")).await;
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
    let r = raw(format!("GET /other HTTP/1.1\r\nhost: x\r\n{close}")).await;
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    let r = raw(format!("GET {HTTP_PATH}k HTTP/1.1\r\nhost: x\r\n{close}")).await;
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("no-store"),
        "{r}"
    );
    // And the real client still gets its answer at once.
    let t = Instant::now();
    HttpClient::new(addr.to_string())
        .fetch("k", 2 * SECOND)
        .await
        .unwrap();
    assert!(t.elapsed() < SECOND, "{:?}", t.elapsed());
}

/// Child process: the prefill worker of `cross_process_prefill_decode`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_http_prefill() {
    if std::env::var_os("FERRY_CTL_CHILD_HTTP").is_none() {
        return;
    }
    let prefill = connector().await;
    let server = HttpServer::bind("127.0.0.1:0").await.unwrap();
    let op = readable(&prefill, 7, 3 << 20).await;
    let _p = server.publish("req-xp", op.metadata()).unwrap();
    println!("\nREADY {}", server.local_addr());
    op.wait_for_completion_timeout(30 * SECOND).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_process_prefill_decode() {
    let mut child = spawn_self(
        "child_http_prefill",
        &[("FERRY_CTL_CHILD_HTTP", "1".into())],
    );
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("READY ") {
                let _ = ready_tx.send(addr.to_owned());
            }
        }
    });
    let addr = ready
        .recv_timeout(30 * SECOND)
        .expect("the prefill process never got ready");
    let decode = connector().await;
    let got = HttpClient::new(addr)
        .fetch("req-xp", 10 * SECOND)
        .await
        .unwrap();
    read_and_check(&decode, &got, 7, 3 << 20).await;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the prefill process failed: {status}");
}

/// Keeps `n` connections to `addr` open that never send a byte, opening a
/// new one (20 ms later) whenever the server closes one; returns how many
/// it has opened.
fn silent_flood(
    addr: std::net::SocketAddr,
    n: usize,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let opened = std::sync::Arc::new(AtomicUsize::new(0));
    let count = opened.clone();
    let task = tokio::spawn(async move {
        let mut holders = tokio::task::JoinSet::new();
        for _ in 0..n {
            let count = count.clone();
            holders.spawn(async move {
                loop {
                    let Ok(mut s) = TcpStream::connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    count.fetch_add(1, Ordering::Relaxed);
                    // Silent until the server closes it.
                    let mut b = [0u8; 1];
                    let _ = s.read(&mut b).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        }
        while holders.join_next().await.is_some() {}
    });
    (task, opened)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_cannot_delay_the_hand_over() {
    let prefill = connector().await;
    let server = HttpServer::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr();
    let op = readable(&prefill, 5, 64).await;
    let _p = server.publish("k", op.metadata()).unwrap();
    // More silent connections than the server keeps, each replaced when
    // the server closes it.
    let n = 256 + 4; // ferry_control::MAX_CONNECTIONS + 4
    let (flood, opened) = silent_flood(addr, n);
    let t = Instant::now();
    while opened.load(std::sync::atomic::Ordering::Relaxed) < n {
        assert!(t.elapsed() < 20 * SECOND, "the flood did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Fetches still get their answer, well before a silent connection's
    // header deadline (5 s) would have freed a place.
    let client = HttpClient::new(addr.to_string());
    for i in 0..5 {
        let t = Instant::now();
        let got = client.fetch("k", 3 * SECOND).await;
        assert!(got.is_ok(), "fetch {i} after {:?}: {got:?}", t.elapsed());
    }
    flood.abort();
}
