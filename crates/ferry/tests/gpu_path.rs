//! Which way GPU memory moves between two processes of one host where
//! cross-memory attach is set up, so that CUDA IPC could carry it: lent by
//! CUDA IPC only where both processes offered it in the attach exchange;
//! staged in band where one did not (the other is never asked for a lease
//! of GPU memory), and where the lending side's export fails (the
//! operation falls back, counted by `cuda_ipc_fallbacks`, and the
//! connection carries on).
//!
//! Runs on any machine: both processes simulate a GPU
//! (`simulate_with_host_memory`: "device memory" is host memory described
//! as `cuda:0`), and one that offers CUDA IPC does so through
//! `simulate_cuda_ipc_offer`, as a process with a CUDA driver does. The
//! export then fails, as the driver's does for memory it will not export:
//! these tests show the choice and the fallback, not a CUDA IPC copy
//! (`cuda_ipc.rs`, on a GPU).
//!
//! Each pairing spawns a second process (this test binary, run again with
//! `ROLE` set) that serves a list of operations in turn over one
//! connector; this process is the active side, over one connector too, so
//! that every operation of a pairing shares one connection.

use std::time::Duration;

use ferry::{Descriptor, TransportKind};

#[path = "support/sim_memory.rs"]
mod sim_memory;
// A connector that sets up cross-memory attach with a process of this
// host (and so could lend GPU memory by CUDA IPC).
#[path = "support/spawned.rs"]
mod spawned;
mod support;
use sim_memory::{ops_spec, serve_ops, Keep};
use spawned::{check, pattern, runtime, Server};
use support::attaching_connector as connector;

/// The environment variable that makes this binary a server process.
const ROLE: &str = "FERRY_GPU_PATH_TEST_SERVE";
/// How long any one operation may take.
const LIMIT: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;
/// The descriptors of every operation: past one chunk, and small ones.
const SIZES: [usize; 3] = [3 * MIB + 5, 17, 4096];

/// Simulates a GPU in this process, offering CUDA IPC on the connections
/// it sets up from now on if `offer`.
fn init(offer: bool) {
    // SAFETY: every "device" address this process gives Ferry is host
    // memory (`Keep::descriptor`), alive and unaliased for its
    // descriptor's life.
    unsafe { ferry::cuda::simulate_with_host_memory() };
    ferry::cuda::simulate_cuda_ipc_offer(offer);
}

/// Descriptors of [`SIZES`], GPU memory (`gpu`) or host memory, holding
/// `pattern(seed, ..)` where `seed` is given, else zeros.
fn make(gpu: bool, seed: Option<u64>) -> (Vec<Descriptor<'static>>, Keep) {
    let contents = SIZES
        .iter()
        .enumerate()
        .map(|(i, &len)| seed.map_or_else(|| vec![0; len], |s| pattern(s, i, len)))
        .collect();
    Keep::descriptors(contents, gpu, false)
}

/// One operation the server serves: a readable (the client READs) or a
/// writable (the client WRITEs), over GPU or host memory there.
#[derive(Clone, Copy, Debug)]
struct Op {
    readable: bool,
    gpu: bool,
}

/// A READ of the server's GPU memory into the client's, a WRITE of the
/// client's into the server's, and a WRITE of the client's into the
/// server's host memory (GPU→CPU).
const OPS: [Op; 3] = [
    Op {
        readable: true,
        gpu: true,
    },
    Op {
        readable: false,
        gpu: true,
    },
    Op {
        readable: false,
        gpu: false,
    },
];

/// Serves `spec` (`<offer>;<R|W><G|H>,...`): for each operation in turn,
/// prints `META <json>`, then `DONE <status> <transport>`, `FALLBACKS
/// <n>` (its connector's `cuda_ipc_fallbacks` so far) and, for a
/// writable, `CHECK ok` or what differs; exits once its standard input
/// closes.
fn serve(spec: &str) {
    let (offer, ops) = spec.split_once(';').unwrap();
    init(offer == "true");
    runtime().block_on(async {
        let c = connector().await;
        serve_ops(&c, ops, 100, LIMIT, make, |c| {
            vec![format!("FALLBACKS {}", c.metrics().cuda_ipc_fallbacks)]
        })
        .await;
    });
}

/// Runs the server role if this process is one; true if it was.
fn served() -> bool {
    spawned::served(ROLE, serve)
}

/// Runs [`OPS`] against a server that offers CUDA IPC if `server_offers`
/// (this process offers it if `client_offers`), checking every byte, the
/// transport on both sides (TCP: staged), which side counted a fallback,
/// and that one connection carried them all.
fn run(name: &str, client_offers: bool, server_offers: bool) {
    init(client_offers);
    let both = client_offers && server_offers;
    let spec = ops_spec(OPS.iter().map(|o| (o.readable, o.gpu)));
    let mut server = Server::start(name, ROLE, &format!("{server_offers};{}", spec));
    runtime().block_on(async {
        let c = connector().await;
        let (mut client_fallbacks, mut server_fallbacks) = (0, 0);
        for (i, op) in OPS.iter().enumerate() {
            let what = format!("{op:?}, client offers {client_offers}, server {server_offers}");
            let seed = 100 + i as u64;
            let meta = server.metadata();
            if op.readable {
                let (descs, keep) = make(true, None);
                let r = c.begin_read(&meta, descs).await.expect("the READ starts");
                r.wait_for_completion_timeout(LIMIT)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(r.transport(), Some(TransportKind::Tcp), "{what}");
                check(&keep.read_back(r.into_descriptors()), seed)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            } else {
                let (descs, keep) = make(true, Some(seed));
                let w = c.begin_write(descs, &meta).await.expect("the WRITE starts");
                w.wait_for_completion_timeout(LIMIT)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(w.transport(), Some(TransportKind::Tcp), "{what}");
                drop((w.into_descriptors(), keep));
                // This side lends for a WRITE: it tried CUDA IPC only
                // where both offered it.
                client_fallbacks += u64::from(both);
            }
            assert_eq!(server.after("DONE "), "Complete tcp", "{what}");
            // The server lends for a READ, and tried CUDA IPC only where
            // both offered it.
            if op.readable {
                server_fallbacks += u64::from(both);
            }
            assert_eq!(
                server.after("FALLBACKS "),
                server_fallbacks.to_string(),
                "{what}: the server's fallbacks"
            );
            assert_eq!(
                c.metrics().cuda_ipc_fallbacks,
                client_fallbacks,
                "{what}: this side's fallbacks"
            );
            if !op.readable {
                assert_eq!(server.after("CHECK "), "ok", "{what}");
            }
        }
        let conns = c.metrics().connections;
        assert_eq!(
            (conns.outbound_opened, conns.outbound_closed),
            (1, 0),
            "one connection carried every operation"
        );
    });
}

/// Every pairing of offers, in turn (the offer is the process's: these
/// run one after the other, each on a new connector and connection).
#[test]
fn gpu_memory_is_lent_by_cuda_ipc_only_where_both_offer_it() {
    if served() {
        return;
    }
    let name = "gpu_memory_is_lent_by_cuda_ipc_only_where_both_offer_it";
    // A peer that did not offer is never asked for a lease of GPU memory;
    // a process that did not offer never lends by CUDA IPC.
    run(name, true, false);
    run(name, false, true);
    // Both offered: the export fails here (no driver behind the offer),
    // so every operation falls back to staging, on the same connection.
    run(name, true, true);
}
