//! What the control-plane tests share: a real `nats-server` on a free port,
//! metadata from a real connector, and child processes of this test binary.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry::{Connector, Descriptor, RdmaMetadata, ReadableOperation};

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A `nats-server` process of this test; killed when dropped.
pub struct NatsServer {
    pub port: u16,
    child: Option<Child>,
    /// Arguments after the port (authorization, say).
    args: Vec<String>,
    /// The address it listens on.
    pub host: String,
}

impl NatsServer {
    /// Starts one on a free port, or returns `None` (having said why) when
    /// `nats-server` is not installed.
    pub fn start() -> Option<NatsServer> {
        Self::start_with("127.0.0.1", &[])
    }

    /// Starts one listening on `host` with more arguments (`--user`, ...).
    pub fn start_with(host: &str, args: &[&str]) -> Option<NatsServer> {
        if Command::new("nats-server")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!(
                "SKIPPED: nats-server is not installed (Debian: apt-get install nats-server; \
                 .ci/test installs it when it can)"
            );
            return None;
        }
        let mut s = NatsServer {
            port: free_port(),
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            host: host.into(),
        };
        s.spawn();
        Some(s)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("nats-server")
            .args(["-a", &self.host, "-p", &self.port.to_string()])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let t = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills it (SIGKILL: no goodbye to the clients).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it and starts a new one on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A connector on loopback.
pub async fn connector() -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .expect("connector")
}

/// `len` bytes of a pattern that depends on `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A readable of `len` patterned bytes on `c`.
pub async fn readable(c: &Connector, seed: u8, len: usize) -> ReadableOperation<'static> {
    c.create_readable(vec![Descriptor::from_vec(pattern(seed, len))])
        .await
        .expect("readable")
}

/// Reads what `remote` exposes with `c` and checks the pattern.
pub async fn read_and_check(c: &Connector, remote: &RdmaMetadata, seed: u8, len: usize) {
    let read = c
        .begin_read(remote, vec![Descriptor::from_vec(vec![0; len])])
        .await
        .expect("begin_read");
    read.wait_for_completion_timeout(Duration::from_secs(30))
        .await
        .expect("read");
    let got = read.into_descriptors();
    assert!(
        got[0].as_slice().unwrap() == pattern(seed, len),
        "bytes differ"
    );
}

/// Starts this test binary again, running only the test `name`, with the
/// environment `env` (a child process for the cross-process tests).
pub fn spawn_self(name: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// The environment variables of the control plane and the connector's
/// secret: cleared for every child, then set as each test says.
pub const CONTROL_ENV: &[&str] = &[
    "FERRY_SECRET",
    "FERRY_CONTROL_TRUSTED_NETWORK",
    "FERRY_CONTROL_TOKEN",
    "FERRY_NATS_USER",
    "FERRY_NATS_PASSWORD",
    "FERRY_NATS_TOKEN",
    "FERRY_NATS_NKEY",
    "FERRY_NATS_CREDS",
    "FERRY_ETCD_USER",
    "FERRY_ETCD_PASSWORD",
];

/// A child process of this test binary running one test (a role), with its
/// stdout lines on a channel; killed when dropped.
pub struct Role {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    name: String,
}

impl Role {
    /// Runs the test `name` of this binary in a child with `env` (and none
    /// of [`CONTROL_ENV`] but those given).
    pub fn spawn(name: &str, env: &[(&str, String)]) -> Role {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = Command::new(exe);
        cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for k in CONTROL_ENV {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    // Keep reading so that the child never writes to a closed pipe.
                }
            }
        });
        Role {
            child,
            lines,
            name: name.into(),
        }
    }

    /// The rest of the first line that starts with one of `prefixes` (and
    /// which prefix), waiting up to `within`.
    pub fn expect_any(&self, prefixes: &[&str], within: Duration) -> (String, String) {
        let end = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    for p in prefixes {
                        if let Some(rest) = line.strip_prefix(p) {
                            return (p.to_string(), rest.trim().to_owned());
                        }
                    }
                    seen.push(line);
                }
                Err(_) => panic!(
                    "{}: no line starting with {prefixes:?} within {within:?}; saw {seen:?}",
                    self.name
                ),
            }
        }
    }

    /// The rest of the first line that starts with `prefix`.
    pub fn expect(&self, prefix: &str, within: Duration) -> String {
        self.expect_any(&[prefix], within).1
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `"token"` in a metadata JSON.
pub fn token_of(json: &str) -> String {
    let start = json.find("\"token\":\"").expect("a token") + 9;
    json[start..start + 32].to_owned()
}

/// A secret of the right length for tests.
pub const SECRET: &str = "0123456789abcdef0123456789abcdef";
