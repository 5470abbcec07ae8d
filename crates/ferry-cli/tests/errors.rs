//! Every way an operation between two processes can go wrong, each with the
//! error it must produce.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferry::{AbortReason, Error, OperationStatus, RdmaMetadata, TransportKind};
use ferry_cli::peer::{Cmd, Request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_pairing_is_refused_before_any_byte_moves() {
    let local = connector().await;
    let p = peer().await;
    let (_a, readable) = expose(&p, Cmd::Readable, &[64], 1).await;
    let err = local
        .begin_write(filled(&[64], 1), &readable)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongPairing { .. }), "{err}");
    assert!(err.is_misuse());
    assert!(err.to_string().contains("pair READ with READABLE"), "{err}");

    let (_b, writable) = expose(&p, Cmd::Writable, &[64], 1).await;
    let err = local
        .begin_read(&writable, zeroed(&[64]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongPairing { .. }), "{err}");

    // The peer, too, refuses to read from this process's writable.
    let w = local.create_writable(zeroed(&[64])).await.unwrap();
    let mut a = p
        .request(with_meta(req(Cmd::Read, &[64], 1), w.metadata()))
        .await
        .unwrap();
    let ev = done(&mut a).await;
    assert!(
        ev.error.as_deref().unwrap().contains("WritableOperation"),
        "{ev:?}"
    );
    assert_eq!(
        w.status(),
        OperationStatus::Initialized,
        "the refused read touched nothing"
    );
    assert_eq!(connection_free(&local), 0);
}

fn connection_free(c: &ferry::Connector) -> usize {
    c.connection_count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_and_size_mismatches_are_refused() {
    let local = connector().await;
    let p = peer().await;
    let (_a, m) = expose(&p, Cmd::Readable, &[10, 20], 1).await;
    let err = local.begin_read(&m, zeroed(&[10])).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::CountMismatch {
                local: 1,
                remote: 2
            }
        ),
        "{err}"
    );
    let err = local.begin_read(&m, zeroed(&[10, 21])).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::SizeMismatch {
                index: 1,
                local: 21,
                remote: 20
            }
        ),
        "{err}"
    );
    // Nothing was sent: the peer's readable is untouched and still usable.
    let read = local.begin_read(&m, zeroed(&[10, 20])).await.unwrap();
    read.wait_for_completion().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_metadata_is_refused_by_the_remote_without_disturbing_it() {
    let local = connector().await;
    let p = peer().await;
    let (mut a, m) = expose(&p, Cmd::Writable, &[100], 5).await;
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
        f(&mut v);
        RdmaMetadata::from_json(&v.to_string()).unwrap()
    };
    // Sizes claimed larger than exposed: the remote checks them itself.
    let bigger = edit(&|v| v["descriptors"][0]["size"] = 200.into());
    let op = local.begin_write(filled(&[200], 5), &bigger).await.unwrap();
    let err = op.wait_for_completion().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::SizeMismatch,
                ..
            }
        ),
        "{err}"
    );
    // A guessed token.
    let guessed = edit(&|v| v["token"] = "00000000000000000000000000000000".into());
    let op = local
        .begin_write(filled(&[100], 5), &guessed)
        .await
        .unwrap();
    let err = op.wait_for_completion().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::UnknownOperation,
                ..
            }
        ),
        "{err}"
    );
    // Another operation id.
    let other = edit(&|v| v["operation_id"] = 999_999.into());
    let op = local.begin_write(filled(&[100], 5), &other).await.unwrap();
    let err = op.wait_for_completion().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::UnknownOperation,
                ..
            }
        ),
        "{err}"
    );
    // The kind flipped (a READ against the writable).
    let flipped = edit(&|v| v["operation_kind"] = 1.into());
    let op = local.begin_read(&flipped, zeroed(&[100])).await.unwrap();
    let err = op.wait_for_completion().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::WrongKind,
                ..
            }
        ),
        "{err}"
    );

    // The writable was not disturbed: the genuine write still lands.
    assert!(a.try_next().is_none());
    let op = local.begin_write(filled(&[100], 5), &m).await.unwrap();
    op.wait_for_completion().await.unwrap();
    let ev = done(&mut a).await;
    assert_eq!(ev.verified, Some(true), "{ev:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_truncated_metadata_are_errors() {
    let p = peer().await;
    let local = connector().await;
    let r = local.create_readable(filled(&[8], 1)).await.unwrap();
    let json = r.metadata().to_json();
    for bad in [
        "garbage".to_string(),
        String::new(),
        json[..json.len() / 2].to_string(),
        json.replace("\"version\":1", "\"version\":2"),
    ] {
        let err = RdmaMetadata::from_json(&bad).unwrap_err();
        assert!(!err.to_string().is_empty());
        // The same through the peer process, which reports it.
        let mut rq = req(Cmd::Read, &[8], 1);
        rq.metadata = Some(bad.clone());
        let mut a = p.request(rq).await.unwrap();
        let ev = done(&mut a).await;
        assert!(
            ev.error.as_deref().unwrap().starts_with("bad metadata"),
            "{bad:?}: {ev:?}"
        );
    }
    assert_eq!(r.status(), OperationStatus::Initialized);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_of_an_ended_operation_is_refused() {
    let local = connector().await;
    let p = peer().await;
    let (mut a, m) = expose(&p, Cmd::Readable, &[4096], 3).await;
    let read = local.begin_read(&m, zeroed(&[4096])).await.unwrap();
    read.wait_for_completion().await.unwrap();
    done(&mut a).await;
    let again = local.begin_read(&m, zeroed(&[4096])).await.unwrap();
    let err = again.wait_for_completion().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::OperationEnded,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("fresh metadata"), "{err}");
    assert_eq!(again.status(), OperationStatus::Errored);

    // Cancelled before use: the same.
    let (_b, m) = expose(&p, Cmd::Writable, &[16], 3).await;
    p.request(Request {
        target: Some(_b.id),
        ..Request::new(0, Cmd::Cancel)
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let w = local.begin_write(filled(&[16], 3), &m).await.unwrap();
    let err = w.wait_for_completion().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::OperationEnded,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_address_is_a_quick_error() {
    let local = connector().await;
    let other = connector().await;
    let r = other.create_readable(filled(&[8], 1)).await.unwrap();
    // A port that nothing listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let m = r.metadata().clone().with_addresses(vec![free]).unwrap();
    let t = Instant::now();
    let err = local.begin_read(&m, zeroed(&[8])).await.unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(&free.to_string()), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));

    // A connector that has shut down.
    drop(other);
    let err = r.wait_for_completion().await.unwrap_err();
    assert!(matches!(err, Error::Shutdown), "{err}");
    let err = match local.begin_read(r.metadata(), zeroed(&[8])).await {
        Err(e) => e,
        Ok(op) => op.wait_for_completion().await.unwrap_err(),
    };
    assert!(
        matches!(
            err,
            Error::Unreachable { .. } | Error::ConnectionLost { .. }
        ),
        "{err}"
    );
}

async fn wait_status(
    f: impl Fn() -> OperationStatus,
    want: OperationStatus,
    within: Duration,
) -> Duration {
    let t = Instant::now();
    while f() != want {
        assert!(
            t.elapsed() < within,
            "status {:?}, wanted {want:?} within {within:?}",
            f()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    t.elapsed()
}

const BIG: u64 = 1 << 30;

/// The transports of a run over `t` (cross-memory attach, or UCX, for
/// every size).
fn over(t: TransportKind) -> Vec<TransportKind> {
    lane_transports(t)
}

/// What the tests of killed peers and cancels run over: cross-memory
/// attach, TCP, and UCX where it loads.
fn lanes() -> Vec<TransportKind> {
    with_ucx(vec![(TransportKind::Cma, 1), (TransportKind::Tcp, 1)])
        .into_iter()
        .map(|(t, _)| t)
        .collect()
}

/// The lanes of the tests where the peer killed is the *destination* and
/// this process the source: not UCX here. UCX runs here without an `rma`
/// lane, so each get is emulated by a handler in the source's process, and
/// UCX 1.13 aborts that process ("Fatal: unexpected error: Endpoint
/// timeout" from `ucp_get_req_handler`) when it answers a get of a
/// destination that died (seen once in CI; docs/transports.md). That is
/// the emulation's defect, with no counterpart on an RDMA lane, where the
/// source runs no handler; Ferry declines emulated gets by default.
fn lanes_killing_the_destination() -> Vec<TransportKind> {
    let l = lanes();
    if l.contains(&TransportKind::Ucx) {
        eprintln!(
            "skipped: the ucx lane (UCX here emulates gets in the source, which \
             UCX 1.13 aborts when the destination dies; see docs/transports.md)"
        );
    }
    l.into_iter().filter(|&t| t != TransportKind::Ucx).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_killed_mid_read_of_this_process_memory() {
    for t in lanes_killing_the_destination() {
        remote_killed_mid_read_of_this_process_memory_over(t).await;
    }
}

async fn remote_killed_mid_read_of_this_process_memory_over(t: TransportKind) {
    let local = connector_over(&over(t)).await;
    let mut victim = peer_over(&over(t), &[]).await;
    let bystander = peer_over(&over(t), &[]).await;
    let readable = local.create_readable(zeroed(&[BIG])).await.unwrap();
    let _a = victim
        .request(with_meta(req(Cmd::Read, &[BIG], 0), readable.metadata()))
        .await
        .unwrap();
    wait_status(
        || readable.status(),
        OperationStatus::InProgress,
        Duration::from_secs(60),
    )
    .await;
    victim.kill().await.unwrap();
    let t = Instant::now();
    let err = readable
        .wait_for_completion_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert_eq!(readable.status(), OperationStatus::Errored);
    eprintln!("the survivor saw the death after {:?}", t.elapsed());

    // The survivor keeps serving its other peers.
    let r2 = local.create_readable(filled(&[1 << 20], 4)).await.unwrap();
    let mut a = bystander
        .request(with_meta(req(Cmd::Read, &[1 << 20], 4), r2.metadata()))
        .await
        .unwrap();
    r2.wait_for_completion().await.unwrap();
    assert_eq!(done(&mut a).await.verified, Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_killed_mid_write_into_its_memory() {
    for t in lanes_killing_the_destination() {
        remote_killed_mid_write_into_its_memory_over(t).await;
    }
}

async fn remote_killed_mid_write_into_its_memory_over(t: TransportKind) {
    let local = connector_over(&over(t)).await;
    let mut victim = peer_over(&over(t), &[]).await;
    let bystander = peer_over(&over(t), &[]).await;
    let (_a, m) = expose(&victim, Cmd::Writable, &[BIG], 0).await;
    let write = local.begin_write(zeroed(&[BIG]), &m).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    victim.kill().await.unwrap();
    let err = write
        .wait_for_completion_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");

    let (mut b, m2) = expose(&bystander, Cmd::Writable, &[1 << 20], 8).await;
    let w2 = local.begin_write(filled(&[1 << 20], 8), &m2).await.unwrap();
    w2.wait_for_completion().await.unwrap();
    assert_eq!(done(&mut b).await.verified, Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_killed_mid_write_into_this_process_memory() {
    for t in lanes() {
        remote_killed_mid_write_into_this_process_memory_over(t).await;
    }
}

async fn remote_killed_mid_write_into_this_process_memory_over(t: TransportKind) {
    let local = connector_over(&over(t)).await;
    let mut victim = peer_over(&over(t), &[]).await;
    let bystander = peer_over(&over(t), &[]).await;
    let writable = local.create_writable(zeroed(&[BIG])).await.unwrap();
    let mut r = with_meta(req(Cmd::Write, &[BIG], 0), writable.metadata());
    r.reuse = true; // no pattern to compute: start writing at once
    let _a = victim.request(r).await.unwrap();
    wait_status(
        || writable.status(),
        OperationStatus::InProgress,
        Duration::from_secs(60),
    )
    .await;
    victim.kill().await.unwrap();
    let err = writable
        .wait_for_completion_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert_eq!(local.exposed_count(), 0);

    let w2 = local.create_writable(zeroed(&[1 << 20])).await.unwrap();
    let mut a = bystander
        .request(with_meta(req(Cmd::Write, &[1 << 20], 6), w2.metadata()))
        .await
        .unwrap();
    w2.wait_for_completion().await.unwrap();
    done(&mut a).await;
    assert!(ferry_cli::peer::verify(&w2.into_descriptors(), 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_killed_while_this_process_reads_it() {
    for t in lanes() {
        remote_killed_while_this_process_reads_it_over(t).await;
    }
}

async fn remote_killed_while_this_process_reads_it_over(t: TransportKind) {
    let local = connector_over(&over(t)).await;
    let mut victim = peer_over(&over(t), &[]).await;
    let (_a, m) = expose(&victim, Cmd::Readable, &[BIG], 0).await;
    let read = local.begin_read(&m, zeroed(&[BIG])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(read.transport(), Some(t), "the bytes were moving over {t}");
    victim.kill().await.unwrap();
    let err = read
        .wait_for_completion_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert_eq!(read.status(), OperationStatus::Errored);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_writable_during_a_transfer_stops_every_later_byte() {
    for t in lanes() {
        cancel_of_a_writable_during_a_transfer_stops_every_later_byte_over(t).await;
    }
}

async fn cancel_of_a_writable_during_a_transfer_stops_every_later_byte_over(t: TransportKind) {
    let local = connector_over(&over(t)).await;
    let p = peer_over(&over(t), &[]).await;
    let size = BIG; // long enough that the cancel lands mid-transfer even on a loaded machine
    let (mut a, m) = expose(&p, Cmd::Writable, &[size], 7).await;
    let write = local.begin_write(filled(&[size], 7), &m).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    p.request(Request {
        target: Some(a.id),
        ..Request::new(0, Cmd::Cancel)
    })
    .await
    .unwrap();
    let ev = done(&mut a).await;
    assert_eq!(
        ev.before_cancel.as_deref(),
        Some("IN_PROGRESS"),
        "cancelled during the transfer: {ev:?}"
    );
    assert_eq!(ev.status.as_deref(), Some("CANCELLED"));
    let at_cancel = ev.checksum.unwrap();

    // The writer learns of it.
    let err = write.wait_for_completion().await.unwrap_err();
    assert!(matches!(err, Error::RemoteCancelled), "{err}");
    // Give a late byte every chance to land, then look again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = p
        .request(Request {
            target: Some(a.id),
            ..Request::new(0, Cmd::Checksum)
        })
        .await
        .unwrap()
        .expect("checksum")
        .await
        .unwrap();
    assert_eq!(
        later.checksum,
        Some(at_cancel),
        "bytes landed in the writable after its cancel returned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_write_during_a_transfer_reaches_the_remote() {
    for t in lanes() {
        cancel_of_a_write_during_a_transfer_reaches_the_remote_over(t).await;
    }
}

async fn cancel_of_a_write_during_a_transfer_reaches_the_remote_over(t: TransportKind) {
    let local = connector_over(&over(t)).await;
    let p = peer_over(&over(t), &[]).await;
    let size = BIG; // long enough that the cancel lands mid-transfer even on a loaded machine
    let (mut a, m) = expose(&p, Cmd::Writable, &[size], 7).await;
    let write = local.begin_write(filled(&[size], 7), &m).await.unwrap();
    assert_eq!(write.transport(), Some(t));
    tokio::time::sleep(Duration::from_millis(20)).await;
    write.cancel();
    assert_eq!(write.status(), OperationStatus::Cancelled);
    assert!(matches!(
        write.wait_for_completion().await,
        Err(Error::Cancelled)
    ));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("CANCELLED"), "{ev:?}");
    assert!(
        ev.error
            .as_deref()
            .unwrap()
            .contains("remote side cancelled"),
        "{ev:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_a_transfer_on_both_sides() {
    let local = connector().await;
    let p = peer().await;
    // An active read cancelled right after it began: the remote readable is told.
    let (mut a, m) = expose(&p, Cmd::Readable, &[64 << 20], 2).await;
    let read = local.begin_read(&m, zeroed(&[64 << 20])).await.unwrap();
    read.cancel();
    assert_eq!(read.status(), OperationStatus::Cancelled);
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("CANCELLED"), "{ev:?}");
    // Dropping counts as cancelling: a local writable dropped before the peer writes.
    let w = local.create_writable(zeroed(&[32])).await.unwrap();
    let meta = w.metadata().clone();
    drop(w);
    assert_eq!(local.exposed_count(), 0);
    let mut a = p
        .request(with_meta(req(Cmd::Write, &[32], 1), &meta))
        .await
        .unwrap();
    let ev = done(&mut a).await;
    assert!(
        ev.error.as_deref().unwrap().contains("has already ended"),
        "{ev:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_fire_on_both_sides() {
    let local = connector().await;
    let p = peer().await;
    let w = local.create_writable(zeroed(&[8])).await.unwrap();
    let err = w
        .wait_for_completion_timeout(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert_eq!(
        w.status(),
        OperationStatus::Initialized,
        "a deadline does not cancel"
    );
    let mut r = req(Cmd::Writable, &[8], 1);
    r.deadline_ms = Some(50);
    let mut a = p.request(r).await.unwrap();
    a.expect("metadata").await.unwrap();
    let ev = done(&mut a).await;
    assert!(
        ev.error
            .as_deref()
            .unwrap()
            .contains("did not finish within"),
        "{ev:?}"
    );
}

/// Striped over four TCP streams: a remote killed mid-transfer fails the
/// transfer on this side, whichever side is active and whichever way the
/// bytes go, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_killed_mid_striped_transfers() {
    for case in [
        "it reads this process",
        "this process reads it",
        "this process writes it",
    ] {
        striped_transfer_killed(case).await;
    }
}

/// How many fresh transfers [`striped_transfer_killed`] starts when the
/// one before ended before its peer could be frozen.
const STRIPED_TRIES: usize = 3;

/// One case of [`remote_killed_mid_striped_transfers`]: a fresh connector
/// and peer, the transfer, its peer killed mid-way. Where the transfer
/// ended before the peer was frozen (it never sees the kill), again.
async fn striped_transfer_killed(case: &str) {
    const SIZE: u64 = 256 << 20;
    let tcp = [TransportKind::Tcp];
    for attempt in 1..=STRIPED_TRIES {
        let local = connector_striped(4).await;
        let mut victim = peer_striped(&tcp, 4, &[]).await;
        let v = &mut victim;
        let killed = match case {
            "it reads this process" => {
                let r = local.create_readable(zeroed(&[SIZE])).await.unwrap();
                let _a = v
                    .request(with_meta(req(Cmd::Read, &[SIZE], 0), r.metadata()))
                    .await
                    .unwrap();
                killed_mid_transfer(v, case, || r.status(), r.wait_for_completion()).await
            }
            "this process reads it" => {
                let (_a, m) = expose(v, Cmd::Readable, &[SIZE], 0).await;
                let r = local.begin_read(&m, zeroed(&[SIZE])).await.unwrap();
                killed_mid_transfer(v, case, || r.status(), r.wait_for_completion()).await
            }
            _ => {
                let (_a, m) = expose(v, Cmd::Writable, &[SIZE], 0).await;
                let w = local.begin_write(zeroed(&[SIZE]), &m).await.unwrap();
                killed_mid_transfer(v, case, || w.status(), w.wait_for_completion()).await
            }
        };
        if !killed {
            eprintln!(
                "{case}: the transfer ended before its peer was frozen (try {attempt}); again"
            );
            let _ = victim.kill().await;
            continue;
        }
        assert_eq!(local.exposed_count(), 0, "{case}");
        // The parts on the other streams leave their tables a moment later.
        let t = Instant::now();
        while local.pending_count() > 0 && t.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(local.pending_count(), 0, "{case}");
        return;
    }
    panic!("{case}: the transfer ended before its peer was frozen, {STRIPED_TRIES} times");
}

/// Sends signal `sig` to process `pid`.
fn signal(pid: u32, sig: i32) {
    // SAFETY: `kill` takes no pointer; `pid` is a child of this process
    // that has not been waited for, so the id is still its own.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Waits until process `pid` is stopped (state `T` in /proc).
async fn frozen(pid: u32) {
    let t = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').map(|(_, a)| a.trim_start());
        if state.is_some_and(|s| s.starts_with('T') || s.starts_with('t')) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{pid} not stopped: {stat}"
        );
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// Kills `victim` while the operation is provably under way; the operation
/// must then fail with `ConnectionLost` within 5 s. `false`: the operation
/// ended before the victim could be frozen, so no kill landed mid-transfer
/// (the caller tries again).
///
/// No fixed delay decides "mid-transfer": once the operation is in
/// progress the victim is frozen (SIGSTOP), and it must still be in
/// progress a while later. A frozen peer moves no byte, so the transfer
/// (far larger than the sockets' buffers) is stuck part-way when the
/// SIGKILL lands.
async fn killed_mid_transfer(
    victim: &mut ferry_cli::peer::PeerProcess,
    case: &str,
    status: impl Fn() -> OperationStatus,
    wait: impl std::future::Future<Output = ferry::Result<()>>,
) -> bool {
    let pid = victim.pid().expect("the peer is a child process");
    let t = Instant::now();
    while matches!(
        status(),
        OperationStatus::Uninitialized | OperationStatus::Initialized
    ) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{case}: never started"
        );
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    signal(pid, libc::SIGSTOP);
    frozen(pid).await;
    if status() != OperationStatus::InProgress {
        assert_eq!(status(), OperationStatus::Complete, "{case}");
        return false;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        status(),
        OperationStatus::InProgress,
        "{case}: the transfer went on while its peer was frozen"
    );
    victim.kill().await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .unwrap_or_else(|_| panic!("{case}: still running 5 s after the kill"))
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{case}: {err}");
    assert_eq!(status(), OperationStatus::Errored, "{case}");
    true
}
