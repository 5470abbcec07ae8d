//! The conformance suite over UCX, within this process: the source is a
//! UCP worker of its own, whose memory [`UcxPuller::register`] registers
//! and whose lease carries the packed keys; the destination gets from it
//! through an endpoint of another worker, as a connection's peer does.
//! Where `libucp` does not load every case says so and passes, unless
//! `FERRY_REQUIRE_UCX` is set (CI), where it fails.
//!
//! - A source that goes away: its worker is destroyed (as its process's
//!   exit would), which the destination's endpoint reports.
//! - A copy held mid-chunk: a source whose worker's progress is held (the
//!   only thread of its runtime is blocked), so that a get, which UCX
//!   answers from the source's side where no transport moves gets itself
//!   (`Endpoint::has_rma_lane`), cannot end until it is let go. Where an
//!   RMA lane moves the gets, the source cannot hold them, and the case
//!   says so.

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry_proto::DeviceKind;
use tokio::runtime::Runtime;
use tokio::sync::watch;

use super::{UcxPuller, PULL_CHUNK, RECALL_AFTER};
use crate::region::Region;
use crate::transport::pull::conformance::{
    conformance_tests, destination, host_source, op, recalled, Applies, Backend, Mortal, Source,
    Stalled, FILL,
};
use crate::transport::pull::Lane;
use crate::transport::ucx::{self, Endpoint, Worker};

/// The variable that makes a missing UCX fail the suite (CI sets it), as
/// for the integration suites (`tests/support`).
const REQUIRE_UCX_ENV: &str = "FERRY_REQUIRE_UCX";

/// How long a stalled get may take to show up in the destination.
const STUCK_WITHIN: Duration = Duration::from_secs(10);

/// A worker progressed by a runtime, stopped when dropped.
struct Node {
    worker: Arc<Worker>,
    stop: watch::Sender<bool>,
}

impl Node {
    fn start(rt: &Runtime) -> Node {
        let (stop, rx) = watch::channel(false);
        let worker = Worker::start(rt.handle(), rx, true).expect("a UCX worker");
        Node { worker, stop }
    }

    /// An endpoint of `from`'s worker to this one.
    fn reached_from(&self, from: &Node) -> Endpoint {
        from.worker
            .connect(self.worker.address())
            .expect("an endpoint between two workers of this process")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Ends the progress task, which drops its hold on the worker.
        let _ = self.stop.send(true);
    }
}

/// What every case shares: a runtime, the destination's worker and the
/// source's.
struct Fixture {
    rt: Runtime,
    dst: Node,
    src: Node,
}

/// The shared fixture, or why UCX does not run here.
fn fixture() -> Result<&'static Fixture, String> {
    static F: OnceLock<Result<Fixture, String>> = OnceLock::new();
    F.get_or_init(|| {
        ucx::ucx().map_err(|why| format!("UCX cannot start here: {why}"))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime: {e}"))?;
        let (dst, src) = (Node::start(&rt), Node::start(&rt));
        // Endpoints with peer error handling, as Ferry makes them: where
        // no transport of this UCX allows that (`UCX_TLS=sm`), none.
        dst.worker
            .connect(src.worker.address())
            .map_err(|why| format!("UCX cannot connect two workers here: {why}"))?;
        Ok(Fixture { rt, dst, src })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The fixture, once [`UcxBackend::absent`] said it is there.
fn here() -> &'static Fixture {
    fixture().expect("UCX runs here")
}

/// UCX between two workers of this process.
#[derive(Default)]
struct UcxBackend(UcxPuller);

impl Backend for UcxBackend {
    type P = UcxPuller;

    fn puller(&self) -> &UcxPuller {
        &self.0
    }

    fn absent(&self) -> Option<String> {
        let why = fixture().err()?;
        if std::env::var_os(REQUIRE_UCX_ENV).is_some() {
            panic!("{REQUIRE_UCX_ENV} is set but {why}");
        }
        Some(why)
    }

    fn chunk(&self, _into: DeviceKind) -> usize {
        PULL_CHUNK as usize
    }

    fn pulls_into(&self, into: DeviceKind) -> Applies<()> {
        match into {
            DeviceKind::Cpu => Ok(()),
            _ if ucx::moves_cuda() => Ok(()),
            _ => Err(
                "this process's UCX does not move CUDA memory (a UCX built without \
                      CUDA, or FERRY_UCX_CUDA off): the pull would refuse it"
                    .into(),
            ),
        }
    }

    fn source(&self, sizes: &[usize]) -> Source<Endpoint> {
        let f = here();
        host_source(&self.0, sizes, |_| f.src.reached_from(&f.dst))
    }

    fn mortal_source(&self, sizes: &[usize]) -> Applies<Mortal<Endpoint>> {
        let f = here();
        let node = Node::start(&f.rt);
        let source = host_source(&self.0, sizes, |_| node.reached_from(&f.dst));
        let lose = move || {
            let gone = Arc::downgrade(&node.worker);
            drop(node);
            // The progress task lets go of the worker, which is then
            // destroyed (its transports' connections close).
            let t = Instant::now();
            while gone.strong_count() > 0 {
                assert!(t.elapsed() < STUCK_WITHIN, "the worker was not destroyed");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        Ok((source, Box::new(lose)))
    }

    fn stalled_source(&self, len: usize) -> Applies<Stalled<Endpoint>> {
        let f = here();
        // The source's worker on a runtime of one thread, which the
        // stall holds.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime: {e}"))?;
        let node = Node::start(&rt);
        let ep = node.reached_from(&f.dst);
        if ep.has_rma_lane() {
            return Err(format!(
                "an RMA lane moves the gets here ({:?}): the source cannot hold one",
                ep.lanes()
            ));
        }
        let gate = Arc::new(Gate::default());
        let held = gate.clone();
        rt.spawn(async move { held.hold() });
        gate.wait_held();
        let mut ep = Some(ep);
        let source = host_source(&self.0, &[len], |_| ep.take().expect("one endpoint"))
            // The source's worker, then its runtime, once the endpoint to
            // it is gone.
            .then(Box::new(move || drop((node, rt))));
        let open = gate.clone();
        Ok(Stalled {
            source,
            stuck: Box::new(|dst: &Region| {
                let t = Instant::now();
                while dst.is_quiet() {
                    assert!(t.elapsed() < STUCK_WITHIN, "no get started");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }),
            release: Box::new(move || open.open()),
        })
    }
}

/// Holds the only thread of a runtime until opened.
#[derive(Default)]
struct Gate {
    /// (the thread is held, the gate is open)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, bool)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks the calling thread (a runtime's) until the gate opens.
    fn hold(&self) {
        let mut s = self.lock();
        s.0 = true;
        self.changed.notify_all();
        while !s.1 {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Returns once a thread is held.
    fn wait_held(&self) {
        let mut s = self.lock();
        while !s.0 {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn open(&self) {
        self.lock().1 = true;
        self.changed.notify_all();
    }
}

conformance_tests!(UcxBackend::default());

/// The lane declares what it moves; device memory only where this
/// process's UCX moves CUDA memory (checked per pull).
#[test]
fn ucx_declares_host_and_device_memory() {
    let p = UcxPuller::default();
    assert_eq!(p.kind(), crate::TransportKind::Ucx);
    let caps = p.caps();
    assert!(caps.lends.host && caps.pulls_into.host);
    let cuda = ucx::moves_cuda();
    assert!(caps.lends.device == cuda && caps.pulls_into.device == cuda);
}

/// A close that meets a get the source does not answer (its worker held,
/// as a stopped process's would be): the pull recalls it (the endpoint
/// closed) within [`RECALL_AFTER`] and a little, *while the source is
/// still held*, and ends `Failed` (`Recalled`, connection scope),
/// unsealed; the copy has returned, so the memory goes back to its owner,
/// and nothing past the held chunk landed, also once the source runs again.
#[test]
fn a_close_recalls_a_get_the_source_holds() {
    let b = UcxBackend::default();
    if let Some(why) = b.absent() {
        return eprintln!("skipped: {why}");
    }
    let len = 4 * PULL_CHUNK as usize;
    let Stalled {
        source,
        stuck,
        release,
    } = match b.stalled_source(len) {
        Ok(s) => s,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let dst = destination(&[len], DeviceKind::Cpu);
    let shared = op();
    let (peer, lease) = (source.peer(), &source.lease);
    let (tx, rx) = std::sync::mpsc::channel();
    let (ended, took) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = tx.send(b.0.pull(peer, lease, &dst.region, &shared));
        });
        stuck(&dst.region);
        let t = Instant::now();
        dst.region.close();
        let ended = rx.recv_timeout(RECALL_AFTER + Duration::from_secs(5));
        let took = t.elapsed();
        // Always, so that a pull that did not return does now.
        release();
        (ended, took)
    });
    let end = ended.expect("the pull did not return while the source was held");
    assert!(recalled(&end), "the pull ended {end:?}");
    assert!(took >= RECALL_AFTER, "recalled after {took:?}");
    assert!(!shared.is_sealed());
    assert!(dst.region.is_quiet(), "the recalled get is still counted");
    assert!(
        peer.with_raw(|_| ()).is_none(),
        "the endpoint is still open"
    );
    let before = dst.bytes(0).into_owned();
    assert!(
        before[PULL_CHUNK as usize..].iter().all(|&x| x == FILL),
        "bytes past the held chunk landed"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(dst.bytes(0) == before, "bytes changed after the recall");
    drop(source);
}
