//! A second process for the tests that cross a process boundary: this test
//! binary run again for one test, with an environment variable that says
//! what to serve. The server prints tagged lines (`META <json>`, ...) that
//! [`Server::after`] reads; it exits once its standard input closes.
//!
//! Included by path (`#[path = "support/spawned.rs"] mod spawned;`) by
//! `cuda_ipc.rs`, `staged.rs`, `gpu_path.rs` and `gpu_ucx.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use ferry::RdmaMetadata;

/// A server process for one test; killed when dropped.
pub struct Server {
    pub child: Child,
    out: BufReader<ChildStdout>,
}

impl Server {
    /// Runs test `name` of this binary again with `role` set to `spec`.
    pub fn start(name: &str, role: &str, spec: &str) -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            // (`--include-ignored`: a `stress_` test's server role runs too.)
            .args([
                "--exact",
                name,
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(role, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Server { child, out }
    }

    /// The rest of the next line that holds `tag`.
    pub fn after(&mut self, tag: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            if self.out.read_line(&mut line).unwrap() == 0 {
                panic!("the server process ended before it said {tag:?}");
            }
            if let Some((_, rest)) = line.split_once(tag) {
                return rest.trim().to_string();
            }
        }
    }

    /// The metadata of its `META` line.
    pub fn metadata(&mut self) -> RdmaMetadata {
        RdmaMetadata::from_json(&self.after("META ")).expect("the server's metadata")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Closing its standard input lets it exit; killed if it does not.
        drop(self.child.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(status)) = self.child.try_wait() {
                // A server that failed after its last line (a panic, or an
                // abort such as the fake CUDA driver's on misuse) fails
                // the test; one the test killed does not.
                use std::os::unix::process::ExitStatusExt;
                let killed = status.signal() == Some(libc::SIGKILL);
                if !status.success() && !killed && !std::thread::panicking() {
                    panic!("the server process ended badly: {status}");
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `serve` on the spec in `role` if this process is a server; true if
/// it was.
pub fn served(role: &str, serve: impl FnOnce(&str)) -> bool {
    match std::env::var(role) {
        Ok(spec) => {
            serve(&spec);
            true
        }
        Err(_) => false,
    }
}

/// The bytes descriptor `i` of a transfer seeded `seed` carries.
pub fn pattern(seed: u64, i: usize, len: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(i as u64 + 1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Checks that descriptor bytes `got` are `pattern(seed, ..)`, saying
/// where the first difference is.
pub fn check(got: &[Vec<u8>], seed: u64) -> Result<(), String> {
    for (i, g) in got.iter().enumerate() {
        let want = pattern(seed, i, g.len());
        if let Some(at) = g.iter().zip(&want).position(|(a, b)| a != b) {
            return Err(format!(
                "descriptor {i} ({} bytes) differs at byte {at}: {:#04x}, not {:#04x}",
                g.len(),
                g[at],
                want[at]
            ));
        }
    }
    Ok(())
}

/// The runtime of a test process (and of its server process).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
