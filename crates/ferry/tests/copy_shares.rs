//! Same-host copies that a peer stalls never stop honest transfers.
//!
//! A cross-memory copy that a peer stalls (it lends memory whose pages
//! never arrive: `userfaultfd` here) holds a copy slot and its thread until
//! the pages come. Before the fix, 16 connections of one hostile process
//! with 4 stalled copies each held all 64 slots of the victim, and every
//! later copy of the victim, from a peer it knew or a new one, waited for a
//! slot until its deadline. Now:
//!
//! - one peer process holds at most its share of the slots (16 of 64,
//!   whatever number of connections it opens); its copies past its share
//!   wait for its own (they hold no slot), and other peers' copies go on;
//! - where no slot is free at all (four hostile processes), an honest READ
//!   goes in band over TCP, at once, and an honest WRITE that the victim
//!   would copy is refused at once (`Abort(CopySlots)`), never queued;
//! - probes stalled the same way, and one refused while the probe threads
//!   were all stuck, no longer switch attach off for good: it comes back
//!   once the stuck probes end.
//!
//! The hostile peers are real processes (this test binary, run again in a
//! role chosen by an environment variable) that speak the protocol by hand.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry::{AbortReason, Connector, OperationKind, RdmaMetadata, TransportKind};
use ferry_proto::wire::{Lease, Message, Open};

mod support;
use support::hand::{active_cookie, Wire};
use support::{attach, attaching_connector, pattern, sizes_of, uffd, Attach, Verdict};

/// The library's bounds (`stall.rs`): copies per connection, per peer
/// process, in the whole process.
const PER_CONNECTION: usize = 4;
const PER_PEER: usize = 16;
const IN_PROCESS: usize = 64;
/// Generous bound for what must be prompt (it is "never" before the fix).
const PROMPT: Duration = Duration::from_secs(10);
/// A page of the hostile peer per stalled copy.
const PAGE: usize = 4096;

const STALLER: &str = "FERRY_TEST_STALLER";
const PROBER: &str = "FERRY_TEST_SHARE_PROBER";

// ---------------------------------------------------------------------------
// A hand-driven connection, blocking (the roles run no runtime).

impl Wire {
    fn verdict(&mut self) -> Option<Verdict> {
        match self.next() {
            Some(m) => Attach::of(&m).map(|a| a.verdict),
            _ => None,
        }
    }

    /// The attach exchange, as the active side: this process shows the
    /// cookie the connector expects at the address `at` gives (the real
    /// one, or a page that never arrives); the connector's verdict.
    fn attach_at(&mut self, nonce: [u8; 16], at: impl FnOnce(&[u8; 16]) -> u64) -> Option<Verdict> {
        let (act, pas) = (self.s.local_addr().unwrap(), self.s.peer_addr().unwrap());
        self.send(&attach(std::process::id(), 0, nonce, Verdict::Unknown));
        let offered = match self.next() {
            Some(m) if Attach::of(&m).is_some() => Attach::of(&m).unwrap(),
            other => panic!("expected the connector's offer, got {other:?}"),
        };
        assert_ne!(offered.pid, 0, "the connector offers attach on loopback");
        let cookie = Box::new(active_cookie(&nonce, &offered.cookie, act, pas));
        let addr = at(&cookie);
        self.send(&attach(std::process::id(), addr, [0; 16], Verdict::Refused));
        let v = self.verdict();
        std::mem::forget(cookie);
        v
    }
}

// ---------------------------------------------------------------------------
// The hostile process.

/// A child process in a role, its output read line by line in the
/// background; killed when dropped.
struct Role {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Role {
    fn spawn(name: &str, role: &str, value: &str, env: &[(&str, &str)]) -> Role {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(role, value)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Role {
            child,
            stdin,
            lines,
        }
    }

    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The rest of the next line that holds `tag`.
    fn expect(&self, tag: &str) -> String {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the child did not say {tag:?}"));
            if let Some((_, rest)) = line.split_once(tag) {
                return rest.trim().to_string();
            }
        }
    }

    /// Reads the hostile process's report until it says `SETTLED`: how
    /// many copies touched its stalled pages, and how many of its WRITEs
    /// were refused for want of a copy slot; `None` where it skipped.
    fn settle(&self) -> Option<(usize, usize)> {
        let (mut faults, mut refused) = (0, 0);
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .expect("the hostile process did not settle");
            if let Some((_, why)) = line.split_once("SKIP ") {
                eprintln!("skipped: {why}");
                return None;
            }
            if line.contains("FAULT ") {
                faults += 1;
            } else if line.contains("ABORT CopySlots") {
                refused += 1;
            } else if line.contains("SETTLED") {
                return Some((faults, refused));
            }
        }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The hostile peer: `conns` connections to the victim, each passing the
/// attach probe, then `PER_CONNECTION` WRITEs on each whose lease names a
/// page that never arrives. Prints `FAULT` for each page a copy touched,
/// `ABORT <reason>` for each WRITE refused, and keeps everything until it
/// is killed.
fn staller(spec: &str) {
    let (addr, conns) = spec.split_once(' ').unwrap();
    let (addr, conns): (SocketAddr, usize) = (addr.parse().unwrap(), conns.parse().unwrap());
    let writes = conns * PER_CONNECTION;
    let stall = match uffd::Stall::new(writes * PAGE) {
        Ok(s) => s,
        Err(e) => {
            println!("SKIP the kernel refuses userfaultfd: {e}");
            return;
        }
    };
    let (fd, base) = (stall.fd, stall.base as u64);
    std::thread::spawn(move || {
        while let Ok(at) = uffd::Stall::next_fault(fd) {
            println!("FAULT {}", (at - base) / PAGE as u64);
        }
    });
    let mut lines = std::io::stdin().lock().lines();
    let metas: Vec<RdmaMetadata> = (0..writes)
        .map(|_| RdmaMetadata::from_json(&lines.next().unwrap().unwrap()).unwrap())
        .collect();
    let mut wires = Vec::new();
    for c in 0..conns {
        let mut w = Wire::hello(addr, &format!("staller-{c}"));
        let v = w.attach_at([c as u8; 16], |cookie| cookie.as_ptr() as u64);
        assert_eq!(v, Some(Verdict::CanPull), "the victim can copy from here");
        for k in 0..PER_CONNECTION {
            let i = c * PER_CONNECTION + k;
            let m = &metas[i];
            let sizes = sizes_of(m);
            w.send(&Message::Open(Open {
                req: k as u64 + 1,
                op_id: m.operation_id(),
                token: *m.token(),
                kind: OperationKind::Write,
                sizes: sizes.clone().into(),
                pull: true,
                part: 0,
                parts: 1,
            }));
            w.send(&Message::Lease(Lease {
                lane: ferry_proto::lane::LaneId::CMA,
                req: k as u64 + 1,
                segments: vec![(base + (i * PAGE) as u64, sizes[0])].into(),
                key: Vec::new(),
            }));
        }
        w.s.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        wires.push(w);
    }
    println!("SENT");
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        for w in &mut wires {
            while let Some(m) = w.next() {
                if let Message::Abort(a) = m {
                    println!("ABORT {:?}", a.reason);
                }
            }
        }
    }
    println!("SETTLED");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(stall);
}

/// Starts a hostile process with `conns` connections to `victim`, hands it
/// metadata of fresh writables of the victim, and waits until it settled:
/// the process, how many copies it stalled and how many of its WRITEs were
/// refused; `None` where the kernel refuses userfaultfd.
async fn stall_from(victim: &Connector, conns: usize) -> Option<(Role, (usize, usize))> {
    const NAME: &str = "stalled_copies_never_hold_back_honest_reads";
    let spec = format!("{} {conns}", victim.local_addr());
    let mut role = Role::spawn(NAME, STALLER, &spec, &[]);
    let mut metas = Vec::new();
    for _ in 0..conns * PER_CONNECTION {
        let w = victim
            .create_writable(vec![vec![0u8; PAGE].into()])
            .await
            .unwrap();
        metas.push(w.metadata().to_json());
        // Kept exposed for the whole test.
        std::mem::forget(w);
    }
    for m in metas {
        role.say(&m);
    }
    tokio::task::spawn_blocking(move || {
        let report = role.settle();
        report.map(|r| (role, r))
    })
    .await
    .unwrap()
}

/// `victim` reads 1 MiB of `from`: it completes within [`PROMPT`], every
/// byte right; the transport it went by.
async fn honest_read(victim: &Connector, from: &Connector, seed: u8) -> TransportKind {
    let data = pattern(seed, 1 << 20);
    let readable = from
        .create_readable(vec![data.clone().into()])
        .await
        .unwrap();
    let read = victim
        .begin_read(readable.metadata(), vec![vec![0u8; 1 << 20].into()])
        .await
        .unwrap();
    tokio::time::timeout(PROMPT, read.wait_for_completion())
        .await
        .unwrap_or_else(|_| panic!("an honest READ waited {PROMPT:?} behind stalled copies"))
        .unwrap();
    let via = read.transport().unwrap();
    assert_eq!(read.into_descriptors()[0].as_slice().unwrap(), &data[..]);
    via
}

#[test]
fn stalled_copies_never_hold_back_honest_reads() {
    if let Ok(spec) = std::env::var(STALLER) {
        return staller(&spec);
    }
    // Leaked: copies stuck in the kernel must not hold the test's end.
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    ));
    rt.block_on(async {
        let victim = attaching_connector().await;
        // A peer the victim knows from before the attack.
        let known = attaching_connector().await;
        assert_eq!(honest_read(&victim, &known, 1).await, TransportKind::Cma);

        // 1. One hostile process, 16 connections, 4 stalled copies each:
        // it holds its share of the slots, no more; its other copies wait
        // for its own (none is refused: the process still has slots).
        let Some((first, (stalled, refused))) = stall_from(&victim, 16).await else {
            return;
        };
        assert_eq!(
            stalled, PER_PEER,
            "one peer process had {stalled} copies stuck at once"
        );
        assert_eq!(refused, 0, "copies past a peer's share wait for its own");
        // Honest READs from the known peer and from a new one still go by
        // cross-memory attach.
        assert_eq!(honest_read(&victim, &known, 2).await, TransportKind::Cma);
        let new = attaching_connector().await;
        assert_eq!(honest_read(&victim, &new, 3).await, TransportKind::Cma);

        // 2. Three more hostile processes take the other slots: no slot is
        // free, and honest READs go in band, at once.
        let mut others = Vec::new();
        for _ in 0..(IN_PROCESS - PER_PEER) / PER_PEER {
            let Some((p, (stalled, refused))) =
                stall_from(&victim, PER_PEER / PER_CONNECTION).await
            else {
                return;
            };
            assert_eq!((stalled, refused), (PER_PEER, 0));
            others.push(p);
        }
        assert_eq!(honest_read(&victim, &known, 4).await, TransportKind::Tcp);
        let newer = attaching_connector().await;
        assert_eq!(honest_read(&victim, &newer, 5).await, TransportKind::Tcp);

        // 3. An honest WRITE into the victim, which would copy it, is
        // refused at once with a typed error (no copy slot), not queued.
        let w = victim
            .create_writable(vec![vec![0u8; 1 << 20].into()])
            .await
            .unwrap();
        let write = known
            .begin_write(vec![pattern(6, 1 << 20).into()], w.metadata())
            .await
            .unwrap();
        let r = tokio::time::timeout(PROMPT, write.wait_for_completion())
            .await
            .expect("an honest WRITE waited behind stalled copies");
        match r {
            Err(ferry::Error::Rejected {
                reason: AbortReason::CopySlots,
                ..
            }) => {}
            other => panic!("expected a refusal for want of a copy slot, got {other:?}"),
        }
        drop((first, others));
    });
}

// ---------------------------------------------------------------------------
// Stuck probes, and one refused meanwhile, do not switch attach off.

/// The prober's probe timeout in this test.
const PROBE_TIMEOUT_MS: u64 = 200;
/// Probes awaited at once, and probe threads alive at once, at most (the
/// library's `MAX_PROBES` and `MAX_PROBE_THREADS`).
const MAX_PROBES: usize = 16;
const MAX_PROBE_THREADS: usize = 64;

/// Before the fix, the probe refused while all 64 probe threads were stuck
/// miscounted the threads: once the stuck ones ended, the count wrapped
/// below zero and every later probe was refused, for the life of the
/// process. Now attach comes back once the stuck probes end.
#[test]
fn attach_comes_back_once_stuck_probes_end() {
    const NAME: &str = "attach_comes_back_once_stuck_probes_end";
    if std::env::var(PROBER).is_ok() {
        return prober();
    }
    let Ok(stall) = uffd::Stall::new(PAGE) else {
        eprintln!("skipped: the kernel refuses userfaultfd");
        return;
    };
    let timeout_ms = PROBE_TIMEOUT_MS.to_string();
    let mut prober = Role::spawn(
        NAME,
        PROBER,
        "1",
        &[("FERRY_CMA_PROBE_TIMEOUT_MS", timeout_ms.as_str())],
    );
    let target: SocketAddr = prober.expect("LISTEN ").parse().unwrap();
    let page = stall.base as u64;
    let mut held = Vec::new();
    // Every probe thread stuck on the page, in waves of the probes awaited
    // at once.
    for wave in 0..MAX_PROBE_THREADS / MAX_PROBES {
        let probes: Vec<_> = (0..MAX_PROBES)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut w = Wire::hello(target, "staller");
                    w.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let v = w.attach_at([(wave * MAX_PROBES + i) as u8; 16], |_| page);
                    (v, w)
                })
            })
            .collect();
        for p in probes {
            let (v, w) = p.join().unwrap();
            assert_eq!(v, Some(Verdict::Refused), "a stalled probe times out");
            held.push(w);
        }
    }
    // One more, while every probe thread is stuck: refused at once.
    let mut w = Wire::hello(target, "one-more");
    w.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    assert_eq!(w.attach_at([0xFF; 16], |_| page), Some(Verdict::Refused));
    assert!(
        t0.elapsed() < Duration::from_millis(PROBE_TIMEOUT_MS),
        "refused at once: no probe thread is left"
    );
    // The attacker leaves: the page arrives, the stuck probes end.
    uffd::Stall::serve(stall.fd, page, PAGE as u64);
    drop((w, held));
    std::thread::sleep(Duration::from_secs(1));

    // A legitimate peer attaches again.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let me = attaching_connector().await;
        let data = pattern(7, 1 << 20);
        let readable = me.create_readable(vec![data.into()]).await.unwrap();
        prober.say(&format!("READ {}", readable.metadata().to_json()));
        let result = tokio::task::spawn_blocking(move || {
            let r = prober.expect("RESULT ");
            (prober, r)
        })
        .await
        .unwrap()
        .1;
        assert_eq!(result, "cma Ok(())", "attach is back after the stall");
    });
    drop(stall);
}

/// The prober: a connector that reads what it is told to read.
fn prober() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = attaching_connector().await;
        println!("LISTEN {}", c.local_addr());
        let mut lines = std::io::stdin().lock().lines();
        while let Some(Ok(line)) = lines.next() {
            let Some(json) = line.strip_prefix("READ ") else {
                continue;
            };
            let m = RdmaMetadata::from_json(json).unwrap();
            let size = sizes_of(&m)[0] as usize;
            let op = c
                .begin_read(&m, vec![vec![0u8; size].into()])
                .await
                .unwrap();
            let r = tokio::time::timeout(Duration::from_secs(10), op.wait_for_completion())
                .await
                .unwrap_or(Err(ferry::Error::Timeout(Duration::from_secs(10))));
            let t = op.transport().map(|t| t.to_string()).unwrap_or_default();
            println!("RESULT {t} {r:?}");
        }
    });
    std::process::exit(0);
}
