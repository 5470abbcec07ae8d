//! A same-host peer that stalls a cross-memory copy (it lends memory whose
//! pages never arrive: here userfaultfd, which any process can do where the
//! kernel allows it) costs one blocking thread and one operation, never the
//! process: the remote's abort and a local cancel return at once, timers and
//! other transfers go on, the memory stays out of the user's hands until the
//! copy returns, and one peer cannot have more than a few copies stuck.
//!
//! The hostile peer is a real process: this test binary run again with
//! `FERRY_STALL_CHILD` set (see `stall_child`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use ferry::{Connector, Descriptor, Device, Error, OperationStatus, RdmaMetadata, TransportKind};

const CHILD: &str = "FERRY_STALL_CHILD";
/// Readables the hostile peer exposes, one stalled range each.
const RANGES: usize = 6;
const RANGE: usize = 1 << 20;
/// What the library lets one connection have in flight (`stall.rs`).
const PER_CONNECTION: usize = 4;
/// Generous bound for anything that must be prompt (it is "never" before
/// the fix); speed is not what is tested.
const PROMPT: Duration = Duration::from_secs(5);

mod support;
use support::uffd;

// ---------------------------------------------------------------------------
// The hostile peer.

/// The hostile peer's body; a no-op unless run as the child.
#[test]
fn stall_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let out = |line: String| {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{line}");
        let _ = o.flush();
    };
    let stall = match uffd::Stall::new(RANGES * RANGE) {
        Ok(s) => s,
        Err(e) => {
            out(format!("SKIP userfaultfd refused by this kernel: {e}"));
            return;
        }
    };
    let (fd, base) = (stall.fd, stall.base as u64);
    std::thread::spawn(move || {
        let mut seen = [false; RANGES];
        while let Ok(addr) = uffd::Stall::next_fault(fd) {
            let i = ((addr - base) / RANGE as u64) as usize;
            if i < RANGES && !seen[i] {
                seen[i] = true;
                out(format!("FAULT {i}"));
            }
        }
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connector = rt.block_on(
        Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .transports(&[TransportKind::Cma, TransportKind::Tcp])
            .cma_threshold(0)
            .build(),
    );
    let connector = connector.unwrap();
    let mut readables: Vec<Option<_>> = Vec::new();
    for i in 0..RANGES {
        // SAFETY: the mapping lives until this process exits, and nothing in
        // this process touches it (a cross-memory peer reads it).
        let d = unsafe {
            Descriptor::from_raw_parts(stall.base.add(i * RANGE), RANGE, Device::CPU, false)
        };
        let r = rt.block_on(connector.create_readable(vec![d])).unwrap();
        out(format!("META {}", r.metadata().to_json()));
        readables.push(Some(r));
    }
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["cancel", i] => {
                let i: usize = i.parse().unwrap();
                drop(readables[i].take());
                out(format!("CANCELLED {i}"));
            }
            ["serve"] => {
                uffd::Stall::serve(fd, base, stall.len as u64);
                out("SERVED".into());
            }
            _ => break,
        }
    }
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    /// Starts the hostile peer; `None` (with the reason printed) where the
    /// kernel refuses userfaultfd.
    fn start() -> Option<(Peer, Vec<RdmaMetadata>)> {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "stall_child", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let peer = Peer {
            child,
            stdin,
            lines,
        };
        let mut metas = Vec::new();
        while metas.len() < RANGES {
            let line = peer.expect_any(&["META ", "SKIP "]);
            if let Some(reason) = line.strip_prefix("SKIP ") {
                println!("skipped: {reason}");
                return None;
            }
            metas.push(RdmaMetadata::from_json(&line["META ".len()..]).unwrap());
        }
        Some((peer, metas))
    }

    fn expect_any(&self, prefixes: &[&str]) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("the peer did not say {prefixes:?}"));
            // The harness may print its own words before ours on a line.
            if let Some(at) = prefixes.iter().find_map(|p| line.find(p)) {
                return line[at..].to_string();
            }
        }
    }

    fn try_line(&self, prefix: &str, within: Duration) -> Option<String> {
        let end = std::time::Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(prefix) => return Some(l),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `f` on a thread of its own and waits at most [`PROMPT`] for it.
fn promptly<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PROMPT)
        .unwrap_or_else(|_| panic!("{what} did not return within {PROMPT:?}"))
}

#[test]
fn a_stalled_cross_memory_copy_costs_one_thread_and_one_operation() {
    // On a thread of its own: where the fence is broken, even unwinding
    // blocks (dropping an operation waits for the stuck copy's lock), and
    // the test must fail, not hang.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(stalled_copy);
        let _ = tx.send(r.is_ok());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(true) => {}
        Ok(false) => panic!("failed (see the panic above)"),
        Err(_) => panic!("hung for 2 minutes (see any panic above)"),
    }
}

fn stalled_copy() {
    let Some((mut peer, metas)) = Peer::start() else {
        return;
    };
    // Leaked: dropping a runtime waits for its blocking threads, which a
    // failed run would leave stuck in the kernel.
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    ));
    let victim = rt
        .block_on(
            Connector::builder()
                .listen("127.0.0.1:0".parse().unwrap())
                .transports(&[TransportKind::Cma, TransportKind::Tcp])
                .cma_threshold(0)
                .build(),
        )
        .unwrap();

    // A timer that must keep ticking whatever the peer does.
    let ticks = Arc::new(AtomicU64::new(0));
    rt.spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });

    // One READ per stalled range, all on one connection to the peer.
    let mut reads: Vec<Option<_>> = metas
        .iter()
        .map(|m| {
            let buf = Descriptor::from_vec(vec![0xAB; RANGE]);
            Some(rt.block_on(victim.begin_read(m, vec![buf])).unwrap())
        })
        .collect();
    let mut stalled = Vec::new();
    for _ in 0..PER_CONNECTION {
        let f = peer.expect_any(&["FAULT "]);
        stalled.push(f["FAULT ".len()..].parse::<usize>().unwrap());
    }
    assert_eq!(
        peer.try_line("FAULT ", Duration::from_millis(500)),
        None,
        "one connection had more than {PER_CONNECTION} copies stuck at once"
    );
    let waiting: Vec<usize> = (0..RANGES).filter(|i| !stalled.contains(i)).collect();
    for &i in &stalled {
        let r = reads[i].as_ref().unwrap();
        assert_eq!(r.status(), OperationStatus::InProgress);
        assert_eq!(r.transport(), Some(TransportKind::Cma));
    }

    // 1. The peer aborts a stalled operation: it ends here at once.
    let a = stalled[0];
    peer.say(&format!("cancel {a}"));
    let read_a = reads[a].take().unwrap();
    let rt2 = rt;
    let (read_a, r) = promptly("the end of a READ the peer aborted", move || {
        let r = rt2.block_on(read_a.wait_for_completion_timeout(Duration::from_secs(60)));
        (read_a, r)
    });
    assert!(
        matches!(r, Err(Error::RemoteCancelled)),
        "the peer's abort ends the READ: {r:?}"
    );

    // 2. The owner cancels a stalled operation: `cancel` returns at once,
    // and the memory stays out of reach while the copy is stuck.
    let b = stalled[1];
    let read_b = reads[b].take().unwrap();
    let read_b = promptly("cancel() of a stalled READ", move || {
        read_b.cancel();
        read_b
    });
    assert_eq!(read_b.status(), OperationStatus::Cancelled);
    assert!(
        read_b.descriptors().is_none(),
        "the memory of a cancelled READ whose copy is stuck is not handed out"
    );
    assert!(
        !read_b.is_released(),
        "a cancelled READ whose copy is stuck is not done with its memory"
    );

    // 3. An operation waiting for a copy slot is cancelled at once too.
    let c = waiting[0];
    let read_c = reads[c].take().unwrap();
    let read_c = promptly("cancel() of a READ waiting for a copy slot", move || {
        read_c.cancel();
        read_c
    });
    assert_eq!(read_c.status(), OperationStatus::Cancelled);

    // 4. Meanwhile other connections, transfers and timers go on.
    let before = ticks.load(Ordering::Relaxed);
    let rt2 = rt;
    let _victim = promptly("a TCP transfer between two other connectors", move || {
        rt2.block_on(async {
            let a = Connector::builder()
                .listen("127.0.0.1:0".parse().unwrap())
                .transports(&[TransportKind::Tcp])
                .build()
                .await
                .unwrap();
            let w = a
                .create_readable(vec![Descriptor::from_vec(vec![9u8; 1 << 20])])
                .await
                .unwrap();
            let r = victim
                .begin_read(w.metadata(), vec![Descriptor::from_vec(vec![0u8; 1 << 20])])
                .await
                .unwrap();
            r.wait_for_completion().await.unwrap();
            assert!(r.into_descriptors()[0]
                .as_slice()
                .unwrap()
                .iter()
                .all(|&b| b == 9));
            victim
        })
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        ticks.load(Ordering::Relaxed) > before,
        "the runtime's timers stopped"
    );

    // 5. The pages arrive: the stuck copies return, the cancelled READ's
    // memory is handed out again, the others complete.
    peer.say("serve");
    peer.expect_any(&["SERVED"]);
    promptly("the stuck copies' return", move || {
        while read_b.descriptors().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(read_b.is_released(), "its copy returned: it is done");
        drop(read_a);
    });
    for (i, r) in reads.into_iter().enumerate() {
        if let Some(r) = r {
            rt.block_on(r.wait_for_completion_timeout(PROMPT))
                .unwrap_or_else(|e| panic!("READ {i} after the pages arrived: {e}"));
            assert!(r.into_descriptors()[0]
                .as_slice()
                .unwrap()
                .iter()
                .all(|&b| b == 0));
        }
    }
}
