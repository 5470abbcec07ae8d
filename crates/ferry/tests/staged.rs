//! GPU memory in band over TCP between two processes: each side stages its
//! own device memory through host memory (`transport/tcp/staged.rs`).
//! READ and WRITE, GPU→GPU, GPU→CPU and CPU→GPU, 1 byte to 64 MiB, 16
//! mixed descriptors, striped over 4 streams, through the secure channel, a
//! cancel mid-transfer after which no byte changes, a peer killed
//! mid-transfer, and a failed device copy that ends its operation alone;
//! byte for byte on the destination.
//!
//! Each test spawns a real second process (this test binary, run again for
//! the same test with `ROLE` set) that serves one operation and prints its
//! metadata; this process is the active side. The connectors use TCP only
//! (no cross-memory attach, so no CUDA IPC): the staged path.
//!
//! **Where there is a GPU** the memory is `CudaBuffer`s and the copies are
//! the driver's. **Where there is none** (CI, the machine this was written
//! on), both processes call `ferry::cuda::simulate_with_host_memory()`:
//! "device memory" is host memory described as `cuda:0` and the device's
//! copies are `memcpy`s, so everything but the driver's calls runs here.

use std::io::Write;
use std::time::Duration;

use ferry::cuda::CudaBuffer;
use ferry::{Connector, Descriptor, OperationStatus, TransportKind};

#[path = "support/sim_memory.rs"]
mod sim_memory;
#[path = "support/spawned.rs"]
mod spawned;
use sim_memory::Keep;
use spawned::{check, pattern, runtime, Server};

/// The environment variable that makes this binary a server process.
const ROLE: &str = "FERRY_STAGED_TEST_SERVE";
/// What untouched destination memory holds.
const SENTINEL: u8 = 0xEE;
/// How long any one operation may take.
const LIMIT: Duration = Duration::from_secs(120);
const MIB: usize = 1 << 20;

/// Real GPU memory where CUDA is here, else the simulation (once per
/// process, before any connector).
fn init() -> bool {
    static REAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REAL.get_or_init(|| {
        let real = ferry::cuda::available();
        if !real {
            // SAFETY: every "device" address this process gives Ferry is
            // host memory (`make`'s boxed slices), alive and unaliased for
            // its descriptor's life.
            unsafe { ferry::cuda::simulate_with_host_memory() };
        }
        real
    })
}

/// How the two connectors are set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opts {
    Plain,
    Striped,
    Secret,
}

async fn connector(opts: Opts) -> Connector {
    let b = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp]);
    let b = match opts {
        Opts::Plain => b.tcp_streams(1),
        Opts::Striped => b.tcp_streams(4).stripe_threshold(MIB as u64),
        Opts::Secret => b.tcp_streams(1).secret([7u8; 32]),
    };
    b.build().await.expect("connector starts")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mem {
    Gpu,
    Host,
}

/// Descriptors of `sizes` in `mem`, holding `pattern(seed, i, ..)` where
/// `seed` is given, else [`SENTINEL`] bytes.
fn make(mem: Mem, sizes: &[usize], seed: Option<u64>) -> (Vec<Descriptor<'static>>, Keep) {
    let real = init();
    let mut keep = Keep::default();
    let descs = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let bytes = match seed {
                Some(s) => pattern(s, i, len),
                None => vec![SENTINEL; len],
            };
            match mem {
                Mem::Host => Descriptor::from_vec(bytes),
                // Simulated where `init` found no GPU.
                Mem::Gpu => keep.gpu_descriptor(bytes, real),
            }
        })
        .collect();
    (descs, keep)
}

// ---------------------------------------------------------------------------
// The server process.

/// What the server process serves.
struct Spec {
    readable: bool,
    mem: Mem,
    sizes: Vec<usize>,
    seed: u64,
    opts: Opts,
}

impl Spec {
    fn encode(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        format!(
            "{};{:?};{};{};{:?}",
            self.readable,
            self.mem,
            sizes.join(","),
            self.seed,
            self.opts
        )
    }

    fn decode(s: &str) -> Spec {
        let f: Vec<&str> = s.split(';').collect();
        Spec {
            readable: f[0] == "true",
            mem: if f[1] == "Gpu" { Mem::Gpu } else { Mem::Host },
            sizes: f[2].split(',').map(|x| x.parse().unwrap()).collect(),
            seed: f[3].parse().unwrap(),
            opts: match f[4] {
                "Striped" => Opts::Striped,
                "Secret" => Opts::Secret,
                _ => Opts::Plain,
            },
        }
    }
}

/// Serves one operation, printing `META <json>`, then `DONE <status>
/// <transport>` and, for a writable, `CHECK ok` or `CHECK <what differs>`;
/// exits once its standard input closes.
fn serve(spec: &str) {
    let spec = Spec::decode(spec);
    init();
    runtime().block_on(async {
        let c = connector(spec.opts).await;
        let out = std::io::stdout();
        let say = |s: String| {
            writeln!(out.lock(), "{s}").unwrap();
            out.lock().flush().unwrap();
        };
        if spec.readable {
            let (descs, keep) = make(spec.mem, &spec.sizes, Some(spec.seed));
            let op = c.create_readable(descs).await.unwrap();
            say(format!("META {}", op.metadata().to_json()));
            let _ = op.wait_for_completion_timeout(LIMIT).await;
            let t = op.transport().map_or("none", |t| t.name());
            say(format!("DONE {:?} {t}", op.status()));
            drop(op.into_descriptors());
            drop(keep);
        } else {
            let (descs, keep) = make(spec.mem, &spec.sizes, None);
            let op = c.create_writable(descs).await.unwrap();
            say(format!("META {}", op.metadata().to_json()));
            let _ = op.wait_for_completion_timeout(LIMIT).await;
            let t = op.transport().map_or("none", |t| t.name());
            say(format!("DONE {:?} {t}", op.status()));
            let got = keep.read_back(op.into_descriptors());
            match check(&got, spec.seed) {
                Ok(()) => say("CHECK ok".into()),
                Err(e) => say(format!("CHECK {e}")),
            }
        }
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    });
}

/// A server process for test `name`, serving `spec`.
fn start(name: &str, spec: &Spec) -> Server {
    Server::start(name, ROLE, &spec.encode())
}

/// Runs the server role if this process is one; true if it was.
fn served() -> bool {
    spawned::served(ROLE, serve)
}

// ---------------------------------------------------------------------------
// Transfers.

/// One READ and one WRITE of `sizes`, `local` memory here and `remote`
/// memory there, checked byte for byte on the destination.
fn round_trip(name: &str, sizes: &[usize], local: Mem, remote: Mem, opts: Opts, seed: u64) {
    let rt = runtime();
    let what = format!("{sizes:?} here {local:?}, there {remote:?}, {opts:?}");
    let mut spec = Spec {
        readable: true,
        mem: remote,
        sizes: sizes.to_vec(),
        seed,
        opts,
    };
    let mut server = start(name, &spec);
    let meta = server.metadata();
    rt.block_on(async {
        let c = connector(opts).await;
        let (descs, keep) = make(local, sizes, None);
        let op = c.begin_read(&meta, descs).await.expect("the READ starts");
        op.wait_for_completion_timeout(LIMIT)
            .await
            .unwrap_or_else(|e| panic!("READ {what}: {e}"));
        assert_eq!(op.transport(), Some(TransportKind::Tcp), "READ {what}");
        let got = keep.read_back(op.into_descriptors());
        if let Err(e) = check(&got, seed) {
            panic!("READ {what}: {e}");
        }
    });
    assert_eq!(server.after("DONE "), "Complete tcp", "READ {what}");
    drop(server);

    spec.readable = false;
    spec.seed = seed + 1;
    let mut server = start(name, &spec);
    let meta = server.metadata();
    rt.block_on(async {
        let c = connector(opts).await;
        let (descs, keep) = make(local, sizes, Some(seed + 1));
        let op = c.begin_write(descs, &meta).await.expect("the WRITE starts");
        op.wait_for_completion_timeout(LIMIT)
            .await
            .unwrap_or_else(|e| panic!("WRITE {what}: {e}"));
        assert_eq!(op.transport(), Some(TransportKind::Tcp), "WRITE {what}");
        drop(op.into_descriptors());
        drop(keep);
    });
    assert_eq!(server.after("DONE "), "Complete tcp", "WRITE {what}");
    assert_eq!(server.after("CHECK "), "ok", "WRITE {what}");
}

#[test]
fn gpu_to_gpu_from_one_byte_to_64_mib() {
    if served() {
        return;
    }
    let name = "gpu_to_gpu_from_one_byte_to_64_mib";
    for (i, size) in [1, 4097, 64 * 1024 + 1, 3 * MIB + 5, 64 * MIB]
        .into_iter()
        .enumerate()
    {
        round_trip(
            name,
            &[size],
            Mem::Gpu,
            Mem::Gpu,
            Opts::Plain,
            10 + i as u64,
        );
    }
}

#[test]
fn gpu_and_host_memory_pair_both_ways() {
    if served() {
        return;
    }
    let name = "gpu_and_host_memory_pair_both_ways";
    let sizes = [3 * MIB + 5, 4096, 17];
    round_trip(name, &sizes, Mem::Gpu, Mem::Host, Opts::Plain, 20);
    round_trip(name, &sizes, Mem::Host, Mem::Gpu, Opts::Plain, 30);
}

#[test]
fn sixteen_mixed_descriptors() {
    if served() {
        return;
    }
    let sizes: Vec<usize> = (0..16).map(|i| 1 + i * 37_123 + (i % 3) * MIB).collect();
    round_trip(
        "sixteen_mixed_descriptors",
        &sizes,
        Mem::Gpu,
        Mem::Gpu,
        Opts::Plain,
        40,
    );
}

#[test]
fn striped_and_through_the_secure_channel() {
    if served() {
        return;
    }
    let name = "striped_and_through_the_secure_channel";
    round_trip(
        name,
        &[40 * MIB + 3, 5],
        Mem::Gpu,
        Mem::Gpu,
        Opts::Striped,
        50,
    );
    round_trip(
        name,
        &[3 * MIB + 1, 100],
        Mem::Gpu,
        Mem::Gpu,
        Opts::Secret,
        60,
    );
}

/// How an interrupted READ ended.
struct Interrupted {
    status: OperationStatus,
    /// The destination changed between two looks 300 ms apart, once the
    /// operation had given it back.
    changed: bool,
    /// The destination at the first look.
    bytes: Vec<u8>,
}

/// Starts a READ of 256 MiB of the server's GPU memory into GPU memory
/// here, lets it run `after`, then cancels it or kills the server.
fn interrupted(name: &str, after: Duration, kill: bool) -> Interrupted {
    let spec = Spec {
        readable: true,
        mem: Mem::Gpu,
        sizes: vec![256 * MIB],
        seed: 70,
        opts: Opts::Plain,
    };
    let mut server = start(name, &spec);
    let meta = server.metadata();
    let rt = runtime();
    rt.block_on(async {
        let c = connector(Opts::Plain).await;
        let (descs, keep) = make(Mem::Gpu, &spec.sizes, None);
        let op = c.begin_read(&meta, descs).await.expect("the READ starts");
        tokio::time::sleep(after).await;
        if kill {
            server.child.kill().unwrap();
            let _ = op.wait_for_completion_timeout(LIMIT).await;
        } else {
            op.cancel();
        }
        let status = op.status();
        let descs = op.into_descriptors();
        let pause = || std::thread::sleep(Duration::from_millis(300));
        let (first, second) = if keep.is_empty() {
            // A real GPU: the buffer copied to the host twice.
            let d = descs.into_iter().next().unwrap();
            let b: CudaBuffer = d.into_owner().expect("a CudaBuffer");
            let look = || {
                let mut out = vec![0u8; b.len()];
                b.copy_to_host(&mut out).unwrap();
                out
            };
            let first = look();
            pause();
            (first, look())
        } else {
            drop(descs);
            let first = keep.bytes(0);
            pause();
            (first, keep.bytes(0))
        };
        Interrupted {
            status,
            changed: first != second,
            bytes: first,
        }
    })
}

/// Every byte of an interrupted READ's destination is the source's or
/// untouched; how many are the source's.
fn landed(bytes: &[u8]) -> usize {
    let want = pattern(70, 0, bytes.len());
    let mut n = 0;
    for (k, (&b, &w)) in bytes.iter().zip(&want).enumerate() {
        assert!(
            b == w || b == SENTINEL,
            "byte {k} is {b:#04x}: neither the source's nor untouched"
        );
        n += usize::from(b == w && w != SENTINEL);
    }
    n
}

#[test]
fn a_cancel_mid_transfer_leaves_no_late_byte() {
    if served() {
        return;
    }
    let r = interrupted(
        "a_cancel_mid_transfer_leaves_no_late_byte",
        Duration::from_millis(5),
        false,
    );
    assert!(
        !r.changed,
        "bytes landed after the operation gave them back"
    );
    let n = landed(&r.bytes);
    match r.status {
        OperationStatus::Cancelled => {
            println!("cancelled with {n} of {} bytes landed", r.bytes.len())
        }
        OperationStatus::Complete => {
            check(&[r.bytes], 70).unwrap();
            println!("completed before the cancel (the checks still held)");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_peer_killed_mid_transfer_fails_the_operation() {
    if served() {
        return;
    }
    let r = interrupted(
        "a_peer_killed_mid_transfer_fails_the_operation",
        Duration::from_millis(5),
        true,
    );
    assert!(!r.changed, "bytes landed after the operation ended");
    landed(&r.bytes);
    match r.status {
        OperationStatus::Errored => {}
        OperationStatus::Complete => println!("completed before the kill"),
        other => panic!("{other:?}"),
    }
}
/// Both connectors in this process: the local transport moves GPU memory
/// through a host buffer, every pairing, both ways; with TCP only, a
/// connection to itself stages it (CUDA IPC does not open a process's own
/// memory).
#[test]
fn within_one_process_through_a_host_buffer() {
    if served() {
        return;
    }
    let local = || async {
        Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .build()
            .await
            .unwrap()
    };
    runtime().block_on(async {
        let (a, b) = (local().await, local().await);
        one_process(&a, &b, TransportKind::Local).await;
        let (a, b) = (connector(Opts::Plain).await, connector(Opts::Plain).await);
        one_process(&a, &b, TransportKind::Tcp).await;
    });
}

async fn one_process(a: &Connector, b: &Connector, via: TransportKind) {
    {
        let sizes = [9 * MIB + 7, 1, 4096];
        for (k, (here, there)) in [
            (Mem::Gpu, Mem::Gpu),
            (Mem::Gpu, Mem::Host),
            (Mem::Host, Mem::Gpu),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = 80 + 10 * k as u64;
            let what = format!("here {here:?}, there {there:?}, {via:?}");
            // READ: there -> here.
            let (src, keep_src) = make(there, &sizes, Some(seed));
            let r = b.create_readable(src).await.unwrap();
            let (dst, keep) = make(here, &sizes, None);
            let op = a.begin_read(r.metadata(), dst).await.unwrap();
            op.wait_for_completion_timeout(LIMIT)
                .await
                .unwrap_or_else(|e| panic!("READ {what}: {e}"));
            assert_eq!(op.transport(), Some(via), "{what}");
            check(&keep.read_back(op.into_descriptors()), seed)
                .unwrap_or_else(|e| panic!("READ {what}: {e}"));
            r.wait_for_completion_timeout(LIMIT).await.unwrap();
            drop((r.into_descriptors(), keep_src));
            // WRITE: here -> there.
            let (dst, keep_dst) = make(there, &sizes, None);
            let w = b.create_writable(dst).await.unwrap();
            let (src, keep) = make(here, &sizes, Some(seed + 1));
            let op = a.begin_write(src, w.metadata()).await.unwrap();
            op.wait_for_completion_timeout(LIMIT)
                .await
                .unwrap_or_else(|e| panic!("WRITE {what}: {e}"));
            drop((op.into_descriptors(), keep));
            w.wait_for_completion_timeout(LIMIT).await.unwrap();
            check(&keep_dst.read_back(w.into_descriptors()), seed + 1)
                .unwrap_or_else(|e| panic!("WRITE {what}: {e}"));
        }
    }
}

/// A device copy that fails (simulated: `simulate_copy_failure` over one
/// MiB in the middle of a 3 MiB buffer) ends its one operation, on either
/// side and in either direction, striped or not: `DeviceCopy` where it
/// failed, the remote's refusal on the other side (`DeviceMemory`, or a
/// failed part of a stripe, with the copy's error); no connection closes,
/// and the next operation on them completes.
#[test]
fn a_failed_device_copy_ends_its_request_not_the_connection() {
    if served() {
        return;
    }
    if init() {
        return println!("skipped: failures are injected only into simulated device copies");
    }
    runtime().block_on(async {
        for opts in [Opts::Plain, Opts::Striped] {
            let (a, b) = (connector(opts).await, connector(opts).await);
            fail_one_at_a_time(&a, &b, opts).await;
        }
    });
}

async fn fail_one_at_a_time(a: &Connector, b: &Connector, opts: Opts) {
    let sizes = [3 * MIB];
    let opened = || {
        let (x, y) = (a.metrics().connections, b.metrics().connections);
        [
            x.outbound_opened,
            x.inbound_opened,
            y.outbound_opened,
            y.inbound_opened,
        ]
    };
    let mut connections = None;
    {
        for (read, fail_here) in [(true, true), (true, false), (false, true), (false, false)] {
            let what = format!(
                "{}, failing {}, {opts:?}",
                if read { "READ" } else { "WRITE" },
                if fail_here { "here" } else { "there" }
            );
            let (mine, keep_mine) = make(Mem::Gpu, &sizes, (!read).then_some(5));
            let (theirs, keep_theirs) = make(Mem::Gpu, &sizes, read.then_some(5));
            let failing = if fail_here { &keep_mine } else { &keep_theirs };
            let start = failing.address(0) + MIB as u64;
            ferry::cuda::simulate_copy_failure(Some(start..start + MIB as u64));
            let (here, there, statuses) = if read {
                let r = b.create_readable(theirs).await.unwrap();
                let op = a.begin_read(r.metadata(), mine).await.unwrap();
                let here = op.wait_for_completion_timeout(LIMIT).await;
                let there = r.wait_for_completion_timeout(LIMIT).await;
                let statuses = (op.status(), r.status());
                drop((op.into_descriptors(), r.into_descriptors()));
                (here, there, statuses)
            } else {
                let w = b.create_writable(theirs).await.unwrap();
                let op = a.begin_write(mine, w.metadata()).await.unwrap();
                let here = op.wait_for_completion_timeout(LIMIT).await;
                let there = w.wait_for_completion_timeout(LIMIT).await;
                let statuses = (op.status(), w.status());
                drop((op.into_descriptors(), w.into_descriptors()));
                (here, there, statuses)
            };
            ferry::cuda::simulate_copy_failure(None);
            let (failed, told) = if fail_here {
                (here, there)
            } else {
                (there, here)
            };
            assert!(
                matches!(failed, Err(ferry::Error::DeviceCopy { .. })),
                "{what}: {failed:?}"
            );
            // The other side learns why: from the request itself, or from
            // the stripe that one of its parts failed.
            let told_why = match &told {
                Err(ferry::Error::Rejected {
                    reason: ferry::AbortReason::DeviceMemory,
                    ..
                }) => opts != Opts::Striped,
                Err(e) => opts == Opts::Striped && e.to_string().contains("simulated failure"),
                Ok(()) => false,
            };
            assert!(told_why, "{what}: {told:?}");
            assert_eq!(
                statuses,
                (OperationStatus::Errored, OperationStatus::Errored),
                "{what}"
            );
            drop((keep_mine, keep_theirs));

            // The same connection carries the next operation.
            let (src, keep_src) = make(Mem::Gpu, &sizes, Some(9));
            let r = b.create_readable(src).await.unwrap();
            let (dst, keep) = make(Mem::Gpu, &sizes, None);
            let op = a.begin_read(r.metadata(), dst).await.unwrap();
            op.wait_for_completion_timeout(LIMIT)
                .await
                .unwrap_or_else(|e| panic!("after {what}: {e}"));
            check(&keep.read_back(op.into_descriptors()), 9)
                .unwrap_or_else(|e| panic!("after {what}: {e}"));
            r.wait_for_completion_timeout(LIMIT).await.unwrap();
            drop((r.into_descriptors(), keep_src));
            let now = opened();
            assert_eq!(*connections.get_or_insert(now), now, "{what}: reconnected");
        }
    }
}
