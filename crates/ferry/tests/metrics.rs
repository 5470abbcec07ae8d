//! The metrics a connector counts, read as Prometheus reads them: real
//! HTTP GETs of the scrape endpoint, during and after a run of operations
//! that complete, fail and are cancelled, checked against exactly what
//! happened.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use ferry::metrics::{OpKind, Outcome};
use ferry::{Connector, Descriptor, Error, TransportKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn tcp_connector(worker: &str, metrics: SocketAddr) -> Connector {
    Connector::builder()
        .worker_id(worker)
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .metrics_addr(metrics)
        .build()
        .await
        .expect("connector starts")
}

fn zeros(sizes: &[usize]) -> Vec<Descriptor<'static>> {
    sizes.iter().map(|&n| vec![0u8; n].into()).collect()
}

fn ones(sizes: &[usize]) -> Vec<Descriptor<'static>> {
    sizes.iter().map(|&n| vec![1u8; n].into()).collect()
}

/// One scrape: `series{labels}` → value, as the endpoint printed them.
struct Scrape(HashMap<String, f64>, String);

async fn scrape(addr: SocketAddr) -> Scrape {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ferry\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head
        .to_ascii_lowercase()
        .contains("content-type: application/openmetrics-text"));
    assert!(body.ends_with("# EOF\n"), "{body}");
    let values = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, v) = l.rsplit_once(' ').unwrap();
            (series.to_string(), v.parse::<f64>().unwrap())
        })
        .collect();
    Scrape(values, body.to_string())
}

impl Scrape {
    /// The value of `name{labels}` (0 when absent: counters not yet seen).
    fn get(&self, name: &str, worker: &str, labels: &[(&str, &str)]) -> f64 {
        let mut l = format!("worker=\"{worker}\"");
        for (k, v) in labels {
            l.push_str(&format!(",{k}=\"{v}\""));
        }
        let key = format!("{name}{{{l}}}");
        self.0.get(&key).copied().unwrap_or(0.0)
    }

    /// The sum over every series of `name` of `worker` whose labels include `labels`.
    fn sum(&self, name: &str, worker: &str, labels: &[(&str, &str)]) -> f64 {
        let w = format!("worker=\"{worker}\"");
        self.0
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{name}{{")) && k.contains(&w))
            .filter(|(k, _)| {
                labels
                    .iter()
                    .all(|(n, v)| k.contains(&format!("{n}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum()
    }

    fn ops(&self, worker: &str, kind: &str, transport: &str, outcome: &str) -> (f64, f64) {
        let l = [
            ("kind", kind),
            ("transport", transport),
            ("outcome", outcome),
        ];
        (
            self.get("ferry_operations_total", worker, &l),
            self.get("ferry_operation_bytes_total", worker, &l),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_count_exactly_what_happened() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = tcp_connector("metrics-a", any).await; // passive side
    let b = tcp_connector("metrics-b", any).await; // active side
    let (ma, mb) = (a.metrics_addr().unwrap(), b.metrics_addr().unwrap());
    assert_ne!(ma, mb);

    // 3 reads of 4 KiB, complete.
    for _ in 0..3 {
        let r = a.create_readable(ones(&[4096])).await.unwrap();
        let read = b.begin_read(r.metadata(), zeros(&[4096])).await.unwrap();
        read.wait_for_completion().await.unwrap();
        r.wait_for_completion().await.unwrap();
    }
    // 2 writes of 1000 + 24 bytes, complete.
    for _ in 0..2 {
        let w = a.create_writable(zeros(&[1000, 24])).await.unwrap();
        let write = b
            .begin_write(ones(&[1000, 24]), w.metadata())
            .await
            .unwrap();
        write.wait_for_completion().await.unwrap();
        w.wait_for_completion().await.unwrap();
    }
    // A wrong pairing and a count mismatch: refused before anything starts.
    let r100 = a.create_readable(ones(&[100])).await.unwrap();
    let e = b
        .begin_write(ones(&[100]), r100.metadata())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::WrongPairing { .. }), "{e}");
    let e = b
        .begin_read(r100.metadata(), zeros(&[50, 50]))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CountMismatch { .. }), "{e}");
    // A deadline: nobody writes this writable.
    let w300 = a.create_writable(zeros(&[300])).await.unwrap();
    let e = w300
        .wait_for_completion_timeout(Duration::from_millis(20))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");

    // During: two passive operations wait, 400 bytes exposed.
    let s = scrape(ma).await;
    let in_flight =
        |s: &Scrape, k| s.get("ferry_operations_in_flight", "metrics-a", &[("kind", k)]);
    assert_eq!(in_flight(&s, "readable"), 1.0);
    assert_eq!(in_flight(&s, "writable"), 1.0);
    assert_eq!(s.get("ferry_exposed_bytes", "metrics-a", &[]), 400.0);
    assert_eq!(
        s.get("ferry_tx_bytes_total", "metrics-a", &[("transport", "tcp")]),
        3.0 * 4096.0
    );
    assert_eq!(
        s.get(
            "ferry_connections",
            "metrics-a",
            &[("direction", "inbound")]
        ),
        1.0
    );

    // Cancels, and a read of a readable its owner cancelled.
    r100.cancel();
    w300.cancel();
    let r200 = a.create_readable(ones(&[200])).await.unwrap();
    let meta = r200.metadata().clone();
    r200.cancel();
    let read = b.begin_read(&meta, zeros(&[200])).await.unwrap();
    let e = read.wait_for_completion().await.unwrap_err();
    assert!(matches!(e, Error::Rejected { .. }), "{e}");

    // The connection goes away: both sides count it closed.
    b.close_connections();
    for _ in 0..500 {
        if a.metrics().connections.open() == 0 && b.metrics().connections.open() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // After, the passive side.
    let s = scrape(ma).await;
    assert_eq!(
        s.ops("metrics-a", "readable", "tcp", "complete"),
        (3.0, 3.0 * 4096.0)
    );
    assert_eq!(
        s.ops("metrics-a", "writable", "tcp", "complete"),
        (2.0, 2048.0)
    );
    assert_eq!(
        s.ops("metrics-a", "readable", "none", "cancelled"),
        (2.0, 300.0)
    );
    assert_eq!(
        s.ops("metrics-a", "writable", "none", "cancelled"),
        (1.0, 300.0)
    );
    assert_eq!(s.sum("ferry_operations_total", "metrics-a", &[]), 8.0);
    assert_eq!(
        s.get("ferry_tx_bytes_total", "metrics-a", &[("transport", "tcp")]),
        12288.0
    );
    assert_eq!(
        s.get("ferry_rx_bytes_total", "metrics-a", &[("transport", "tcp")]),
        2048.0
    );
    assert_eq!(
        s.get(
            "ferry_tx_requests_total",
            "metrics-a",
            &[("transport", "tcp")]
        ),
        3.0
    );
    assert_eq!(
        s.get(
            "ferry_rx_requests_total",
            "metrics-a",
            &[("transport", "tcp")]
        ),
        2.0
    );
    assert_eq!(
        s.get("ferry_errors_total", "metrics-a", &[("cause", "timeout")]),
        1.0
    );
    assert_eq!(s.sum("ferry_errors_total", "metrics-a", &[]), 1.0);
    let passive = [("side", "passive"), ("transport", "tcp")];
    assert_eq!(
        s.get("ferry_xfer_time_us_count", "metrics-a", &passive),
        5.0
    );
    let inf = [("side", "passive"), ("transport", "tcp"), ("le", "+Inf")];
    assert_eq!(s.sum("ferry_xfer_time_us_bucket", "metrics-a", &inf), 5.0);
    let top = [
        ("side", "passive"),
        ("transport", "tcp"),
        ("le", "10000000.0"),
    ];
    assert_eq!(s.sum("ferry_xfer_time_us_bucket", "metrics-a", &top), 5.0);
    assert_eq!(s.sum("ferry_operations_in_flight", "metrics-a", &[]), 0.0);
    assert_eq!(s.get("ferry_exposed_bytes", "metrics-a", &[]), 0.0);
    let fallbacks = "ferry_cuda_ipc_fallbacks_total{worker=\"metrics-a\"}";
    assert_eq!(s.0.get(fallbacks), Some(&0.0), "always present");
    let inbound = [("direction", "inbound")];
    assert_eq!(
        s.get("ferry_connections_opened_total", "metrics-a", &inbound),
        1.0
    );
    assert_eq!(
        s.get("ferry_connections_closed_total", "metrics-a", &inbound),
        1.0
    );
    assert_eq!(s.get("ferry_connections", "metrics-a", &inbound), 0.0);
    assert!(!s.1.contains("metrics-b"), "one endpoint per address");

    // After, the active side.
    let s = scrape(mb).await;
    assert_eq!(
        s.ops("metrics-b", "read", "tcp", "complete"),
        (3.0, 12288.0)
    );
    assert_eq!(
        s.ops("metrics-b", "write", "tcp", "complete"),
        (2.0, 2048.0)
    );
    let errored_read = [("kind", "read"), ("outcome", "errored")];
    assert_eq!(
        s.sum("ferry_operations_total", "metrics-b", &errored_read),
        1.0
    );
    assert_eq!(
        s.sum("ferry_operation_bytes_total", "metrics-b", &errored_read),
        200.0
    );
    assert_eq!(s.sum("ferry_operations_total", "metrics-b", &[]), 6.0);
    assert_eq!(
        s.get("ferry_tx_bytes_total", "metrics-b", &[("transport", "tcp")]),
        2048.0
    );
    assert_eq!(
        s.get("ferry_rx_bytes_total", "metrics-b", &[("transport", "tcp")]),
        12288.0
    );
    for (cause, n) in [
        ("wrong_pairing", 1.0),
        ("count_mismatch", 1.0),
        ("rejected", 1.0),
    ] {
        assert_eq!(
            s.get("ferry_errors_total", "metrics-b", &[("cause", cause)]),
            n,
            "{cause}"
        );
    }
    assert_eq!(s.sum("ferry_errors_total", "metrics-b", &[]), 3.0);
    let active = [("side", "active"), ("transport", "tcp")];
    assert_eq!(s.get("ferry_xfer_time_us_count", "metrics-b", &active), 5.0);
    let outbound = [("direction", "outbound")];
    assert_eq!(
        s.get("ferry_connections_opened_total", "metrics-b", &outbound),
        1.0
    );
    assert_eq!(
        s.get("ferry_connections_closed_total", "metrics-b", &outbound),
        1.0
    );
    assert_eq!(s.sum("ferry_operations_in_flight", "metrics-b", &[]), 0.0);

    // The snapshot API says the same.
    let m = b.metrics();
    assert_eq!(m.count(OpKind::Read, Outcome::Complete), 3);
    assert_eq!(m.count(OpKind::Read, Outcome::Errored), 1);
    assert_eq!(m.rx_bytes(), 12288);
    assert_eq!(m.tx_bytes(), 2048);
    assert_eq!(m.errors("wrong_pairing"), 1);
    let d = m
        .durations
        .iter()
        .find(|d| d.transport == Some(TransportKind::Tcp))
        .unwrap();
    assert_eq!(d.count, 5);
    assert_eq!(d.buckets.last(), Some(&(u64::MAX, 5)));
    let m = a.metrics();
    assert_eq!(m.count(OpKind::Readable, Outcome::Cancelled), 2);
    assert_eq!(m.errors("timeout"), 1);
    assert_eq!(m.connections.inbound_opened, 1);
    assert_eq!(m.connections.inbound_closed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connectors_share_an_address() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = tcp_connector("share-a", any).await;
    let addr = a.metrics_addr().unwrap();
    let b = tcp_connector("share-b", addr).await;
    assert_eq!(b.metrics_addr(), Some(addr));
    let r = a.create_readable(ones(&[10])).await.unwrap();
    let read = b.begin_read(r.metadata(), zeros(&[10])).await.unwrap();
    read.wait_for_completion().await.unwrap();
    r.wait_for_completion().await.unwrap();
    let s = scrape(addr).await;
    assert_eq!(
        s.get("ferry_tx_bytes_total", "share-a", &[("transport", "tcp")]),
        10.0
    );
    assert_eq!(
        s.get("ferry_rx_bytes_total", "share-b", &[("transport", "tcp")]),
        10.0
    );
    // Each family once, whatever the number of connectors.
    assert_eq!(s.1.matches("# TYPE ferry_tx_bytes counter").count(), 1);
    drop(b);
    let s = scrape(addr).await;
    assert!(
        !s.1.contains("share-b"),
        "a dropped connector leaves the endpoint"
    );

    // Anything but GET /metrics is turned away.
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
    // A port in use fails the build when the address was asked for.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .metrics_addr(taken.local_addr().unwrap())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_cannot_keep_a_scrape_waiting() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let c = tcp_connector("silent", "127.0.0.1:0".parse().unwrap()).await;
    let addr = c.metrics_addr().unwrap();
    // 40 connections that never send a byte (more than the endpoint keeps),
    // each replaced 50 ms after the endpoint closes it.
    let opened = Arc::new(AtomicUsize::new(0));
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let opened = opened.clone();
        flood.spawn(async move {
            loop {
                if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                    opened.fetch_add(1, Ordering::Relaxed);
                    let mut b = [0u8; 1];
                    let _ = s.read(&mut b).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    let t = std::time::Instant::now();
    while opened.load(Ordering::Relaxed) < 40 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the flood did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Scrapes are answered well before a silent connection's head deadline
    // (5 s) would have freed a place.
    for i in 0..5 {
        let t = std::time::Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(3), scrape(addr)).await;
        assert!(
            got.is_ok(),
            "scrape {i} still waiting after {:?}",
            t.elapsed()
        );
    }
    flood.abort_all();
}

/// Child of `a_port_alone_means_loopback`: a connector configured by
/// `FERRY_METRICS_ADDR` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_metrics_from_the_environment() {
    if std::env::var_os("FERRY_METRICS_CHILD").is_none() {
        return;
    }
    let c = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap();
    println!("\nMETRICS {:?}", c.metrics_addr());
    if let Some(addr) = c.metrics_addr() {
        scrape(addr).await;
        println!("SCRAPED");
    }
}

#[test]
fn a_port_alone_means_loopback() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for value in [port.to_string(), format!(":{port}")] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "child_metrics_from_the_environment",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FERRY_METRICS_CHILD", "1")
            .env("FERRY_METRICS_ADDR", &value)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{value}: {stdout}");
        assert!(
            stdout.contains(&format!("METRICS Some(127.0.0.1:{port})"))
                && stdout.contains("SCRAPED"),
            "FERRY_METRICS_ADDR={value}: {stdout}"
        );
    }
}
