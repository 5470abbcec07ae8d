//! Hostile processes of the same host against cross-memory attach.
//!
//! Each test spawns real processes (this test binary, run again in a role
//! chosen by an environment variable) that speak the wire protocol by hand,
//! as an attacker would, against a real connector:
//!
//! - a process that passes the attach probe, forks a child to keep the
//!   connection, and replaces its own program (`exec`, same pid) with one
//!   that holds other bytes where it lent memory: the connector must not
//!   copy from the new program;
//! - a process that passes the probe without offering CUDA IPC, then lends
//!   "GPU memory" by a CUDA IPC lease: that request fails, the connection
//!   goes on;
//! - probes stalled on a page that never arrives (`userfaultfd`): each gives
//!   its slot back at its timeout, and a legitimate peer still attaches;
//! - a process with 20,000 open files: the probe examines a bounded number
//!   of them.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ferry::{Error, OperationKind, OperationStatus, RdmaMetadata, TransportKind};
use ferry_proto::wire::{Lease, Message, Open};

/// What untouched exposed memory holds.
const UNTOUCHED: u8 = 0xEE;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// This test binary, run again for test `name` in the role `role` (an
/// environment variable) with `value`, its standard input and output piped;
/// killed when dropped (a failed test leaves nothing behind).
fn spawn_role(name: &str, role: &str, value: &str, env: &[(&str, &str)]) -> Role {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(role, value)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    Role(child)
}

/// A child process in a role.
struct Role(Child);

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The rest of the next line of `out` after `tag` (the test harness may
/// print its own words first on the line).
fn line_after(out: &mut BufReader<ChildStdout>, tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("the child process ended before it said {tag:?}");
        }
        if let Some((_, rest)) = line.split_once(tag) {
            return rest.trim().to_string();
        }
    }
}

/// Reads the rest of `out` in the background, so that the child never
/// writes into a closed pipe.
fn drain(mut out: BufReader<ChildStdout>) {
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
}

impl Wire {
    fn expect_attach(&mut self) -> Option<Attach> {
        match self.next() {
            Some(m) if Attach::of(&m).is_some() => Attach::of(&m),
            None => None,
            Some(other) => panic!("expected an attach offer, got {other:?}"),
        }
    }

    /// Offers to attach, as the active side; returns the cookie the
    /// connector will look for in this process.
    fn offer(&mut self, nonce: [u8; 16]) -> [u8; 16] {
        let (act, pas) = (self.s.local_addr().unwrap(), self.s.peer_addr().unwrap());
        self.send(&attach(std::process::id(), 0, nonce, Verdict::Unknown));
        let offered = self.expect_attach().expect("the connector offers attach");
        assert_ne!(offered.pid, 0, "the connector offers attach on loopback");
        active_cookie(&nonce, &offered.cookie, act, pas)
    }

    /// Offers to attach and shows `addr` as where the cookie lies: the
    /// connector's verdict on this process (`None`: none came in time).
    fn attach_at(
        &mut self,
        nonce: [u8; 16],
        addr: impl FnOnce(&[u8; 16]) -> u64,
    ) -> Option<Verdict> {
        let cookie = Box::new(self.offer(nonce));
        let at = addr(&cookie);
        self.send(&attach(std::process::id(), at, [0; 16], Verdict::Refused));
        let v = self.expect_attach().map(|a| a.verdict);
        drop(cookie);
        v
    }

    /// A WRITE into `m` whose source this process lends at `addr`.
    fn pulled_write(&mut self, req: u64, m: &RdmaMetadata, addr: u64) {
        self.pulled_write_with(req, m, addr, Vec::new())
    }

    /// [`pulled_write`](Self::pulled_write) with `key` as the lease's
    /// opaque bytes.
    fn pulled_write_with(&mut self, req: u64, m: &RdmaMetadata, addr: u64, key: Vec<u8>) {
        let sizes = sizes_of(m);
        self.send(&Message::Open(Open {
            req,
            op_id: m.operation_id(),
            token: *m.token(),
            kind: OperationKind::Write,
            sizes: sizes.clone().into(),
            pull: true,
            part: 0,
            parts: 1,
        }));
        // An opaque key here is a CUDA IPC lease.
        let lane = if key.is_empty() {
            ferry_proto::lane::LaneId::CMA
        } else {
            ferry_proto::lane::LaneId::CUDA_IPC
        };
        self.send(&Message::Lease(Lease {
            lane,
            req,
            segments: vec![(addr, sizes[0])].into(),
            key,
        }));
    }
}

/// Two writables of [`UNTOUCHED`] bytes on `target` (64 KiB, then
/// `second` bytes), and a child process for test `name` in role `role`
/// (given `target`'s address) that was handed their metadata on its
/// standard input, one line each; with its output.
async fn two_writables_for(
    target: &ferry::Connector,
    second: usize,
    name: &str,
    role: &str,
) -> (
    ferry::WritableOperation<'static>,
    ferry::WritableOperation<'static>,
    Role,
    BufReader<ChildStdout>,
) {
    let first = target
        .create_writable(vec![vec![UNTOUCHED; 64 << 10].into()])
        .await
        .unwrap();
    let second = target
        .create_writable(vec![vec![UNTOUCHED; second].into()])
        .await
        .unwrap();
    let mut child = spawn_role(name, role, &target.local_addr().to_string(), &[]);
    let mut stdin = child.0.stdin.take().unwrap();
    writeln!(stdin, "{}", first.metadata().to_json()).unwrap();
    writeln!(stdin, "{}", second.metadata().to_json()).unwrap();
    let out = BufReader::new(child.0.stdout.take().unwrap());
    (first, second, child, out)
}

/// A role's start: connects to `target` as `name`, passes the attach
/// probe (the cookie lies in the returned box, to be kept while lending),
/// prints `VERDICT <verdict>`, and reads the two metadata documents of
/// [`two_writables_for`].
fn probed(
    target: SocketAddr,
    name: &str,
    nonce: [u8; 16],
) -> (Wire, Box<[u8; 16]>, RdmaMetadata, RdmaMetadata) {
    let mut w = Wire::hello(target, name);
    let cookie = Box::new(w.offer(nonce));
    w.send(&attach(
        std::process::id(),
        cookie.as_ptr() as u64,
        [0; 16],
        Verdict::Refused,
    ));
    let verdict = w.expect_attach().expect("a verdict").verdict;
    println!("VERDICT {verdict:?}");
    let mut lines = std::io::stdin().lock().lines();
    let mut metadata = || RdmaMetadata::from_json(&lines.next().unwrap().unwrap()).unwrap();
    let (first, second) = (metadata(), metadata());
    (w, cookie, first, second)
}

/// Waits for the connector's `Finish` of request `req` on `w`.
fn await_finish(w: &mut Wire, req: u64) {
    loop {
        match w.next() {
            Some(Message::Finish { req: r }) if r == req => return,
            Some(_) => {}
            None => panic!("the connector closed the connection"),
        }
    }
}

// ---------------------------------------------------------------------------
// Item: a lease is honoured only while the probed program holds it.

const EXEC_ATTACKER: &str = "FERRY_TEST_EXEC_ATTACKER";
const IMPOSTER: &str = "FERRY_TEST_IMPOSTER";
/// What the attacker lends, and what its new program holds at that address.
const LENT: u8 = 0x22;
const IMPOSTER_BYTE: u8 = 0x66;

/// A process passes the probe and lends memory once (copied by attach);
/// then it forks a child that keeps the connection and replaces its own
/// program with `exec` (same pid) by one that maps other bytes at the
/// address the child lends next. Before the fix the connector copied the new
/// program's bytes and completed the write. Now it notices that the process
/// no longer runs the program that passed the probe: the write fails,
/// nothing lands, and the connection is closed with that cause.
#[test]
fn a_process_that_replaced_its_program_after_the_probe_is_not_copied_from() {
    const NAME: &str = "a_process_that_replaced_its_program_after_the_probe_is_not_copied_from";
    if let Ok(spec) = std::env::var(IMPOSTER) {
        return imposter(&spec);
    }
    if let Ok(addr) = std::env::var(EXEC_ATTACKER) {
        return exec_attacker(addr.parse().unwrap(), NAME);
    }
    runtime().block_on(async {
        let target = attaching_connector().await;
        let (first, second, child, mut out) =
            two_writables_for(&target, 1 << 20, NAME, EXEC_ATTACKER).await;
        let verdict = tokio::task::spawn_blocking(move || {
            let said = line_after(&mut out, "VERDICT ");
            drain(out);
            said
        })
        .await
        .unwrap();
        assert_eq!(verdict, "CanPull", "the attacker passes the probe");

        let done = tokio::time::timeout(Duration::from_secs(10), first.wait_for_completion()).await;
        assert!(matches!(done, Ok(Ok(()))), "the first write: {done:?}");
        assert_eq!(first.transport(), Some(TransportKind::Cma));
        let got = first.into_descriptors();
        assert!(got[0].as_slice().unwrap().iter().all(|&b| b == LENT));

        let ended = tokio::time::timeout(Duration::from_secs(10), second.wait_for_completion())
            .await
            .expect("the second write neither completed nor failed within 10 s");
        let status = second.status();
        let got = second.into_descriptors();
        let from_imposter = got[0]
            .as_slice()
            .unwrap()
            .iter()
            .filter(|&&b| b == IMPOSTER_BYTE)
            .count();
        assert_eq!(
            (status, from_imposter),
            (OperationStatus::Errored, 0),
            "the write from the new program ended with {ended:?}, \
             and that many of its bytes landed"
        );
        match &ended {
            Err(Error::ConnectionLost { cause, .. }) => {
                assert!(cause.contains("exec"), "{cause}")
            }
            other => panic!("expected the connection to be lost, got {other:?}"),
        }
        assert!(
            got[0].as_slice().unwrap().iter().all(|&b| b == UNTOUCHED),
            "bytes landed after the program changed"
        );
        drop(child);
    });
}

/// The attacker: passes the probe, lends memory once, then forks and execs.
fn exec_attacker(target: SocketAddr, name: &str) {
    let (mut w, _cookie, first, second) = probed(target, "exec-attacker", [9; 16]);

    // A write that the connector copies from this program.
    let lent = vec![LENT; sizes_of(&first)[0] as usize];
    w.pulled_write(1, &first, lent.as_ptr() as u64);
    await_finish(&mut w, 1);
    w.send(&Message::Finish { req: 1 });

    // Memory at an address the next program maps too.
    let len = sizes_of(&second)[0] as usize;
    // SAFETY: a fresh private anonymous mapping; integer arguments.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(at, libc::MAP_FAILED);
    // SAFETY: the mapping just made is `len` bytes long and ours alone.
    unsafe { std::ptr::write_bytes(at.cast::<u8>(), LENT, len) };
    let mut pipe = [0; 2];
    // SAFETY: `pipe` is valid for writes of two descriptors. Without
    // close-on-exec: the next program writes to it.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let (ready, ready_w) = (pipe[0], pipe[1]);
    // Everything `execve` needs, made before `fork`.
    let exe = CString::new(std::env::current_exe().unwrap().as_os_str().as_bytes()).unwrap();
    let args: Vec<CString> = ["--exact", name, "--nocapture", "--test-threads=1"]
        .iter()
        .map(|a| CString::new(*a).unwrap())
        .collect();
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != EXEC_ATTACKER && k != IMPOSTER)
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).unwrap()
        })
        .collect();
    env.push(CString::new(format!("{IMPOSTER}={}:{len}:{ready_w}", at as usize)).unwrap());
    let mut argv: Vec<*const libc::c_char> = vec![exe.as_ptr()];
    argv.extend(args.iter().map(|a| a.as_ptr()));
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());

    // SAFETY: plain fork; the child below only uses its own copy of this
    // single-threaded role's memory (blocking I/O, no runtime) and exits.
    match unsafe { libc::fork() } {
        0 => {
            // The child keeps the connection. Once the new program is in
            // place, it lends the memory at `at` again.
            // SAFETY: closing a descriptor this process owns.
            unsafe { libc::close(ready_w) };
            let mut byte = [0u8; 1];
            // SAFETY: `byte` is valid for writes of one byte.
            let n = unsafe { libc::read(ready, byte.as_mut_ptr().cast(), 1) };
            if n == 1 {
                w.pulled_write(2, &second, at as u64);
                // Answer as a source does, so that a connector that copied
                // the new program's bytes completes the write.
                while let Some(m) = w.next() {
                    if let Message::Finish { req: 2 } = m {
                        w.send(&Message::Finish { req: 2 });
                    }
                }
            }
            // SAFETY: ends this process at once, running nothing of the
            // parent's.
            unsafe { libc::_exit(0) }
        }
        -1 => panic!("fork failed: {}", std::io::Error::last_os_error()),
        _ => {
            // SAFETY: closing a descriptor this process owns; then `execve`
            // with NUL-terminated strings in NULL-terminated arrays that
            // live across the call.
            unsafe {
                libc::close(ready);
                libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
            panic!("exec failed: {}", std::io::Error::last_os_error());
        }
    }
}

/// The attacker's new program (same pid): maps `IMPOSTER_BYTE`s where the
/// old one lent memory, says so, and waits to be killed.
fn imposter(spec: &str) {
    let f: Vec<usize> = spec.split(':').map(|x| x.parse().unwrap()).collect();
    let (at, len, ready) = (f[0], f[1], f[2] as libc::c_int);
    // SAFETY: a private anonymous mapping at an address this new program
    // does not use (MAP_FIXED_NOREPLACE refuses otherwise).
    let got = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(got as usize, at, "the new program cannot map {at:#x}");
    // SAFETY: the mapping just made is `len` bytes long and ours alone.
    unsafe { std::ptr::write_bytes(got.cast::<u8>(), IMPOSTER_BYTE, len) };
    // SAFETY: one byte from a live buffer to the inherited pipe.
    assert_eq!(unsafe { libc::write(ready, [1u8].as_ptr().cast(), 1) }, 1);
    std::thread::sleep(Duration::from_secs(60));
}

// ---------------------------------------------------------------------------
// Item: a CUDA IPC lease to a process that did not offer CUDA IPC.

const IPC_LENDER: &str = "FERRY_TEST_IPC_LENDER";

/// A CUDA IPC lease (version 2, one allocation of `len` bytes, one run at
/// offset 0) whose handle names nothing.
fn ipc_lease(len: u64) -> Vec<u8> {
    let mut b = b"FCIP".to_vec();
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    b.extend_from_slice(&[0x5a; 64]);
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b
}

/// A process of this host passes the attach probe, offering no CUDA IPC
/// (so the connection has none, whether or not the connector's host has a
/// GPU), and sends a pulled WRITE whose lease is a CUDA IPC lease. The
/// connector must not act on it: that request fails with a reason that
/// names CUDA IPC, the peer is told, nothing lands, and the same
/// connection then carries a cross-memory-attach WRITE.
#[test]
fn a_cuda_ipc_lease_to_a_process_that_did_not_offer_it_fails_only_its_request() {
    const NAME: &str = "a_cuda_ipc_lease_to_a_process_that_did_not_offer_it_fails_only_its_request";
    if let Ok(addr) = std::env::var(IPC_LENDER) {
        return ipc_lender(addr.parse().unwrap());
    }
    runtime().block_on(async {
        let target = attaching_connector().await;
        let (first, second, child, mut out) =
            two_writables_for(&target, 64 << 10, NAME, IPC_LENDER).await;
        let said = tokio::task::spawn_blocking(move || {
            let said = [
                line_after(&mut out, "VERDICT "),
                line_after(&mut out, "ABORT "),
                line_after(&mut out, "FINISHED "),
            ];
            drain(out);
            said
        })
        .await
        .unwrap();
        assert_eq!(said[0], "CanPull", "the lender passes the probe");
        assert!(
            said[1].starts_with("1 DeviceMemory") && said[1].contains("CUDA IPC"),
            "the peer is told why: {}",
            said[1]
        );
        assert_eq!(said[2], "2");

        let ended = tokio::time::timeout(Duration::from_secs(10), first.wait_for_completion())
            .await
            .expect("the IPC-leased write ended within 10 s");
        match &ended {
            Err(Error::DeviceCopy { reason }) => {
                assert!(
                    reason.contains("CUDA IPC, which this process did not offer"),
                    "{reason}"
                )
            }
            other => panic!("expected the request to fail, got {other:?}"),
        }
        assert_eq!(first.status(), OperationStatus::Errored);
        let got = first.into_descriptors();
        assert!(got[0].as_slice().unwrap().iter().all(|&b| b == UNTOUCHED));

        let done =
            tokio::time::timeout(Duration::from_secs(10), second.wait_for_completion()).await;
        assert!(matches!(done, Ok(Ok(()))), "the next write: {done:?}");
        assert_eq!(second.transport(), Some(TransportKind::Cma));
        let got = second.into_descriptors();
        assert!(got[0].as_slice().unwrap().iter().all(|&b| b == LENT));
        drop(child);
    });
}

/// The lender: passes the probe, sends a pulled WRITE with a CUDA IPC
/// lease, reports the connector's answer, then a plain one.
fn ipc_lender(target: SocketAddr) {
    let (mut w, _cookie, first, second) = probed(target, "ipc-lender", [5; 16]);
    let lent = vec![LENT; sizes_of(&first)[0] as usize];
    w.pulled_write_with(
        1,
        &first,
        lent.as_ptr() as u64,
        ipc_lease(lent.len() as u64),
    );
    loop {
        match w.next() {
            Some(Message::Abort(a)) if a.req == 1 => {
                println!("ABORT 1 {:?} {}", a.reason, a.detail);
                break;
            }
            Some(Message::Finish { req: 1 }) => panic!("the IPC-leased write was finished"),
            Some(_) => {}
            None => panic!("the connector closed the connection"),
        }
    }
    w.pulled_write(2, &second, lent.as_ptr() as u64);
    await_finish(&mut w, 2);
    w.send(&Message::Finish { req: 2 });
    println!("FINISHED 2");
    // Keep the connection (and the lent memory) until the test is done.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

// ---------------------------------------------------------------------------
// Item: probes cannot be held.

const PROBER: &str = "FERRY_TEST_PROBER";
/// Probes awaited at once by a process (the library's `MAX_PROBES`).
const SLOTS: usize = 16;
/// The prober's probe timeout in this test.
const PROBE_TIMEOUT_MS: u64 = 300;

mod support;
use support::hand::{active_cookie, Wire};
use support::{attach, attaching_connector, sizes_of, uffd, Attach, Verdict};

/// One page of this process that never arrives (registered with
/// `userfaultfd` for missing pages, and never served); `None` (with the
/// reason printed) where the kernel refuses. Any read of it, by this
/// process or by the kernel on behalf of another (`process_vm_readv`),
/// waits until the `userfaultfd` is closed.
fn stalled_page() -> Option<uffd::Stall> {
    uffd::Stall::new(4096)
        .map_err(|e| eprintln!("skipped: the kernel refuses userfaultfd ({e})"))
        .ok()
}

#[test]
fn probes_stalled_on_a_page_that_never_arrives_give_their_slot_back() {
    const NAME: &str = "probes_stalled_on_a_page_that_never_arrives_give_their_slot_back";
    if std::env::var(PROBER).is_ok() {
        return prober();
    }
    let Some(stall) = stalled_page() else {
        return;
    };
    let timeout_ms = PROBE_TIMEOUT_MS.to_string();
    let mut child = spawn_role(
        NAME,
        PROBER,
        "1",
        &[("FERRY_CMA_PROBE_TIMEOUT_MS", timeout_ms.as_str())],
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let prober_addr: SocketAddr = line_after(&mut out, "LISTEN ").parse().unwrap();
    let page = stall.base as u64;
    for wave in [SLOTS, SLOTS / 2] {
        let probes: Vec<_> = (0..wave)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut w = Wire::hello(prober_addr, "staller");
                    w.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let t0 = Instant::now();
                    let v = w.attach_at([i as u8; 16], |_| page);
                    (v, t0.elapsed())
                })
            })
            .collect();
        for p in probes {
            let (verdict, took) = p.join().unwrap();
            assert_eq!(
                verdict,
                Some(Verdict::Refused),
                "no verdict within 5 s: the stalled probes kept their slots"
            );
            assert!(
                took >= Duration::from_millis(PROBE_TIMEOUT_MS * 3 / 4),
                "a probe was refused at once ({took:?}): it found no slot"
            );
        }
    }
    runtime().block_on(async {
        let me = attaching_connector().await;
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let readable = me.create_readable(vec![data.into()]).await.unwrap();
        let mut stdin = child.0.stdin.take().unwrap();
        writeln!(stdin, "READ {}", readable.metadata().to_json()).unwrap();
        let result = tokio::task::spawn_blocking(move || {
            let said = line_after(&mut out, "RESULT ");
            drain(out);
            said
        })
        .await
        .unwrap();
        assert_eq!(result, "cma Ok(())", "the legitimate read");
        tokio::time::timeout(Duration::from_secs(10), readable.wait_for_completion())
            .await
            .unwrap()
            .unwrap();
        drop(stdin);
    });
    child.0.wait().unwrap();
    drop(stall);
}

/// The prober: a connector that reads what it is told to read.
fn prober() {
    let rt = runtime();
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
                .unwrap_or(Err(Error::Timeout(Duration::from_secs(10))));
            let t = op.transport().map(|t| t.to_string()).unwrap_or_default();
            println!("RESULT {t} {r:?}");
        }
    });
    // Threads stuck on the stalled page must not hold this process.
    std::process::exit(0);
}

// ---------------------------------------------------------------------------
// Item: probes cannot be made expensive.

const MANY_FILES: &str = "FERRY_TEST_MANY_FILES";
const FILES: usize = 20_000;

/// A process with 20,000 open files attaches twice: once with a socket
/// opened before those files (among the first the probe examines: it
/// passes), once with a socket opened after them. The probe examines a
/// bounded number of files (1,024 by default), so the second socket is not
/// looked for and the connection falls back to TCP. Before the fix, the
/// probe read all 20,000 links (about 100 times the attacker's cost) and
/// passed.
#[test]
fn a_probe_examines_a_bounded_number_of_the_peers_open_files() {
    const NAME: &str = "a_probe_examines_a_bounded_number_of_the_peers_open_files";
    if let Ok(addr) = std::env::var(MANY_FILES) {
        return many_files(addr.parse().unwrap());
    }
    runtime().block_on(async {
        let target = attaching_connector().await;
        let mut child = spawn_role(NAME, MANY_FILES, &target.local_addr().to_string(), &[]);
        let mut out = BufReader::new(child.0.stdout.take().unwrap());
        let said = tokio::task::spawn_blocking(move || {
            let said = line_after(&mut out, "VERDICTS ");
            drain(out);
            said
        })
        .await
        .unwrap();
        child.0.wait().unwrap();
        if let Some(why) = said.strip_prefix("skipped") {
            eprintln!("skipped{why}");
            return;
        }
        assert_eq!(said, "Some(CanPull) Some(Refused)");
    });
}

/// The process with many files.
fn many_files(target: SocketAddr) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is valid for writes of one `rlimit`.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    // As many as the hard limit allows, up to FILES (a few for the rest).
    let files = usize::try_from(lim.rlim_max)
        .unwrap_or(usize::MAX)
        .min(FILES + 64)
        - 64;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid `rlimit` (the soft limit up to the hard one).
    if files < 8192 || unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        println!(
            "VERDICTS skipped: cannot open {FILES} files (the limit is {})",
            lim.rlim_max
        );
        return;
    }
    let mut before = Wire::hello(target, "few-files");
    let early = before.attach_at([1; 16], |c| c.as_ptr() as u64);
    let files: Vec<std::fs::File> = (0..files)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let mut after = Wire::hello(target, "many-files");
    assert!(after.s.as_raw_fd() as usize > files.len());
    let late = after.attach_at([2; 16], |c| c.as_ptr() as u64);
    println!("VERDICTS {early:?} {late:?}");
    drop(files);
}
