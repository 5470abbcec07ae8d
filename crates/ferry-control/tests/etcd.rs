//! The hand-over through etcd, against a real `etcd` that each test starts
//! on free ports with a data directory of its own (skipped, with the reason
//! printed, when it is not installed; failed instead under
//! `FERRY_REQUIRE_ETCD=1`, as CI sets it).

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ferry_control::{Config, Error, EtcdStore};
use serde_json::{json, Value};
use support::{connector, free_port, read_and_check, readable, token_of, Role, SECRET};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const SECOND: Duration = Duration::from_secs(1);

/// An `etcd` process of this test, on free loopback ports, with a data
/// directory of its own; killed (and the directory removed) when dropped.
struct Etcd {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl Etcd {
    /// Starts one and waits until it is healthy, or returns `None` (having
    /// said why) when `etcd` is not installed and not required.
    fn start() -> Option<Etcd> {
        Self::start_on("127.0.0.1")
    }

    /// Starts one that listens for clients on `host`.
    fn start_on(host: &str) -> Option<Etcd> {
        if Command::new("etcd").arg("--version").output().is_err() {
            assert!(
                std::env::var("FERRY_REQUIRE_ETCD").as_deref() != Ok("1"),
                "FERRY_REQUIRE_ETCD=1 but etcd is not installed (Debian: apt-get install \
                 etcd-server)"
            );
            eprintln!(
                "SKIPPED: etcd is not installed (Debian: apt-get install etcd-server; \
                 .ci/test installs it when it can)"
            );
            return None;
        }
        let (port, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("ferry-etcd-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "ferry-test", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &format!("http://{host}:{port}")])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("ferry-test={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        let etcd = Etcd { port, child, dir };
        let t = Instant::now();
        while !etcd.healthy() {
            assert!(t.elapsed() < 20 * SECOND, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(etcd)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn healthy(&self) -> bool {
        self.raw("GET", "/health", "")
            .is_some_and(|b| b.contains("\"health\":\"true\""))
    }

    /// One request straight to etcd's gateway: the reply's body.
    fn raw(&self, method: &str, path: &str, body: &str) -> Option<String> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let mut s = TcpStream::connect_timeout(&addr, SECOND).ok()?;
        s.set_read_timeout(Some(5 * SECOND)).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).ok()?;
        Some(reply.split_once("\r\n\r\n")?.1.to_owned())
    }

    /// A gateway call whose reply must be a JSON object.
    fn call(&self, path: &str, body: Value) -> Value {
        let reply = self
            .raw("POST", path, &body.to_string())
            .expect("etcd answers");
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{path}: {e}: {reply}"))
    }

    /// The value at `key`, read straight from etcd (no Ferry code).
    fn get(&self, key: &str) -> Option<Vec<u8>> {
        let reply = self.call("/v3/kv/range", json!({"key": BASE64.encode(key)}));
        let value = reply.pointer("/kvs/0/value")?.as_str()?;
        Some(BASE64.decode(value).expect("base64"))
    }

    fn put(&self, key: &str, value: &[u8]) {
        self.call(
            "/v3/kv/put",
            json!({"key": BASE64.encode(key), "value": BASE64.encode(value)}),
        );
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} etcd");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn store(e: &Etcd) -> EtcdStore {
    EtcdStore::connect(&e.url(), 10 * SECOND)
        .await
        .expect("connect")
}

async fn store_with(e: &Etcd, config: &Config) -> EtcdStore {
    EtcdStore::connect_with(&e.url(), 10 * SECOND, config)
        .await
        .expect("connect")
}

/// Fetches until `key` is gone, within `within`.
async fn gone_within(s: &EtcdStore, key: &str, within: Duration) {
    let t = Instant::now();
    loop {
        match s.fetch(key, Duration::from_millis(100)).await {
            Err(Error::NotFound { .. }) => return,
            Ok(_) => assert!(t.elapsed() < within, "{key} still there after {within:?}"),
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_fetch_and_read() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let (prefill, decode) = (connector().await, connector().await);
    let (pub_side, fetch_side) = (store(&etcd).await, store(&etcd).await);
    let op = readable(&prefill, 1, 1 << 20).await;
    let p = pub_side.publish("req-1", op.metadata()).await.unwrap();
    assert_eq!(p.key(), "req-1");
    // Stored where it says, in clear without a secret.
    let stored = etcd.get("/ferry/metadata/req-1").expect("in etcd");
    assert_eq!(stored, op.metadata().to_json().as_bytes());
    let got = fetch_side.fetch("req-1", 5 * SECOND).await.unwrap();
    assert_eq!(got.to_json(), op.metadata().to_json());
    read_and_check(&decode, &got, 1, 1 << 20).await;
    op.wait_for_completion_timeout(5 * SECOND).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_bytes_round_trip_sealed_or_not() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    // Any bytes, not JSON (a NIXL agent's metadata, say).
    let value: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let (a, b) = (store(&etcd).await, store(&etcd).await);
    let p = a.publish_bytes("blob-1", &value).await.unwrap();
    assert_eq!(etcd.get("/ferry/metadata/blob-1").expect("in etcd"), value);
    assert_eq!(b.fetch_bytes("blob-1", SECOND).await.unwrap(), value);
    // Not metadata: fetch as metadata refuses it, typed.
    let e = b.fetch("blob-1", SECOND).await.unwrap_err();
    assert!(matches!(e, Error::InvalidMetadata(_)), "{e}");
    let e = a.publish_bytes("blob-1", b"again").await.unwrap_err();
    assert!(matches!(e, Error::AlreadyPublished { .. }), "{e}");
    a.withdraw(p).await.unwrap();
    let e = b
        .fetch_bytes("blob-1", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    // Too large: refused before etcd is asked.
    let big = vec![0u8; ferry_control::MAX_VALUE_BYTES + 1];
    let e = a.publish_bytes("blob-2", &big).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    // Sealed: not in clear in etcd, and the same bytes back.
    let sealed = store_with(&etcd, &Config::new().secret(SECRET)).await;
    let _p = sealed
        .publish_bytes("blob-3", b"nixl agent metadata")
        .await
        .unwrap();
    let stored = etcd.get("/ferry/metadata/blob-3").expect("in etcd");
    assert!(!stored.windows(5).any(|w| w == b"agent"), "in clear");
    assert_eq!(
        sealed.fetch_bytes("blob-3", SECOND).await.unwrap(),
        b"nixl agent metadata"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_duplicates_withdrawal_and_prefixes() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let prefill = connector().await;
    let (a, b) = (store(&etcd).await, store(&etcd).await);
    let t = Instant::now();
    let e = a
        .fetch("nobody", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::NotFound { ref key, .. } if key == "nobody"),
        "{e}"
    );
    assert!(t.elapsed() < 2 * SECOND, "{:?}", t.elapsed());

    let op = readable(&prefill, 2, 64).await;
    let p = a.publish("k", op.metadata()).await.unwrap();
    // Nobody overwrites it, here or in another process.
    for s in [&a, &b] {
        let e = s.publish("k", op.metadata()).await.unwrap_err();
        assert!(
            matches!(e, Error::AlreadyPublished { ref key } if key == "/ferry/metadata/k"),
            "{e}"
        );
    }
    b.fetch("k", SECOND).await.unwrap();
    a.withdraw(p).await.unwrap();
    let e = b.fetch("k", Duration::from_millis(200)).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(etcd.get("/ferry/metadata/k").is_none());
    // Published again after the withdrawal; dropped: gone in a moment.
    let p = b.publish("k", op.metadata()).await.unwrap();
    a.fetch("k", SECOND).await.unwrap();
    drop(p);
    gone_within(&a, "k", 2 * SECOND).await;

    // Prefixes keep tenants apart.
    let t1 = store(&etcd).await.with_prefix("/ferry/tenant-1").unwrap();
    let t2 = store(&etcd).await.with_prefix("/ferry/tenant-2").unwrap();
    let _p = t1.publish("k", op.metadata()).await.unwrap();
    assert!(etcd.get("/ferry/tenant-1/k").is_some());
    t1.fetch("k", SECOND).await.unwrap();
    let e = t2.fetch("k", Duration::from_millis(200)).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");

    let e = a.fetch("a/b", SECOND).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
    for bad in ["", "ferry", "/", "/a//b", "/a/", "/a b", "/a.b"] {
        let e = a.clone().with_prefix(bad).unwrap_err();
        assert!(matches!(e, Error::InvalidEtcdPrefix { .. }), "{bad:?}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_etcd_times_out_within_the_deadline() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let prefill = connector().await;
    let s = store(&etcd).await;
    let op = readable(&prefill, 3, 64).await;
    let _p = s.publish("k", op.metadata()).await.unwrap();
    etcd.signal("-STOP");
    let deadline = Duration::from_millis(1500);
    let t = Instant::now();
    let e = s.fetch("k", deadline).await.unwrap_err();
    let took = t.elapsed();
    etcd.signal("-CONT");
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(
        took >= deadline && took < deadline + Duration::from_millis(500),
        "{took:?}"
    );
    // Back: found again.
    s.fetch("k", 5 * SECOND).await.unwrap();

    // Nobody listening: the typed cause, within the deadline.
    let t = Instant::now();
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let e = EtcdStore::connect(&nobody, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoServer { .. }), "{e}");
    assert!(t.elapsed() < SECOND, "{:?}", t.elapsed());
}

/// Child process: a publisher that dies (killed) without withdrawing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_etcd_publisher() {
    let Ok(url) = std::env::var("FERRY_CTL_CHILD_ETCD") else {
        return;
    };
    let prefill = connector().await;
    let s = EtcdStore::connect(&url, 5 * SECOND)
        .await
        .unwrap()
        .with_lease_ttl(SECOND);
    let op = readable(&prefill, 4, 64).await;
    let _p = s.publish("dies", op.metadata()).await.unwrap();
    println!("\nREADY");
    tokio::time::sleep(60 * SECOND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_outlive_their_ttl_while_kept_and_expire_with_the_publisher() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let child = Role::spawn(
        "child_etcd_publisher",
        &[("FERRY_CTL_CHILD_ETCD", etcd.url())],
    );
    let prefill = connector().await;
    let s = store(&etcd).await.with_lease_ttl(SECOND);
    let op = readable(&prefill, 5, 64).await;
    let _kept = s.publish("kept", op.metadata()).await.unwrap();
    child.expect("READY", 30 * SECOND);
    s.fetch("dies", SECOND).await.unwrap();
    drop(child); // SIGKILL: no withdrawal, no more keep-alives.
                 // etcd's shortest lease is about 2 s; it expires soon after.
    let t = Instant::now();
    gone_within(&s, "dies", 6 * SECOND).await;
    // The kept one, on the same short lease, lives on past its TTL.
    if t.elapsed() < 3 * SECOND {
        tokio::time::sleep(3 * SECOND - t.elapsed()).await;
    }
    s.fetch("kept", SECOND).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_whose_lease_etcd_lost_is_stored_again() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let prefill = connector().await;
    let s = store(&etcd).await.with_lease_ttl(SECOND);
    let op = readable(&prefill, 10, 64).await;
    let _p = s.publish("k", op.metadata()).await.unwrap();
    // The lease revoked behind the publisher's back: the key goes with it.
    let reply = etcd.call(
        "/v3/kv/range",
        json!({"key": BASE64.encode("/ferry/metadata/k")}),
    );
    let lease = reply.pointer("/kvs/0/lease").expect("on a lease").clone();
    let revoked = etcd.call("/v3/lease/revoke", json!({"ID": lease}));
    assert!(revoked.get("error").is_none(), "{revoked}");
    assert!(etcd.get("/ferry/metadata/k").is_none());
    // The next keep-alive finds it lost and stores it again, on a new lease.
    s.fetch("k", 3 * SECOND).await.unwrap();
    let reply = etcd.call(
        "/v3/kv/range",
        json!({"key": BASE64.encode("/ferry/metadata/k")}),
    );
    assert_ne!(reply.pointer("/kvs/0/lease"), Some(&lease));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_values_are_not_readable_in_clear() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let prefill = connector().await;
    let sealed = Config::new().secret(SECRET);
    let s = store_with(&etcd, &sealed).await;
    assert!(s.has_secret());
    let op = readable(&prefill, 6, 64).await;
    let json = op.metadata().to_json();
    let _p = s.publish("req-s", op.metadata()).await.unwrap();
    // What etcd holds: neither the token nor any of the JSON.
    let stored = etcd.get("/ferry/metadata/req-s").expect("in etcd");
    let token = token_of(&json);
    for clear in [token.as_bytes(), b"\"token\"", b"127.0.0.1"] {
        assert!(!stored.windows(clear.len()).any(|w| w == clear), "in clear");
    }
    assert!(stored.starts_with(b"FCE1"));
    assert_eq!(s.fetch("req-s", SECOND).await.unwrap().to_json(), json);

    let short = Duration::from_millis(300);
    // Without the secret: told why; with another: refused.
    let plain = store_with(&etcd, &Config::new().without_secret()).await;
    let e = plain.fetch("req-s", short).await.unwrap_err();
    assert!(matches!(e, Error::SecretRequired { .. }), "{e}");
    let other = store_with(&etcd, &Config::new().secret("another secret, long enough")).await;
    let e = other.fetch("req-s", short).await.unwrap_err();
    assert!(matches!(e, Error::Forged { .. }), "{e}");
    // Moved to another key, or written in clear by whoever may write to
    // etcd: refused, after asking again until the deadline.
    etcd.put("/ferry/metadata/moved", &stored);
    etcd.put("/ferry/metadata/clear", json.as_bytes());
    for key in ["moved", "clear"] {
        let t = Instant::now();
        let e = s.fetch(key, short).await.unwrap_err();
        assert!(matches!(e, Error::Forged { .. }), "{key}: {e}");
        assert!(t.elapsed() >= short, "{key}: gave up early");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_users_are_required_when_etcd_has_authentication() {
    let Some(etcd) = Etcd::start() else {
        return;
    };
    for (path, body) in [
        (
            "/v3/auth/user/add",
            json!({"name": "root", "password": "r00t-pw"}),
        ),
        (
            "/v3/auth/user/grant",
            json!({"user": "root", "role": "root"}),
        ),
        ("/v3/auth/enable", json!({})),
    ] {
        let reply = etcd.call(path, body);
        assert!(reply.get("error").is_none(), "{path}: {reply}");
    }
    let prefill = connector().await;
    let op = readable(&prefill, 8, 64).await;
    let user = Config::new().etcd_user_and_password("root", "r00t-pw");
    let s = store_with(&etcd, &user).await;
    let _p = s.publish("authed", op.metadata()).await.unwrap();
    s.fetch("authed", SECOND).await.unwrap();

    // No user: refused at once, typed.
    let anonymous = store(&etcd).await;
    let t = Instant::now();
    let e = anonymous.fetch("authed", 5 * SECOND).await.unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    assert!(t.elapsed() < SECOND, "{:?}", t.elapsed());
    let e = anonymous.publish("k", op.metadata()).await.unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    // A wrong password: at connect.
    let wrong = Config::new().etcd_user_and_password("root", "wrong");
    let e = EtcdStore::connect_with(&etcd.url(), 5 * SECOND, &wrong)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    assert!(!format!("{e}{e:?}{s:?}").contains("r00t-pw"));
}

/// This host's address on the interface that routes outwards, if any
/// (nothing is sent).
fn outward_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.254:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_publish_needs_etcd_on_loopback() {
    let Some(ip) = outward_ip() else {
        eprintln!("SKIPPED: no address but loopback");
        return;
    };
    let Some(etcd) = Etcd::start_on("0.0.0.0") else {
        return;
    };
    let url = format!("http://{ip}:{}", etcd.port);
    let prefill = connector().await;
    let op = readable(&prefill, 9, 64).await;
    let none = Config::new().without_secret().trusted_network(false);
    let s = EtcdStore::connect_with(&url, 10 * SECOND, &none)
        .await
        .unwrap();
    let e = s.publish("k", op.metadata()).await.unwrap_err();
    assert!(matches!(e, Error::UntrustedNetwork { .. }), "{e}");
    assert!(
        e.to_string().contains("FERRY_CONTROL_TRUSTED_NETWORK=1"),
        "{e}"
    );
    assert!(etcd.get("/ferry/metadata/k").is_none());
    // With the secret, or the network declared trusted, it publishes.
    for (config, key) in [
        (Config::new().secret(SECRET), "sealed"),
        (none.trusted_network(true), "trusted"),
    ] {
        let s = EtcdStore::connect_with(&url, 10 * SECOND, &config)
            .await
            .unwrap();
        let _p = s.publish(key, op.metadata()).await.unwrap();
        s.fetch(key, SECOND).await.unwrap();
    }
}

/// A server that answers every request with `reply` (then closes).
async fn fake_etcd(reply: Vec<u8>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(&reply).await;
            });
        }
    });
    format!("http://{addr}")
}

fn ok_json(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_and_hostile_etcds_give_typed_errors() {
    let deadline = Duration::from_millis(400);
    let connect = |reply: Vec<u8>| async move {
        let t = Instant::now();
        let e = EtcdStore::connect(&fake_etcd(reply).await, deadline)
            .await
            .unwrap_err();
        assert!(t.elapsed() < deadline + SECOND, "{:?}", t.elapsed());
        e
    };
    let e = connect(Vec::new()).await;
    assert!(matches!(e, Error::ServerGone { .. }), "silent close: {e}");
    let e = connect(b"SSH-2.0-OpenSSH\r\n\r\n".to_vec()).await;
    assert!(matches!(e, Error::BadReply { .. }), "not HTTP: {e}");
    let e = connect(ok_json("<html>")).await;
    assert!(matches!(e, Error::BadReply { .. }), "not JSON: {e}");
    let e = connect(b"HTTP/1.1 200 OK\r\ncontent-length: 99999999\r\n\r\n{".to_vec()).await;
    assert!(matches!(e, Error::BadReply { .. }), "oversized: {e}");
    let e = connect(b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nNot Found".to_vec()).await;
    assert!(matches!(e, Error::BadReply { .. }), "no gateway: {e}");

    // Answers that pass for etcd's until the metadata: each a typed error.
    let key = BASE64.encode("/ferry/metadata/k");
    for (reply, what) in [
        (
            json!({"kvs": [{"key": BASE64.encode("/elsewhere"), "value": ""}]}),
            "another key",
        ),
        (
            json!({"kvs": [{"key": key, "value": "not base64!"}]}),
            "not base64",
        ),
        (json!({"kvs": {"key": key}}), "not a list"),
        (
            json!({"kvs": [{"key": key, "value": BASE64.encode("{\"v\": 99}")}]}),
            "not metadata",
        ),
    ] {
        let s = EtcdStore::connect(&fake_etcd(ok_json(&reply.to_string())).await, deadline)
            .await
            .unwrap();
        let e = s.fetch("k", deadline).await.unwrap_err();
        assert!(
            matches!(e, Error::BadReply { .. } | Error::InvalidMetadata(_)),
            "{what}: {e}"
        );
    }
    // Accepts and never answers: the deadline.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let hold = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            conns.push(s);
        }
    });
    let t = Instant::now();
    let e = EtcdStore::connect(&addr, deadline).await.unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "mute: {e}");
    assert!(t.elapsed() < deadline + Duration::from_millis(300));
    hold.abort();
}
