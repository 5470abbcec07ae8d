//! The conformance suite over CUDA IPC: the source is another process
//! (this test binary again, running [`a_source_process_lends_when_asked`]
//! alone), since a driver opens no IPC handle of the process that exported
//! it. It allocates device memory, fills it, exports it
//! ([`CudaIpcPuller::register`]) and prints its lease; this process pulls
//! it through an [`IpcPeer`] on that process, into host memory
//! (device-to-host copies) and into device memory of its own `cuda:0`
//! (device to device, as between two processes on one GPU).
//!
//! Runs wherever CUDA is: on a GPU, or against the model of the driver
//! (`crates/fake-cuda`, loaded with `FERRY_CUDA_LIB`, as `.ci/test` does).
//! Elsewhere every case says so and passes, unless `FERRY_REQUIRE_CUDA=1`,
//! where it fails.
//!
//! - A source that goes away: its process is killed (the peer's process
//!   check fails the pull).
//! - A copy held mid-chunk does not apply: a CUDA IPC copy is the
//!   driver's, from the source's memory mapped into this process; the
//!   source has no hand in it once the lease is sent.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use ferry_proto::DeviceKind;

use super::{CudaIpcPuller, IpcPeer, DEVICE_CHUNK, HOST_CHUNK};
use crate::cuda::CudaBuffer;
use crate::region::Region;
use crate::transport::cma;
use crate::transport::pull::conformance::{
    conformance_tests, patterns, Applies, Backend, Mortal, Source, Stalled,
};
use crate::transport::pull::{lend_kept, register_kept, LeaseBlob};
use crate::Descriptor;
use ferry_proto::lane::LaneId;

/// The variable that makes this test binary a source process: the sizes
/// of the segments to lend, comma separated.
const SERVE_ENV: &str = "FERRY_TEST_CUDA_IPC_SOURCE";

/// The variable that makes a missing CUDA fail the suite (`.ci/test` sets
/// it where the fake driver is loaded).
const REQUIRE_CUDA_ENV: &str = "FERRY_REQUIRE_CUDA";

/// What starts the line on which a source process prints its lease.
const LEASE: &str = "ferry-cuda-ipc-lease";

/// How long a source process may take to lend, or to exit once told.
const WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// This test's path, as the source process is asked to run it.
const SERVE_TEST: &str =
    "transport::pull::cuda_ipc::conformance::a_source_process_lends_when_asked";

/// A source process, with its standard output (read to its lease line).
struct Served {
    child: Child,
    _out: BufReader<ChildStdout>,
}

impl Served {
    /// Ends the process: at once (`kill`, its death), or by closing its
    /// input (it gives its lease back and exits, or is killed if it has
    /// not within [`WITHIN`]); then reaps it.
    fn end(mut self, kill: bool) {
        if !kill {
            drop(self.child.stdin.take());
            let t = std::time::Instant::now();
            while t.elapsed() < WITHIN {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Self::end_now(self.child);
    }

    /// Kills and reaps `child`.
    fn end_now(mut child: Child) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The lease a source process prints, read from its output; `None` if it
/// ended first.
fn read_lease(out: &mut impl BufRead) -> Option<LeaseBlob> {
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).ok()? == 0 {
            return None;
        }
        // After the harness's `test <name> ... `, on the same line.
        if let Some((_, rest)) = line.split_once(LEASE) {
            return Some(parse_lease(rest.trim()));
        }
    }
}

/// CUDA IPC from a source process.
#[derive(Default)]
struct CudaIpcBackend(CudaIpcPuller);

impl CudaIpcBackend {
    /// A source process lending `sizes`, its lease, and a peer on it; the
    /// process, shared with whoever may end it.
    fn spawn(&self, sizes: &[usize]) -> (Source<IpcPeer>, Arc<Mutex<Option<Served>>>) {
        let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--exact", SERVE_TEST, "--nocapture", "--test-threads=1"])
            .env(SERVE_ENV, list.join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("a source process");
        let out = BufReader::new(child.stdout.take().expect("its output"));
        // Read on a thread of its own, so that a source process that never
        // lends fails the test rather than hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut out = out;
            let lease = read_lease(&mut out);
            let _ = tx.send((lease, out));
        });
        let (lease, out) = match rx.recv_timeout(WITHIN) {
            Ok((Some(lease), out)) => (lease, out),
            Ok((None, _)) => {
                Served::end_now(child);
                panic!("the source process ended before it lent anything");
            }
            Err(_) => {
                Served::end_now(child);
                panic!("the source process lent nothing within {WITHIN:?}");
            }
        };
        let process = cma::Peer::open(child.id()).expect("attach to the source process");
        let peer = IpcPeer::new(Arc::new(process));
        let served = Arc::new(Mutex::new(Some(Served { child, _out: out })));
        let ours = served.clone();
        let end = Box::new(move || {
            if let Some(s) = crate::sync::lock(&ours).take() {
                s.end(false);
            }
        });
        (Source::new(lease, peer, end), served)
    }
}

impl Backend for CudaIpcBackend {
    type P = CudaIpcPuller;

    fn puller(&self) -> &CudaIpcPuller {
        &self.0
    }

    fn absent(&self) -> Option<String> {
        if crate::cuda::available() {
            return None;
        }
        let why = crate::cuda::status().err().unwrap_or_default();
        if std::env::var(REQUIRE_CUDA_ENV).is_ok_and(|v| v == "1") {
            panic!("{REQUIRE_CUDA_ENV}=1, but CUDA is unavailable: {why}");
        }
        Some(format!(
            "CUDA is unavailable here ({why}); a GPU or the fake driver \
             (FERRY_CUDA_LIB=target/debug/libferry_fake_cuda.so) runs it"
        ))
    }

    fn chunk(&self, into: DeviceKind) -> usize {
        match into {
            DeviceKind::Cpu => HOST_CHUNK as usize,
            // The source's device is this process's `cuda:0` too.
            DeviceKind::Cuda => DEVICE_CHUNK as usize,
        }
    }

    fn source(&self, sizes: &[usize]) -> Source<IpcPeer> {
        self.spawn(sizes).0
    }

    fn mortal_source(&self, sizes: &[usize]) -> Applies<Mortal<IpcPeer>> {
        let (source, served) = self.spawn(sizes);
        let lose = Box::new(move || {
            if let Some(s) = crate::sync::lock(&served).take() {
                s.end(true);
            }
        });
        Ok((source, lose))
    }

    fn stalled_source(&self, _len: usize) -> Applies<Stalled<IpcPeer>> {
        Err(
            "a CUDA IPC copy is the driver's, from the source's memory mapped into this \
             process: the source has no hand in it and cannot hold it mid-chunk"
                .into(),
        )
    }
}

conformance_tests!(CudaIpcBackend::default());

/// `addr:len,addr:len,... <opaque in hex>`, as [`print_lease`] writes it.
fn parse_lease(s: &str) -> LeaseBlob {
    let (segs, opaque) = s.split_once(' ').expect("segments, then opaque bytes");
    let segments = segs
        .split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            let (a, n) = x.split_once(':').expect("addr:len");
            (a.parse().expect("an address"), n.parse().expect("a length"))
        })
        .collect();
    let opaque = (0..opaque.len() / 2)
        .map(|i| u8::from_str_radix(&opaque[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    LeaseBlob::new(LaneId::CUDA_IPC, segments, opaque)
}

/// Prints `lease` on one line after [`LEASE`].
fn print_lease(lease: LeaseBlob) {
    let (_, segs, opaque) = lease.into_parts();
    let segs: Vec<String> = segs.iter().map(|(a, n)| format!("{a}:{n}")).collect();
    let hex: String = opaque.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{LEASE} {} {hex}", segs.join(",")).expect("print the lease");
    out.flush().expect("print the lease");
}

/// The source process (in this binary, run again by [`CudaIpcBackend`]
/// with [`SERVE_ENV`] set; passes at once anywhere else): lends one
/// allocation of device memory, carved into segments of the sizes asked
/// for, each holding its pattern, until its input closes.
#[test]
fn a_source_process_lends_when_asked() {
    let Ok(sizes) = std::env::var(SERVE_ENV) else {
        return;
    };
    let sizes: Vec<usize> = sizes
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("a size"))
        .collect();
    let image = patterns(&sizes).concat();
    let mut arena = CudaBuffer::new(0, image.len().max(1)).expect("device memory");
    arena
        .copy_from_host(&image)
        .expect("fill the device memory");
    let base = arena.device_ptr();
    let mut at = 0u64;
    let descs: Vec<Descriptor<'static>> = sizes
        .iter()
        .map(|&n| {
            // SAFETY: `n` bytes at `at` of `arena`, which outlives the
            // descriptors (dropped after them, below); nothing writes it
            // meanwhile.
            let d = unsafe { Descriptor::from_cuda_ptr(base + at, n, 0, false) };
            at += n as u64;
            d
        })
        .collect();
    // SAFETY: the descriptors' memory lives until after the region is
    // closed (below).
    let region = unsafe { Region::new(&descs, false) };
    let p = CudaIpcPuller;
    register_kept(&p, &region).expect("export the device memory");
    let lease = lend_kept(&p, &region);
    region.lend();
    print_lease(lease);
    // Lent until the destination is done (our input closes) or we die.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    region.give_back();
    region.close();
    drop(descs);
    drop(arena);
}
