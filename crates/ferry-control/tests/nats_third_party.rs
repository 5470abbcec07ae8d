//! A third party against the NATS control plane: another client of the
//! same real `nats-server` that requests the metadata, watches every
//! subject, answers a decode worker's fetch first with metadata of its own,
//! and replays answers it recorded. The publisher and the rightful fetcher
//! are child processes configured by the environment, as users run them.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_control::NatsChannel;
use futures_util::StreamExt;
use support::{connector, read_and_check, readable, token_of, NatsServer, Role, SECRET};

const SECOND: Duration = Duration::from_secs(1);

fn arg(name: &str) -> Option<Vec<String>> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(' ').map(str::to_owned).collect())
}

/// Child: after `delay_ms`, publishes a readable of 1 MiB (seed 9) under
/// `key` at `url` (`$CTL_PUB` = "url key delay_ms"), configured by the
/// environment; prints `JSON json` and `READY`, or `PUBERR message`, then
/// waits for the read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_nats_publisher() {
    let Some(a) = arg("CTL_PUB") else { return };
    tokio::time::sleep(Duration::from_millis(a[2].parse().unwrap())).await;
    let prefill = connector().await;
    let op = readable(&prefill, 9, 1 << 20).await;
    let published = match NatsChannel::connect(&a[0], 10 * SECOND).await {
        Ok(ch) => ch.publish(&a[1], op.metadata()).await.map(|p| (ch, p)),
        Err(e) => Err(e),
    };
    let _kept = match published {
        Ok(p) => p,
        Err(e) => {
            println!("\nPUBERR {e}");
            return;
        }
    };
    println!("\nJSON {}", op.metadata().to_json());
    println!("READY");
    let _ = op.wait_for_completion_timeout(30 * SECOND).await;
}

/// Child: fetches `key` at `url` (`$CTL_FETCH` = "url key deadline_ms"),
/// configured by the environment; prints `GOT json` then `READ ok`, or
/// `ERR ms message`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_nats_fetcher() {
    let Some(a) = arg("CTL_FETCH") else { return };
    let deadline = Duration::from_millis(a[2].parse().unwrap());
    let t = Instant::now();
    let got = match NatsChannel::connect(&a[0], 10 * SECOND).await {
        Ok(ch) => ch.fetch(&a[1], deadline).await,
        Err(e) => Err(e),
    };
    match got {
        Ok(md) => {
            println!("\nGOT {}", md.to_json());
            let decode = connector().await;
            read_and_check(&decode, &md, 9, 1 << 20).await;
            println!("READ ok");
        }
        Err(e) => println!("\nERR {} {e}", t.elapsed().as_millis()),
    }
}

fn publisher(url: &str, key: &str, delay_ms: u64, env: &[(&str, String)]) -> Role {
    let mut env = env.to_vec();
    env.push(("CTL_PUB", format!("{url} {key} {delay_ms}")));
    Role::spawn("child_nats_publisher", &env)
}

fn fetcher(url: &str, key: &str, deadline_ms: u64, env: &[(&str, String)]) -> Role {
    let mut env = env.to_vec();
    env.push(("CTL_FETCH", format!("{url} {key} {deadline_ms}")));
    Role::spawn("child_nats_fetcher", &env)
}

/// Every message on the server (`>`), as a third party sees them.
async fn eavesdrop(client: &async_nats::Client) -> Arc<Mutex<Vec<(String, Bytes)>>> {
    let mut all = client.subscribe(">").await.unwrap();
    client.flush().await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Some(m) = all.next().await {
            record
                .lock()
                .unwrap()
                .push((m.subject.to_string(), m.payload));
        }
    });
    seen
}

fn secret() -> [(&'static str, String); 1] {
    [("FERRY_SECRET", SECRET.to_string())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_third_party_on_the_server_gets_nothing_usable() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let third = async_nats::connect(server.url()).await.unwrap();
    let seen = eavesdrop(&third).await;
    let p = publisher(&server.url(), "req-1042", 0, &secret());
    let json = p.expect("JSON ", 30 * SECOND);
    p.expect("READY", 10 * SECOND);
    let token = token_of(&json);
    // It asks as a fetcher would, with no proof, and with a made-up one.
    for payload in [Bytes::new(), Bytes::from(vec![b'F'; 44])] {
        let answer = third
            .request_with_headers(
                "ferry.metadata.req-1042",
                async_nats::HeaderMap::new(),
                payload,
            )
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&answer.payload);
        assert!(!text.contains(&token), "the token leaked: {text}");
        assert!(
            ferry::RdmaMetadata::from_json_bytes(&answer.payload).is_err(),
            "the third party got metadata: {text}"
        );
    }
    // The rightful fetcher gets it and reads; the third party, watching
    // every subject, saw the exchange but nothing usable in it.
    let f = fetcher(&server.url(), "req-1042", 10_000, &secret());
    assert_eq!(f.expect("GOT ", 30 * SECOND), json);
    f.expect("READ ok", 30 * SECOND);
    let seen = seen.lock().unwrap();
    assert!(
        seen.len() >= 4,
        "the third party saw the exchange: {seen:?}"
    );
    for (subject, payload) in seen.iter() {
        let text = String::from_utf8_lossy(payload);
        for secret_part in [&token[..], "\"operation", "\"descriptors"] {
            assert!(
                !text.contains(secret_part),
                "{secret_part} in clear on {subject}: {text}"
            );
        }
    }
}

/// Answers every request on `subject` at once with `answer()`.
async fn answer_first(
    client: &async_nats::Client,
    subject: &str,
    answer: impl Fn() -> Bytes + Send + 'static,
) -> Arc<Mutex<u32>> {
    let mut sub = client.subscribe(subject.to_owned()).await.unwrap();
    client.flush().await.unwrap();
    let count = Arc::new(Mutex::new(0));
    let counted = count.clone();
    let client = client.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if let Some(reply) = m.reply {
                *counted.lock().unwrap() += 1;
                let _ = client.publish(reply, answer()).await;
                let _ = client.flush().await;
            }
        }
    });
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_forged_answer_is_refused_and_the_fetch_waits_for_the_real_one() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    // The third party answers first, with metadata of a real readable of
    // its own that the decode worker would otherwise read.
    let attacker = connector().await;
    let bait = readable(&attacker, 66, 1 << 20).await;
    let forged = Bytes::from(bait.metadata().to_json());
    let third = async_nats::connect(server.url()).await.unwrap();
    let f1 = forged.clone();
    let answered = answer_first(&third, "ferry.metadata.req-1042", move || f1.clone()).await;
    // The decode worker asks before the prefill worker publishes.
    let f = fetcher(&server.url(), "req-1042", 20_000, &secret());
    let p = publisher(&server.url(), "req-1042", 1500, &secret());
    let json = p.expect("JSON ", 30 * SECOND);
    assert_eq!(f.expect("GOT ", 30 * SECOND), json, "not the real metadata");
    f.expect("READ ok", 30 * SECOND);
    assert!(*answered.lock().unwrap() >= 1, "the forger never answered");
    // With nobody but the forger answering, the fetch refuses it until its
    // deadline, then says so.
    let _a2 = answer_first(&third, "ferry.metadata.req-7", move || forged.clone()).await;
    let f = fetcher(&server.url(), "req-7", 1500, &secret());
    let (what, rest) = f.expect_any(&["GOT ", "ERR "], 30 * SECOND);
    assert_eq!(what, "ERR ", "accepted forged metadata: {rest}");
    let (ms, message) = rest.split_once(' ').unwrap();
    assert!(message.contains("refused"), "{message}");
    assert!(ms.parse::<u64>().unwrap() >= 1400, "gave up early: {rest}");
    assert_eq!(
        bait.status(),
        ferry::OperationStatus::Initialized,
        "bait read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_replayed_answer_is_refused() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let third = async_nats::connect(server.url()).await.unwrap();
    let seen = eavesdrop(&third).await;
    let p = publisher(&server.url(), "req-1", 0, &secret());
    let json = p.expect("JSON ", 30 * SECOND);
    p.expect("READY", 10 * SECOND);
    let f = fetcher(&server.url(), "req-1", 10_000, &secret());
    assert_eq!(f.expect("GOT ", 30 * SECOND), json);
    f.expect("READ ok", 30 * SECOND);
    drop(p); // Read: the publisher is gone.
             // The answers it recorded (on reply inboxes), replayed for the same key
             // and for another.
    let recorded: Vec<Bytes> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, _)| s.starts_with("_INBOX."))
        .map(|(_, p)| p.clone())
        .collect();
    assert!(!recorded.is_empty(), "nothing recorded");
    let answer = recorded.last().unwrap().clone();
    for key in ["req-1", "req-2"] {
        let a = answer.clone();
        let _replayer =
            answer_first(&third, &format!("ferry.metadata.{key}"), move || a.clone()).await;
        let f = fetcher(&server.url(), key, 1500, &secret());
        let (what, rest) = f.expect_any(&["GOT ", "ERR "], 30 * SECOND);
        assert_eq!(what, "ERR ", "{key}: accepted a replayed answer: {rest}");
        assert!(rest.contains("refused"), "{rest}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_credentials_user_password_and_token() {
    for (args, env) in [
        (
            vec!["--user", "ferry", "--pass", "pw-3c9a"],
            vec![
                ("FERRY_NATS_USER", "ferry".to_string()),
                ("FERRY_NATS_PASSWORD", "pw-3c9a".to_string()),
            ],
        ),
        (
            vec!["--auth", "tok-77d1"],
            vec![("FERRY_NATS_TOKEN", "tok-77d1".to_string())],
        ),
    ] {
        let Some(server) = NatsServer::start_with("127.0.0.1", &args) else {
            return;
        };
        // Without the credentials: refused, and told why.
        let e = NatsChannel::connect(&server.url(), 2 * SECOND)
            .await
            .unwrap_err();
        assert!(
            format!("{e:?}").starts_with("Unauthorized"),
            "{args:?}: {e}"
        );
        // With them (from the environment), the hand-over works.
        let p = publisher(&server.url(), "k", 0, &env);
        let json = p.expect("JSON ", 30 * SECOND);
        let f = fetcher(&server.url(), "k", 10_000, &env);
        assert_eq!(f.expect("GOT ", 30 * SECOND), json, "{args:?}");
        f.expect("READ ok", 30 * SECOND);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_credentials_nkey() {
    let user = nkeys::KeyPair::new_user();
    let conf = std::env::temp_dir().join(format!("ferry-nkey-{}.conf", std::process::id()));
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let Some(server) = NatsServer::start_with("127.0.0.1", &["-c", conf.to_str().unwrap()]) else {
        return;
    };
    let e = NatsChannel::connect(&server.url(), 2 * SECOND)
        .await
        .unwrap_err();
    assert!(format!("{e:?}").starts_with("Unauthorized"), "{e}");
    let env = [("FERRY_NATS_NKEY", user.seed().unwrap())];
    let p = publisher(&server.url(), "k", 0, &env);
    let json = p.expect("JSON ", 30 * SECOND);
    let f = fetcher(&server.url(), "k", 10_000, &env);
    assert_eq!(f.expect("GOT ", 30 * SECOND), json);
    f.expect("READ ok", 30 * SECOND);
    let _ = std::fs::remove_file(conf);
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
async fn without_a_secret_publish_needs_a_server_on_loopback() {
    let Some(ip) = outward_ip() else {
        eprintln!("SKIPPED: no address but loopback");
        return;
    };
    let Some(server) = NatsServer::start_with("0.0.0.0", &[]) else {
        return;
    };
    let url = format!("nats://{ip}:{}", server.port);
    let p = publisher(&url, "k", 0, &[]);
    let (what, rest) = p.expect_any(&["READY", "PUBERR "], 30 * SECOND);
    assert_eq!(what, "PUBERR ", "published without a secret to {url}");
    assert!(rest.contains("FERRY_CONTROL_TRUSTED_NETWORK=1"), "{rest}");
    // With the secret, or the network declared trusted, it publishes.
    for env in [
        ("FERRY_SECRET", SECRET.to_string()),
        ("FERRY_CONTROL_TRUSTED_NETWORK", "1".to_string()),
    ] {
        let p = publisher(&url, "k", 0, std::slice::from_ref(&env));
        let (what, rest) = p.expect_any(&["READY", "PUBERR "], 30 * SECOND);
        assert_eq!(what, "READY", "{env:?}: {rest}");
    }
}
