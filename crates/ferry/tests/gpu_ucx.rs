//! GPU memory over UCX: lent and pulled through UCX where both processes'
//! UCX moves CUDA memory (they say so in their UCX offers), staged in
//! band over TCP where one does not.
//!
//! Runs on any machine with UCX (Debian's `libucx0`; skipped with the
//! reason where none loads): both processes simulate a GPU
//! (`simulate_with_host_memory`: "device memory" is host memory described
//! as `cuda:0`), and one whose UCX "moves CUDA memory" says so through
//! `simulate_ucx_cuda`, so that UCX registers and gets that memory as the
//! host memory it is. This shows the choice, the protocol and the
//! plumbing; UCX's own CUDA transports need a UCX built with CUDA and a
//! GPU. The pass over real device memory (below) ran and passed on one
//! H100 on 2026-11-24 (`libucx-cu12` 1.22), though slowly: which UCX
//! transport carried it is not known (`docs/gpu.md`). GPUDirect RDMA
//! needs an RDMA NIC and is unverified.
//!
//! Each pairing spawns a second process (this test binary, run again with
//! `ROLE` set) that serves a list of operations in turn over one
//! connector; this process is the active side, over one connector too.
//!
//! Where this process's UCX really moves CUDA memory (a GPU, a UCX built
//! with CUDA such as `libucx-cu12` named by `FERRY_UCX_LIB`, and
//! `FERRY_UCX_CUDA=1`), the same operations run first over real device
//! memory (`CudaBuffer`s, read back through the driver) with nothing
//! simulated, and must go through UCX; elsewhere that pass says why it is
//! skipped (and fails where `FERRY_REQUIRE_UCX_CUDA=1`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferry::{Descriptor, TransportKind};

#[path = "support/sim_memory.rs"]
mod sim_memory;
#[path = "support/spawned.rs"]
mod spawned;
mod support;
use sim_memory::{ops_spec, serve_ops, Keep};
use spawned::{check, pattern, runtime, Server};
use support::Via;

/// The environment variable that makes this binary a server process.
const ROLE: &str = "FERRY_GPU_UCX_TEST_SERVE";
/// Set to `1` where the real-memory pass must run (`scripts/gpu-check`).
const REQUIRE_UCX_CUDA_ENV: &str = "FERRY_REQUIRE_UCX_CUDA";
/// How long any one operation may take.
const LIMIT: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;
/// The descriptors of every operation: past one pull chunk, and small ones.
const SIZES: [usize; 3] = [9 * MIB + 5, 17, 4096];

/// Simulates a GPU in this process, whose UCX moves CUDA memory if `cuda`.
fn init(cuda: bool) {
    // SAFETY: every "device" address this process gives Ferry is host
    // memory (`Keep::descriptor`), alive and unaliased for its
    // descriptor's life.
    unsafe { ferry::cuda::simulate_with_host_memory() };
    ferry::cuda::simulate_ucx_cuda(cuda);
}

/// A connector that sets up UCX with its peers (and TCP).
async fn connector() -> ferry::Connector {
    Via::UCX.builder().build().await.expect("connector starts")
}

/// This process's GPU memory is real device memory (`CudaBuffer`s), not
/// simulated.
static REAL: AtomicBool = AtomicBool::new(false);

/// Descriptors of [`SIZES`], GPU memory (`gpu`) or host memory, holding
/// `pattern(seed, ..)` where `seed` is given, else zeros.
fn make(gpu: bool, seed: Option<u64>) -> (Vec<Descriptor<'static>>, Keep) {
    let contents: Vec<Vec<u8>> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &len)| seed.map_or_else(|| vec![0; len], |s| pattern(s, i, len)))
        .collect();
    Keep::descriptors(contents, gpu, REAL.load(Ordering::Acquire))
}

/// One operation: the server's readable (the client READs) or writable
/// (the client WRITEs), over GPU or host memory there (`server_gpu`), and
/// GPU memory here.
#[derive(Clone, Copy, Debug)]
struct Op {
    readable: bool,
    server_gpu: bool,
}

/// Every direction, and both GPU↔CPU pairs.
const OPS: [Op; 4] = [
    Op {
        readable: true,
        server_gpu: true,
    },
    Op {
        readable: false,
        server_gpu: true,
    },
    Op {
        readable: true,
        server_gpu: false,
    },
    Op {
        readable: false,
        server_gpu: false,
    },
];

/// Serves `spec` (`<cuda>;<R|W><G|H>,...`, `cuda` one of `true`, `false`
/// or `real`): for each operation in turn, prints `META <json>`, then
/// `DONE <status> <transport>` and, for a writable, `CHECK ok` or what
/// differs; exits once its standard input closes.
fn serve(spec: &str) {
    let (cuda, ops) = spec.split_once(';').unwrap();
    if cuda == "real" {
        REAL.store(true, Ordering::Release);
    } else {
        init(cuda == "true");
    }
    runtime().block_on(async {
        let c = connector().await;
        serve_ops(&c, ops, 200, LIMIT, make, |_| Vec::new()).await;
    });
}

/// Runs the server role if this process is one; true if it was.
fn served() -> bool {
    spawned::served(ROLE, serve)
}

/// Who moves CUDA memory through UCX in one pass of [`run`].
#[derive(Clone, Copy, Debug)]
enum Pass {
    /// Both processes simulate a GPU; each one's UCX "moves CUDA memory"
    /// as said.
    Simulated {
        client_cuda: bool,
        server_cuda: bool,
    },
    /// Real device memory on both sides, whose UCX really moves it.
    Real,
}

/// Runs [`OPS`] in one [`Pass`], checking every byte and the transport on
/// both sides: UCX where both move CUDA memory, else TCP (each side
/// staging its own GPU memory).
fn run(name: &str, pass: Pass) {
    let (server, want) = match pass {
        Pass::Simulated {
            client_cuda,
            server_cuda,
        } => {
            REAL.store(false, Ordering::Release);
            init(client_cuda);
            let via = if client_cuda && server_cuda {
                TransportKind::Ucx
            } else {
                TransportKind::Tcp
            };
            (server_cuda.to_string(), via)
        }
        Pass::Real => {
            REAL.store(true, Ordering::Release);
            ("real".to_string(), TransportKind::Ucx)
        }
    };
    let spec = ops_spec(OPS.iter().map(|o| (o.readable, o.server_gpu)));
    let mut server = Server::start(name, ROLE, &format!("{server};{}", spec));
    runtime().block_on(async {
        let c = connector().await;
        for (i, op) in OPS.iter().enumerate() {
            let what = format!("{op:?}, {pass:?}");
            let seed = 200 + i as u64;
            let meta = server.metadata();
            if op.readable {
                let (descs, keep) = make(true, None);
                let r = c.begin_read(&meta, descs).await.expect("the READ starts");
                r.wait_for_completion_timeout(LIMIT)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(r.transport(), Some(want), "{what}");
                check(&keep.read_back(r.into_descriptors()), seed)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            } else {
                let (descs, keep) = make(true, Some(seed));
                let w = c.begin_write(descs, &meta).await.expect("the WRITE starts");
                w.wait_for_completion_timeout(LIMIT)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(w.transport(), Some(want), "{what}");
                drop((w.into_descriptors(), keep));
            }
            assert_eq!(
                server.after("DONE "),
                format!("Complete {}", want.name()),
                "{what}"
            );
            if !op.readable {
                assert_eq!(server.after("CHECK "), "ok", "{what}");
            }
        }
        assert_eq!(
            c.metrics().cuda_ipc_fallbacks,
            0,
            "UCX is not CUDA IPC: nothing counted as its fallback"
        );
    });
}

/// Both pairings where one side's UCX does not move CUDA memory, then
/// both that do (one after the other: the flag is the process's).
#[test]
fn gpu_memory_goes_through_ucx_only_where_both_move_cuda_memory() {
    if served() {
        return;
    }
    if let Err(why) = ferry::ucx::status() {
        // Where the caller says UCX must run here (CI, scripts/gpu-check).
        let required = std::env::var_os(support::REQUIRE_UCX_ENV).is_some()
            || std::env::var(REQUIRE_UCX_CUDA_ENV).as_deref() == Ok("1");
        assert!(!required, "UCX is required here but does not start: {why}");
        println!("skipped: no UCX here ({why})");
        return;
    }
    let name = "gpu_memory_goes_through_ucx_only_where_both_move_cuda_memory";
    // Real memory first: the simulation, once on, is this process's for
    // good.
    if ferry::cuda::available() && ferry::ucx::moves_cuda() {
        run(name, Pass::Real);
    } else {
        let why = format!(
            "real GPU memory over UCX skipped: needs a GPU (CUDA: {}), a UCX built with CUDA \
             and {}=1 (moves CUDA memory: {})",
            ferry::cuda::status().unwrap_or_else(|e| e),
            ferry::ucx::CUDA_ENV,
            ferry::ucx::moves_cuda(),
        );
        // Where the caller says this machine must run it (scripts/gpu-check).
        assert!(
            std::env::var(REQUIRE_UCX_CUDA_ENV).as_deref() != Ok("1"),
            "{why}"
        );
        println!("{why}");
    }
    for (client_cuda, server_cuda) in [(true, false), (false, true), (true, true)] {
        run(
            name,
            Pass::Simulated {
                client_cuda,
                server_cuda,
            },
        );
    }
}
