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
}

impl NatsServer {
    /// Starts one on a free port, or returns `None` (having said why) when
    /// `nats-server` is not installed.
    pub fn start() -> Option<NatsServer> {
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
        };
        s.spawn();
        Some(s)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
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
