//! GPU memory over UCX: lent and pulled through UCX where both processes'
//! UCX moves CUDA memory (they say so in the `Rdma` exchange), staged in
//! band over TCP where one does not.
//!
//! Runs on any machine with UCX (Debian's `libucx0`; skipped with the
//! reason where none loads): both processes simulate a GPU
//! (`simulate_with_host_memory`: "device memory" is host memory described
//! as `cuda:0`), and one whose UCX "moves CUDA memory" says so through
//! `simulate_ucx_cuda`, so that UCX registers and gets that memory as the
//! host memory it is. This shows the choice, the protocol and the
//! plumbing; UCX's own CUDA transports (GPUDirect RDMA, its CUDA IPC) need
//! a UCX built with CUDA and a GPU, and are unverified.
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

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferry::cuda::CudaBuffer;
use ferry::{Descriptor, TransportKind};

#[path = "support/sim_memory.rs"]
mod sim_memory;
#[path = "support/spawned.rs"]
mod spawned;
mod support;
use sim_memory::Keep;
use spawned::{check, pattern, runtime, Server};
use support::Via;

/// The environment variable that makes this binary a server process.
const ROLE: &str = "FERRY_GPU_UCX_TEST_SERVE";
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
    if gpu && REAL.load(Ordering::Acquire) {
        let descs = contents
            .iter()
            .map(|bytes| {
                let mut b = CudaBuffer::new(0, bytes.len()).expect("GPU memory");
                b.copy_from_host(bytes).expect("a copy to the GPU");
                b.into_descriptor()
            })
            .collect();
        return (descs, Keep::default());
    }
    Keep::descriptors(contents, gpu)
}

/// The bytes of every descriptor, once the operation gave them back.
fn read_back(descs: Vec<Descriptor<'static>>, keep: &Keep) -> Vec<Vec<u8>> {
    if !REAL.load(Ordering::Acquire) {
        return keep.read_back(descs);
    }
    descs
        .into_iter()
        .map(|d| match d.as_slice() {
            Some(s) => s.to_vec(),
            None => {
                let b: CudaBuffer = d.into_owner().expect("a CudaBuffer");
                let mut out = vec![0; b.len()];
                b.copy_to_host(&mut out).expect("a copy from the GPU");
                out
            }
        })
        .collect()
}

/// One operation: the server's readable (the client READs) or writable
/// (the client WRITEs), over GPU or host memory there (`server_gpu`), and
/// GPU or host memory here (`client_gpu`).
#[derive(Clone, Copy, Debug)]
struct Op {
    readable: bool,
    server_gpu: bool,
    client_gpu: bool,
}

/// Every direction, and both GPU↔CPU pairs.
const OPS: [Op; 4] = [
    Op {
        readable: true,
        server_gpu: true,
        client_gpu: true,
    },
    Op {
        readable: false,
        server_gpu: true,
        client_gpu: true,
    },
    Op {
        readable: true,
        server_gpu: false,
        client_gpu: true,
    },
    Op {
        readable: false,
        server_gpu: false,
        client_gpu: true,
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
        let out = std::io::stdout();
        let say = |s: String| {
            writeln!(out.lock(), "{s}").unwrap();
            out.lock().flush().unwrap();
        };
        for (i, op) in ops.split(',').enumerate() {
            let (readable, gpu) = (op.starts_with('R'), op.ends_with('G'));
            let seed = 200 + i as u64;
            let (descs, keep) = make(gpu, readable.then_some(seed));
            let (status, transport, descs) = if readable {
                let r = c.create_readable(descs).await.unwrap();
                say(format!("META {}", r.metadata().to_json()));
                let _ = r.wait_for_completion_timeout(LIMIT).await;
                (r.status(), r.transport(), r.into_descriptors())
            } else {
                let w = c.create_writable(descs).await.unwrap();
                say(format!("META {}", w.metadata().to_json()));
                let _ = w.wait_for_completion_timeout(LIMIT).await;
                (w.status(), w.transport(), w.into_descriptors())
            };
            let t = transport.map_or("none", |t| t.name());
            say(format!("DONE {status:?} {t}"));
            let got = read_back(descs, &keep);
            if !readable {
                match check(&got, seed) {
                    Ok(()) => say("CHECK ok".into()),
                    Err(e) => say(format!("CHECK {e}")),
                }
            }
        }
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
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
    let spec: Vec<String> = OPS
        .iter()
        .map(|o| {
            let kind = if o.readable { 'R' } else { 'W' };
            let mem = if o.server_gpu { 'G' } else { 'H' };
            format!("{kind}{mem}")
        })
        .collect();
    let mut server = Server::start(name, ROLE, &format!("{server};{}", spec.join(",")));
    runtime().block_on(async {
        let c = connector().await;
        for (i, op) in OPS.iter().enumerate() {
            let what = format!("{op:?}, {pass:?}");
            let seed = 200 + i as u64;
            let meta = server.metadata();
            if op.readable {
                let (descs, keep) = make(op.client_gpu, None);
                let r = c.begin_read(&meta, descs).await.expect("the READ starts");
                r.wait_for_completion_timeout(LIMIT)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(r.transport(), Some(want), "{what}");
                check(&read_back(r.into_descriptors(), &keep), seed)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            } else {
                let (descs, keep) = make(op.client_gpu, Some(seed));
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
            std::env::var("FERRY_REQUIRE_UCX_CUDA").as_deref() != Ok("1"),
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
