//! A third party against the HTTP control plane: a real HTTP client (raw
//! requests and this crate's client without the secret or the token), a
//! recording relay on the wire, and a server of its own answering a decode
//! worker's fetch. The publisher and the rightful fetcher are child
//! processes configured by the environment, as users run them.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_control::{Config, HttpClient, HttpServer, HTTP_PATH};
use support::{connector, read_and_check, readable, token_of, Role, SECRET};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECOND: Duration = Duration::from_secs(1);

fn arg(name: &str) -> Option<Vec<String>> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(' ').map(str::to_owned).collect())
}

/// Child: publishes a readable of 1 MiB (seed 9) under the key `$CTL_PUB`
/// on an `HttpServer` bound at `$CTL_BIND` (default loopback), configured
/// by the environment; prints `READY addr`, `JSON json`, then waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_http_publisher() {
    let Some(a) = arg("CTL_PUB") else { return };
    let bind = std::env::var("CTL_BIND").unwrap_or_else(|_| "127.0.0.1:0".into());
    let server = match HttpServer::bind(&bind).await {
        Ok(s) => s,
        Err(e) => {
            println!("\nBINDERR {e}");
            return;
        }
    };
    let prefill = connector().await;
    let op = readable(&prefill, 9, 1 << 20).await;
    let _p = server.publish(&a[0], op.metadata()).unwrap();
    println!("\nJSON {}", op.metadata().to_json());
    println!("READY {}", server.local_addr());
    let _ = op.wait_for_completion_timeout(30 * SECOND).await;
}

/// Child: fetches `key` from `addr` (`$CTL_FETCH` = "addr key deadline_ms")
/// configured by the environment; prints `GOT json` then `READ ok` once it
/// has read and checked the bytes, or `ERR ms message`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_http_fetcher() {
    let Some(a) = arg("CTL_FETCH") else { return };
    let deadline = Duration::from_millis(a[2].parse().unwrap());
    let t = Instant::now();
    match HttpClient::new(a[0].clone()).fetch(&a[1], deadline).await {
        Ok(md) => {
            println!("\nGOT {}", md.to_json());
            let decode = connector().await;
            read_and_check(&decode, &md, 9, 1 << 20).await;
            println!("READ ok");
        }
        Err(e) => println!("\nERR {} {e}", t.elapsed().as_millis()),
    }
}

/// The name of an error's variant.
fn variant(e: &ferry_control::Error) -> String {
    let debug = format!("{e:?}");
    debug
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn publisher(env: &[(&str, String)]) -> (Role, String, String) {
    let mut env = env.to_vec();
    env.push(("CTL_PUB", "req-1042".into()));
    let p = Role::spawn("child_http_publisher", &env);
    let json = p.expect("JSON ", 30 * SECOND);
    let addr = p.expect("READY ", 10 * SECOND);
    (p, addr, json)
}

fn fetcher(addr: &str, key: &str, deadline_ms: u64, env: &[(&str, String)]) -> Role {
    let mut env = env.to_vec();
    env.push(("CTL_FETCH", format!("{addr} {key} {deadline_ms}")));
    Role::spawn("child_http_fetcher", &env)
}

/// A raw HTTP/1.1 GET with extra header lines; the whole response.
async fn raw_get(addr: &str, path: &str, headers: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{headers}connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(5 * SECOND, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_third_party_gets_no_capability_over_http() {
    let secret = [("FERRY_SECRET", SECRET.to_string())];
    let (_p, addr, json) = publisher(&secret);
    let token = token_of(&json);
    let path = format!("{HTTP_PATH}req-1042");
    // A plain GET, a made-up proof, and this crate's client without the
    // secret: none gets the metadata, or anything that holds the token.
    for headers in [
        "",
        "ferry-proof: 46435131000000000000000000000000000000000000000000000000000000000000000000000000\r\n",
        "ferry-proof: zz\r\n",
    ] {
        let r = raw_get(&addr, &path, headers).await;
        assert!(r.starts_with("HTTP/1.1 401"), "{headers:?}: {r}");
        assert!(!r.contains(&token), "the token leaked: {r}");
    }
    // An unknown key answers the same: nothing is told about keys.
    let r = raw_get(&addr, &format!("{HTTP_PATH}req-1043"), "").await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let e = HttpClient::with_config(addr.clone(), &Config::new().without_secret())
        .unwrap()
        .fetch("req-1042", SECOND)
        .await
        .unwrap_err();
    assert_eq!(variant(&e), "SecretRequired", "{e}");
    // Nor with another secret.
    let other = Config::new().secret("another secret of 32 characters.");
    let e = HttpClient::with_config(addr.clone(), &other)
        .unwrap()
        .fetch("req-1042", SECOND)
        .await
        .unwrap_err();
    assert_eq!(variant(&e), "SecretRequired", "{e}");
    // The rightful fetcher, with the secret, gets it and reads.
    let f = fetcher(&addr, "req-1042", 10_000, &secret);
    assert_eq!(f.expect("GOT ", 30 * SECOND), json);
    f.expect("READ ok", 30 * SECOND);
}

/// A relay between a fetcher and the server that keeps every byte.
async fn recording_relay(to: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((a, _)) = l.accept().await {
            let Ok(b) = TcpStream::connect(&to).await else {
                continue;
            };
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            tokio::spawn(pipe(ar, bw, record.clone()));
            tokio::spawn(pipe(br, aw, record.clone()));
        }
    });
    (addr, seen)
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut into: tokio::net::tcp::OwnedWriteHalf,
    record: Arc<Mutex<Vec<u8>>>,
) {
    let mut buf = vec![0u8; 16 << 10];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        record.lock().unwrap().extend_from_slice(&buf[..n]);
        if into.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = into.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_listener_on_the_http_wire_learns_nothing_usable() {
    let secret = [("FERRY_SECRET", SECRET.to_string())];
    let (_p, addr, json) = publisher(&secret);
    let (relay, seen) = recording_relay(addr).await;
    let f = fetcher(&relay, "req-1042", 10_000, &secret);
    assert_eq!(f.expect("GOT ", 30 * SECOND), json);
    f.expect("READ ok", 30 * SECOND);
    let wire = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(
        wire.contains("HTTP/1.1 200"),
        "the relay saw the exchange: {wire}"
    );
    for secret_part in [
        token_of(&json),
        "\"operation".into(),
        "\"descriptors".into(),
    ] {
        assert!(
            !wire.contains(&secret_part),
            "{secret_part} travelled in clear: {wire}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_fetcher_refuses_a_forged_http_answer() {
    // The third party's server answers every fetch at once with metadata
    // of its own: a real readable the decode worker would read from.
    let attacker = connector().await;
    let bait = readable(&attacker, 66, 1 << 20).await;
    let body = bait.metadata().to_json();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let answers = Arc::new(Mutex::new(0u32));
    let count = answers.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            *count.lock().unwrap() += 1;
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    let secret = [("FERRY_SECRET", SECRET.to_string())];
    let f = fetcher(&addr, "req-1042", 1500, &secret);
    let (what, rest) = f.expect_any(&["GOT ", "ERR "], 30 * SECOND);
    assert_eq!(what, "ERR ", "the fetcher accepted forged metadata: {rest}");
    let (ms, message) = rest.split_once(' ').unwrap();
    // Refused, asked again, and reported as forged at the deadline.
    assert!(message.contains("refused"), "{message}");
    assert!(ms.parse::<u64>().unwrap() >= 1400, "gave up early: {rest}");
    assert!(*answers.lock().unwrap() > 1, "asked only once");
    assert_eq!(
        bait.status(),
        ferry::OperationStatus::Initialized,
        "the bait was read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_the_http_server_serves_only_loopback() {
    // No secret, whatever this process's environment says.
    let none = Config::new().without_secret().trusted_network(false);
    for addr in ["0.0.0.0:0", "[::]:0"] {
        match HttpServer::bind_with(addr, &none).await {
            Ok(s) => panic!("served without a secret on {}", s.local_addr()),
            Err(e) => {
                assert_eq!(variant(&e), "UntrustedNetwork", "{e}");
                let m = e.to_string();
                assert!(m.contains("FERRY_SECRET"), "{m}");
                assert!(m.contains("FERRY_CONTROL_TRUSTED_NETWORK=1"), "{m}");
            }
        }
    }
    HttpServer::bind_with("127.0.0.1:0", &none).await.unwrap();
    HttpServer::bind_with("0.0.0.0:0", &Config::new().secret(SECRET))
        .await
        .unwrap();
    // With the secret, or the network declared trusted, it serves there.
    for env in [
        ("FERRY_SECRET", SECRET.to_string()),
        ("FERRY_CONTROL_TRUSTED_NETWORK", "1".to_string()),
    ] {
        let p = Role::spawn(
            "child_http_publisher",
            &[
                env.clone(),
                ("CTL_PUB", "k".into()),
                ("CTL_BIND", "0.0.0.0:0".into()),
            ],
        );
        let (what, rest) = p.expect_any(&["READY ", "BINDERR "], 30 * SECOND);
        assert_eq!(what, "READY ", "{env:?}: {rest}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_is_required_when_configured() {
    let token = [("FERRY_CONTROL_TOKEN", "tok-5f1e2d".to_string())];
    let (_p, addr, json) = publisher(&token);
    let path = format!("{HTTP_PATH}req-1042");
    for headers in [
        "",
        "authorization: Bearer tok-5f1e2e\r\n",
        "authorization: Basic tok-5f1e2d\r\n",
        "authorization: Bearer tok-5f1e2\r\n",
    ] {
        let r = raw_get(&addr, &path, headers).await;
        assert!(r.starts_with("HTTP/1.1 401"), "{headers:?}: {r}");
        assert!(
            r.to_ascii_lowercase().contains("www-authenticate: bearer"),
            "{r}"
        );
        assert!(!r.contains(&token_of(&json)), "{r}");
    }
    let r = raw_get(&addr, &path, "authorization: Bearer tok-5f1e2d\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200") && r.contains(&json), "{r}");
    let e = HttpClient::new(addr.clone())
        .fetch("req-1042", SECOND)
        .await
        .unwrap_err();
    assert_eq!(variant(&e), "Unauthorized", "{e}");
    let f = fetcher(&addr, "req-1042", 10_000, &token);
    assert_eq!(f.expect("GOT ", 30 * SECOND), json);
    f.expect("READ ok", 30 * SECOND);
}
