//! The UCX backend as a whole: present or absent, and facing peers that
//! send it garbage. (The shared suites run over UCX too, through
//! `support::transports`.)

use std::time::Duration;

use ferry::{Connector, Error, OperationStatus, TransportKind};
use ferry_proto::lane::LaneId;
use ferry_proto::wire::{LaneOffer, Message};

#[path = "support/spawned.rs"]
mod spawned;
mod support;

use spawned::{check, pattern, runtime, Server};

use support::{legit_transfers_still_work, noise, within, Raw, Via};

/// Runs the test `name` of this binary alone in a child process with
/// `set` in its environment and `remove` taken out of it (UCX is loaded
/// once per process); its output, once it has passed.
fn run_child(name: &str, set: &[(&str, &str)], remove: &[&str]) -> String {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for (k, v) in set {
        cmd.env(k, v);
    }
    for k in remove {
        cmd.env_remove(k);
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("1 passed"),
        "the child test did not run: {text}"
    );
    text
}

/// Waits (bounded) until this process has exactly `n` ranges registered:
/// a lease ends with the destination's last frame, which the source may
/// read a moment after its own completion.
async fn registrations_back_to(n: usize) {
    within(async {
        while ferry::ucx::registrations() != n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
}

/// The environment variable that marks the child process of
/// [`without_ucx_operations_go_by_another_transport`].
const CHILD: &str = "FERRY_TEST_UCX_CHILD";

/// With no loadable libucp, UCX is absent: the default connector still
/// starts and moves bytes by another transport, and a connector that asks
/// for UCX by name fails with a configuration error that says why. Runs
/// in a child process (UCX is loaded once per process), with
/// `FERRY_UCX_LIB` naming a file that does not exist.
#[test]
fn without_ucx_operations_go_by_another_transport() {
    let text = run_child(
        "child_without_ucx",
        &[
            (CHILD, "1"),
            (ferry::ucx::LIB_ENV, "/nonexistent/libucp.so.0"),
        ],
        &[ferry::TRANSPORTS_ENV],
    );
    assert!(text.contains("carried by"), "{text}");
}

/// The child of [`without_ucx_operations_go_by_another_transport`]
/// (passes at once anywhere else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_without_ucx() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let why = ferry::ucx::status().unwrap_err();
    assert!(why.contains("/nonexistent/libucp.so.0"), "{why}");
    let build = || Connector::builder().listen("127.0.0.1:0".parse().unwrap());
    let (a, b) = (
        build().build().await.unwrap(),
        build().build().await.unwrap(),
    );
    let size = 1 << 20;
    let r = a
        .create_readable(vec![vec![5u8; size].into()])
        .await
        .unwrap();
    let op = b
        .begin_read(r.metadata(), vec![vec![0u8; size].into()])
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    let via = op.transport().unwrap();
    assert_ne!(via, TransportKind::Ucx);
    println!("carried by {via}");
    assert!(op.into_descriptors()[0]
        .as_slice()
        .unwrap()
        .iter()
        .all(|&x| x == 5));
    let named = build()
        .transports(&[TransportKind::Ucx, TransportKind::Tcp])
        .build()
        .await;
    match named {
        Err(Error::Config(m)) => assert!(m.contains("ucx") && m.contains("nonexistent"), "{m}"),
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("a connector that requires UCX started without it"),
    }
}

/// Garbage where a worker address belongs, from a peer that did not
/// authenticate: the connector declines UCX on that connection without
/// handing the bytes to UCX (which would abort the process on some), and
/// goes on serving everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_worker_addresses_are_declined() {
    if ferry::ucx::status().is_err() {
        eprintln!("skipped: no UCX here");
        return;
    }
    let target = Via::UCX
        .builder()
        .ucx_trusted_network(false)
        .build()
        .await
        .unwrap();
    for (i, address) in [noise(8, 1), noise(215, 2), vec![0u8; 215], vec![0xff; 4096]]
        .into_iter()
        .enumerate()
    {
        let mut r = Raw::connect(&target).await;
        r.send(&ucx_offer(&address)).await;
        match tokio::time::timeout(Duration::from_secs(10), r.next()).await {
            Ok(Some((Message::LaneOffer(a), _))) => {
                // Refused: no address, verdict 2, no CUDA memory.
                assert_eq!((a.lane, a.round), (LaneId::UCX, 1), "case {i}");
                assert_eq!(a.bytes, [0, 0, 0, 0, 2, 0], "case {i}: {a:?}");
            }
            Ok(None) => {}
            other => panic!("case {i}: {other:?}"),
        }
    }
    // An offer, then a second offer: out of turn, the connection closes.
    let mut r = Raw::connect(&target).await;
    for _ in 0..2 {
        r.send(&ucx_offer(&noise(100, 3))).await;
    }
    r.closed().await;
    legit_transfers_still_work(&target).await;
}

/// UCX's first offer (round 0): the worker `address`, verdict unknown, no
/// CUDA memory, as these tests write it.
fn ucx_offer(address: &[u8]) -> Message {
    let mut bytes = (address.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(address);
    bytes.extend_from_slice(&[0, 0]);
    Message::LaneOffer(LaneOffer {
        lane: LaneId::UCX,
        round: 0,
        bytes,
    })
}

/// UCX is set up between workers that authenticated with the shared
/// secret; without the secret (and without `ucx_trusted_network`) the
/// same operation goes by TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_needs_an_authenticated_connection_or_a_trusted_network() {
    if ferry::ucx::status().is_err() {
        eprintln!("skipped: no UCX here");
        return;
    }
    let _one = REGISTRATIONS.lock().await;
    for (secret, want) in [(true, TransportKind::Ucx), (false, TransportKind::Tcp)] {
        let build = || {
            let b = Via::UCX.builder().ucx_trusted_network(false);
            if secret {
                b.secret("0123456789abcdef0123456789abcdef")
            } else {
                b
            }
        };
        let (a, b) = (
            build().build().await.unwrap(),
            build().build().await.unwrap(),
        );
        let r = a
            .create_readable(vec![vec![3u8; 70_000].into()])
            .await
            .unwrap();
        let op = b
            .begin_read(r.metadata(), vec![vec![0u8; 70_000].into()])
            .await
            .unwrap();
        within(op.wait_for_completion()).await.unwrap();
        assert_eq!(op.transport(), Some(want), "secret: {secret}");
        assert!(op.into_descriptors()[0]
            .as_slice()
            .unwrap()
            .iter()
            .all(|&x| x == 3));
    }
}

/// Serializes the tests of this file that count registrations.
static REGISTRATIONS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The source's memory is registered while it is lent and unregistered
/// when the lease ends, before the operation hands the memory back: after
/// the operation, no remote key of it works on a transport that checks
/// keys. (Shared-memory transports check none: see docs/transports.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_end_with_the_lease() {
    if ferry::ucx::status().is_err() {
        eprintln!("skipped: no UCX here");
        return;
    }
    let _one = REGISTRATIONS.lock().await;
    let (a, b) = support::pair(Via::UCX).await;
    let before = ferry::ucx::registrations();
    let made = ferry::ucx::registrations_made();
    // Two descriptors far apart, and one block run: three ranges lent.
    let r = a
        .create_readable(vec![
            vec![1u8; 100_000].into(),
            vec![2u8; 3].into(),
            vec![3u8; 1 << 20].into(),
        ])
        .await
        .unwrap();
    let op = b
        .begin_read(
            r.metadata(),
            vec![
                vec![0u8; 100_000].into(),
                vec![0u8; 3].into(),
                vec![0u8; 1 << 20].into(),
            ],
        )
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(r.wait_for_completion()).await.unwrap();
    assert_eq!(op.transport(), Some(TransportKind::Ucx));
    // The lease ends with the destination's Finish, which the source may
    // read a moment after its completion.
    registrations_back_to(before).await;
    // The source registered what it lent (three ranges, or fewer if two
    // allocations happen to touch), and nothing is registered any more.
    let new = ferry::ucx::registrations_made() - made;
    assert!((1..=3).contains(&new), "{new} ranges registered");
    let got = op.into_descriptors();
    assert!(got[2].as_slice().unwrap().iter().all(|&x| x == 3));
}

/// Where UCX has no RMA transport (here: UCX over TCP or shared memory, no
/// RDMA NIC), it could only emulate gets, answered by the source's own
/// process from its memory: the endpoint is declined and the bytes go by
/// TCP, unless `ucx_emulated_rma` allows it (as the other tests do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulated_gets_are_declined_unless_allowed() {
    let Ok(found) = ferry::ucx::status() else {
        eprintln!("skipped: no UCX here");
        return;
    };
    if [" rc", " dc", "cuda_ipc"].iter().any(|t| found.contains(t)) {
        eprintln!("skipped: UCX has an RMA transport here ({found})");
        return;
    }
    let _one = REGISTRATIONS.lock().await;
    for (allowed, want) in [(false, TransportKind::Tcp), (true, TransportKind::Ucx)] {
        let build = || Via::UCX.builder().ucx_emulated_rma(allowed).build();
        let (a, b) = (build().await.unwrap(), build().await.unwrap());
        let r = a
            .create_readable(vec![vec![4u8; 70_000].into()])
            .await
            .unwrap();
        let op = b
            .begin_read(r.metadata(), vec![vec![0u8; 70_000].into()])
            .await
            .unwrap();
        within(op.wait_for_completion()).await.unwrap();
        assert_eq!(op.transport(), Some(want), "emulation allowed: {allowed}");
    }
}

/// Blocks of a pool lent over UCX use one registration of the whole pool,
/// made once and kept until the pool is dropped; with strict registration
/// each operation registers its own blocks and unregisters them when its
/// lease ends. Either way the bytes arrive, and nothing stays registered
/// once the pool is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_are_registered_once_unless_strict() {
    if ferry::ucx::status().is_err() {
        eprintln!("skipped: no UCX here");
        return;
    }
    let _one = REGISTRATIONS.lock().await;
    const BLOCK: usize = 4096;
    const ROUNDS: usize = 4;
    for strict in [false, true] {
        let build = || Via::UCX.builder().ucx_strict_registration(strict).build();
        let (a, b) = (build().await.unwrap(), build().await.unwrap());
        let before = ferry::ucx::registrations();
        let made = ferry::ucx::registrations_made();
        let pool = ferry::Pool::allocate(64 * BLOCK, BLOCK).unwrap();
        for id in 0..64u32 {
            pool.with_block_mut(id, |b| b.fill(id as u8)).unwrap();
        }
        for round in 0..ROUNDS as u32 {
            // Blocks apart from each other: several ranges in strict mode.
            let ids = [round, 10 + round, 30 + round, 63 - round];
            let r = a
                .create_readable(vec![pool.shared_blocks(&ids).unwrap()])
                .await
                .unwrap();
            let op = b
                .begin_read(
                    r.metadata(),
                    ids.iter().map(|_| vec![0u8; BLOCK].into()).collect(),
                )
                .await
                .unwrap();
            within(op.wait_for_completion()).await.unwrap();
            within(r.wait_for_completion()).await.unwrap();
            assert_eq!(op.transport(), Some(TransportKind::Ucx));
            for (d, id) in op.into_descriptors().into_iter().zip(ids) {
                let block = d.into_vec().unwrap();
                assert!(block.iter().all(|&x| x == id as u8), "block {id}");
            }
            // Once the lease ended: the pool's registration stays (cached),
            // or nothing stays (strict).
            let kept = if strict { before } else { before + 1 };
            registrations_back_to(kept).await;
        }
        let new = ferry::ucx::registrations_made() - made;
        if strict {
            assert!(new >= ROUNDS * 4, "strict: {new} ranges registered");
        } else {
            assert_eq!(new, 1, "the pool is registered once");
        }
        drop(pool);
        registrations_back_to(before).await;
    }
}

/// The environment variable that marks the child process of
/// [`strict_registration_by_the_builder_reaches_ucx`].
const STRICT_CHILD: &str = "FERRY_TEST_UCX_STRICT_CHILD";

/// A connector built with `ucx_strict_registration(true)`, in a process
/// without `FERRY_UCX_STRICT_REGISTRATION`, starts the process's UCX for
/// strict registration (UCX's InfiniBand registration cache off, where the
/// host has InfiniBand or RoCE): the builder's setting is not lost to the
/// variable's absence. Runs in a child process (UCX starts once per
/// process); skipped where UCX does not load.
#[test]
fn strict_registration_by_the_builder_reaches_ucx() {
    let text = run_child(
        "child_strict_by_builder",
        &[(STRICT_CHILD, "1")],
        &[ferry::UCX_STRICT_REGISTRATION_ENV, ferry::TRANSPORTS_ENV],
    );
    if let Some(at) = text.find("skipped:") {
        eprintln!("{}", text[at..].lines().next().unwrap_or_default());
    }
}

/// The child of [`strict_registration_by_the_builder_reaches_ucx`]
/// (passes at once anywhere else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_strict_by_builder() {
    if std::env::var_os(STRICT_CHILD).is_none() {
        return;
    }
    // Nothing else has started UCX in this process: the connector does.
    let built = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Ucx, TransportKind::Tcp])
        .ucx_strict_registration(true)
        .build()
        .await;
    match built {
        Ok(_) => {
            let ucx = ferry::ucx::status().unwrap();
            assert!(ucx.contains("strict registration"), "{ucx}");
        }
        Err(Error::Config(why)) => println!("skipped: no UCX here ({why})"),
        Err(e) => panic!("{e}"),
    }
}

/// The environment variable that marks the child process of
/// [`a_key_of_unregistered_memory_gets_nothing`].
const KEY_CHILD: &str = "FERRY_TEST_UCX_KEY_CHILD";

/// What strict registration promises where a transport checks keys (RDMA):
/// a get with the key of memory that was unregistered fails. Runs in a
/// child process with `FERRY_UCX_STRICT_REGISTRATION=1`, so that UCX's own
/// InfiniBand registration cache is off from the start. UCX over TCP or
/// shared memory (this project's CI) checks no key: there the child says
/// it skipped, and the promise is unverified.
#[test]
fn a_key_of_unregistered_memory_gets_nothing() {
    let text = run_child(
        "child_old_key",
        &[(KEY_CHILD, "1"), (ferry::UCX_STRICT_REGISTRATION_ENV, "1")],
        &[],
    );
    if let Some(at) = text.find("skipped:") {
        eprintln!("{}", text[at..].lines().next().unwrap_or_default());
    }
}

/// The child of [`a_key_of_unregistered_memory_gets_nothing`] (passes at
/// once anywhere else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_old_key() {
    use ferry::ucx::baseline::{Lent, Node};
    if std::env::var_os(KEY_CHILD).is_none() {
        return;
    }
    if let Err(why) = ferry::ucx::status() {
        println!("skipped: no UCX here ({why})");
        return;
    }
    let (a, b) = (Node::start().unwrap(), Node::start().unwrap());
    let mut lent = Lent::new(1 << 20, 1).unwrap();
    let mut g = b.connect(&lent.offer(&a)).unwrap();
    let (mut g, first) = tokio::task::spawn_blocking(move || {
        let r = g.run(1);
        (g, r)
    })
    .await
    .unwrap();
    first.expect("a get while the memory is registered");
    let lanes = g.lanes();
    let checks_keys = lanes.iter().any(|l| {
        ["rc", "dc", "ud"]
            .iter()
            .any(|t| l.split('/').next().unwrap_or("").starts_with(t))
    });
    lent.unregister();
    if !checks_keys {
        println!("skipped: no transport here checks remote keys (lanes {lanes:?})");
        return;
    }
    let again = tokio::task::spawn_blocking(move || g.run(1)).await.unwrap();
    assert!(
        again.is_err(),
        "a get with the key of unregistered memory succeeded (lanes {lanes:?})"
    );
}

/// The role that makes this binary the stopped source of
/// [`a_cancel_gives_back_the_memory_of_gets_a_stopped_source_holds`].
const STOPPED_ROLE: &str = "FERRY_TEST_UCX_STOPPED_SOURCE";

/// The READ that the source is stopped in the middle of.
const STOPPED_BIG: usize = 64 << 20;

/// The source of the stopped-source test: three readables over UCX (a
/// warm-up, the large one, the next one), their metadata printed
/// (`META <json>`) in that order; exits once its standard input closes.
fn serve_stopped(_spec: &str) {
    runtime().block_on(async {
        let c = Via::UCX.connector().await;
        let mut keep = Vec::new();
        for (seed, len) in [(1, 4096), (2, STOPPED_BIG), (3, 4096)] {
            let r = c
                .create_readable(vec![pattern(seed, 0, len).into()])
                .await
                .unwrap();
            println!("META {}", r.metadata().to_json());
            keep.push(r);
        }
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    });
}

/// Sends `sig` to the server process.
fn signal(server: &Server, sig: libc::c_int) {
    // SAFETY: a plain system call on a child of this process (alive: it
    // exits only once its standard input closes).
    assert_eq!(unsafe { libc::kill(server.child.id() as i32, sig) }, 0);
}

/// A source process stopped (SIGSTOP) while a 64 MiB READ over UCX gets
/// from it: the cancel returns, the READ is `Cancelled`, and the memory
/// is given back within a second or so (the lane recalls the gets that the
/// stopped source cannot answer by closing its UCX endpoint), after which
/// no byte of it changes, also once the source runs again (SIGCONT). The
/// next READ from that source then succeeds promptly, over a new
/// connection. Where the gets need no help from the source (a transport
/// that moves them itself, such as UCX's own cross-memory attach, or the
/// READ ended before the stop) there is nothing to recall: the test says
/// so and passes.
#[test]
fn a_cancel_gives_back_the_memory_of_gets_a_stopped_source_holds() {
    const NAME: &str = "a_cancel_gives_back_the_memory_of_gets_a_stopped_source_holds";
    if spawned::served(STOPPED_ROLE, serve_stopped) {
        return;
    }
    if let Err(why) = ferry::ucx::status() {
        if std::env::var_os(support::REQUIRE_UCX_ENV).is_some() {
            panic!(
                "{} is set but UCX cannot start: {why}",
                support::REQUIRE_UCX_ENV
            );
        }
        eprintln!("skipped: no UCX here ({why})");
        return;
    }
    let mut server = Server::start(NAME, STOPPED_ROLE, "");
    let metas: Vec<_> = (0..3).map(|_| server.metadata()).collect();
    runtime().block_on(async {
        let c = Via::UCX.connector().await;
        // Warm-up: the connection and its UCX endpoint are made.
        let warm = c
            .begin_read(&metas[0], vec![vec![0u8; 4096].into()])
            .await
            .unwrap();
        within(warm.wait_for_completion()).await.unwrap();
        assert_eq!(warm.transport(), Some(TransportKind::Ucx));

        let op = c
            .begin_read(&metas[1], vec![vec![0u8; STOPPED_BIG].into()])
            .await
            .unwrap();
        // The lease arrived (the lane is named): the gets start now.
        within(async {
            while op.transport().is_none() && !op.status().is_terminal() {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
        .await;
        signal(&server, libc::SIGSTOP);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = op.status();
        op.cancel();
        let after = op.status();
        if before.is_terminal() || !after.is_terminal() {
            // Ended before the stop, or sealed (every byte landed without
            // the source's help; its confirmation decides).
            signal(&server, libc::SIGCONT);
            eprintln!(
                "skipped: the gets did not need the stopped source here (the READ was \
                 {before:?} at the stop, {after:?} after the cancel)"
            );
            return;
        }
        assert_eq!(after, OperationStatus::Cancelled);
        let t = std::time::Instant::now();
        let first = tokio::task::block_in_place(|| loop {
            if let Some(d) = op.descriptors() {
                break d[0].as_slice().unwrap().to_vec();
            }
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "the cancelled READ's memory was not given back within 2 s of the cancel \
                 (a get from the stopped source still in flight)"
            );
        });
        signal(&server, libc::SIGCONT);
        // Had a get still been in flight, the source would answer it now.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let later = op.descriptors().expect("given back")[0].as_slice().unwrap();
        assert!(
            first == later,
            "bytes changed after the memory was given back"
        );
        let t = std::time::Instant::now();
        let next = c
            .begin_read(&metas[2], vec![vec![0u8; 4096].into()])
            .await
            .unwrap();
        next.wait_for_completion_timeout(Duration::from_secs(2))
            .await
            .expect("the next READ from the source, once it runs again");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the next READ took {:?}",
            t.elapsed()
        );
        let got = next.into_descriptors()[0].as_slice().unwrap().to_vec();
        check(&[got], 3).unwrap();
    });
}
