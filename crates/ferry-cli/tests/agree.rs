//! Both sides of a transfer agree, whatever the passive side does right
//! after its completion: its process exits at once (`_exit`, as Python's
//! `os._exit`), exits normally, or drops its connector. Real workers do
//! exactly this (an encode worker that exits after its last request).
//!
//! Each transfer of the exit cases is served by a fresh `ferry peer`
//! process that ends itself the moment its operation ends, its exit code
//! saying whether that was COMPLETE; the active side is this process. In
//! the drop cases the passive side is a fresh connector of this process,
//! dropped the moment its operation ends, and the active side a `ferry
//! peer` process (or, over the in-process transport, another connector of
//! this process). Both directions: a READABLE read, a WRITABLE written.
//! Every transport between two processes (TCP, TCP striped over four
//! streams, cross-memory attach, UCX where it loads), and the in-process
//! transport for the drop case.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry::{Connector, RdmaMetadata, TransportKind};
use ferry_cli::peer::{self, After, Cmd, PeerProcess, EXIT_COMPLETE};
use tokio::task::JoinSet;
use tokio::time::timeout;

/// How the passive side ends right after its operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Its process exits at once (`_exit`).
    Exit,
    /// Its process exits normally.
    Quit,
    /// It drops its connector.
    Drop,
}

/// What the active side does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Reads a READABLE.
    Read,
    /// Writes a WRITABLE.
    Write,
}

/// The sizes transfers cycle through: one byte, a page, and a transfer of
/// two descriptors.
const SIZES: [&[u64]; 3] = [&[1], &[4096], &[100_000, 3]];

/// A lane: a transport between two processes (or, for `Local`, within
/// this one) and the streams a TCP transfer is split over.
type Lane = (TransportKind, usize);

fn lanes() -> Vec<Lane> {
    with_ucx(vec![
        (TransportKind::Tcp, 1),
        (TransportKind::Tcp, 4),
        (TransportKind::Cma, 1),
    ])
}

/// A connector of this process for `lane`.
async fn connector_for((t, streams): Lane) -> Connector {
    match t {
        TransportKind::Local => Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .transports(&[TransportKind::Local, TransportKind::Tcp])
            .build()
            .await
            .unwrap(),
        _ if streams > 1 => connector_striped(streams).await,
        t => connector_over(&lane_transports(t)).await,
    }
}

/// A peer process for `lane`.
async fn peer_for((t, streams): Lane) -> PeerProcess {
    peer_striped(&lane_transports(t), streams, &[]).await
}

/// How one transfer ended on each side: COMPLETE or why not.
#[derive(Debug)]
struct Outcome {
    passive: Result<(), String>,
    active: Result<(), String>,
}

/// How long one side may take (a transfer of at most 100 KB between two
/// processes of this host takes milliseconds).
const LIMIT: Duration = Duration::from_secs(20);

fn meta_of(ev: &peer::Event) -> RdmaMetadata {
    RdmaMetadata::from_json(ev.metadata.as_deref().expect("metadata")).expect("metadata parses")
}

/// One transfer whose passive side is a fresh peer process that ends as
/// `after` says the moment its operation ends; this process is active.
async fn exit_after(local: &Connector, lane: Lane, dir: Dir, after: After, n: u64) -> Outcome {
    let sizes = SIZES[n as usize % SIZES.len()];
    let mut p = peer_for(lane).await;
    let cmd = match dir {
        Dir::Read => Cmd::Readable,
        Dir::Write => Cmd::Writable,
    };
    let mut r = req(cmd, sizes, n);
    r.after = Some(after);
    let mut a = p.request(r).await.unwrap();
    let meta = meta_of(&a.expect("metadata").await.unwrap());
    let active = match dir {
        Dir::Read => {
            let op = local.begin_read(&meta, zeroed(sizes)).await.unwrap();
            match timeout(LIMIT, op.wait_for_completion()).await {
                Err(_) => Err(format!("no end within the limit ({})", op.status())),
                Ok(Err(e)) => Err(format!("{e:?}: {e}")),
                Ok(Ok(())) if !peer::verify(&op.into_descriptors(), n) => {
                    Err("COMPLETE with other bytes".to_string())
                }
                Ok(Ok(())) => Ok(()),
            }
        }
        Dir::Write => {
            let op = local.begin_write(filled(sizes, n), &meta).await.unwrap();
            match timeout(LIMIT, op.wait_for_completion()).await {
                Err(_) => Err(format!("no end within the limit ({})", op.status())),
                Ok(Err(e)) => Err(format!("{e:?}: {e}")),
                Ok(Ok(())) => Ok(()),
            }
        }
    };
    let passive = match timeout(LIMIT, p.exit_code()).await {
        Err(_) => Err("the passive process did not exit".to_string()),
        Ok(Ok(Some(EXIT_COMPLETE))) => Ok(()),
        Ok(code) => Err(format!("the passive process exited with {code:?}")),
    };
    Outcome { passive, active }
}

/// One transfer whose passive side is a fresh connector of this process,
/// dropped the moment its operation ends; the active side is the peer
/// process `p` (or, with `Local`, the connector `local`).
async fn drop_after(
    local: &Connector,
    p: Option<&PeerProcess>,
    lane: Lane,
    dir: Dir,
    n: u64,
) -> Outcome {
    let sizes = SIZES[n as usize % SIZES.len()];
    let passive = connector_for(lane).await;
    let (op, meta): (Box<dyn ferry::Operation<'static>>, RdmaMetadata) = match dir {
        Dir::Read => {
            let op = passive.create_readable(filled(sizes, n)).await.unwrap();
            let m = op.metadata().clone();
            (Box::new(op), m)
        }
        Dir::Write => {
            let op = passive.create_writable(zeroed(sizes)).await.unwrap();
            let m = op.metadata().clone();
            (Box::new(op), m)
        }
    };
    let active = async {
        match p {
            Some(p) => {
                let cmd = match dir {
                    Dir::Read => Cmd::Read,
                    Dir::Write => Cmd::Write,
                };
                let mut a = p
                    .request(with_meta(req(cmd, sizes, n), &meta))
                    .await
                    .unwrap();
                let ev = timeout(LIMIT, a.expect("done")).await;
                match ev {
                    Err(_) => Err("no end within the limit".to_string()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Ok(Ok(ev)) if ev.status.as_deref() == Some("COMPLETE") => {
                        if dir == Dir::Read && ev.verified != Some(true) {
                            Err(format!("COMPLETE with other bytes: {ev:?}"))
                        } else {
                            Ok(())
                        }
                    }
                    Ok(Ok(ev)) => Err(format!("{:?}: {:?}", ev.status, ev.error)),
                }
            }
            None => {
                let r = match dir {
                    Dir::Read => {
                        let op = local.begin_read(&meta, zeroed(sizes)).await.unwrap();
                        let r = timeout(LIMIT, op.wait_for_completion()).await;
                        match r {
                            Ok(Ok(())) if !peer::verify(&op.into_descriptors(), n) => {
                                return Err("COMPLETE with other bytes".to_string())
                            }
                            r => r,
                        }
                    }
                    Dir::Write => {
                        let op = local.begin_write(filled(sizes, n), &meta).await.unwrap();
                        timeout(LIMIT, op.wait_for_completion()).await
                    }
                };
                match r {
                    Err(_) => Err("no end within the limit".to_string()),
                    Ok(Err(e)) => Err(format!("{e:?}: {e}")),
                    Ok(Ok(())) => Ok(()),
                }
            }
        }
    };
    let passive_end = async {
        let r = timeout(LIMIT, op.wait_for_completion()).await;
        // Dropped the moment its operation ended.
        drop(passive);
        match r {
            Err(_) => Err("no end within the limit".to_string()),
            Ok(Err(e)) => Err(format!("{e:?}: {e}")),
            Ok(Ok(())) => Ok(()),
        }
    };
    let (active, passive) = tokio::join!(active, passive_end);
    if dir == Dir::Write && passive.is_ok() {
        assert!(
            peer::verify(&op.into_descriptors(), n),
            "a writable COMPLETE with other bytes"
        );
    }
    Outcome { passive, active }
}

/// What `count` transfers of each case over `lane` came to.
#[derive(Debug, Default)]
struct Tally {
    transfers: usize,
    both_complete: usize,
    /// One side COMPLETE, the other not.
    disagreements: Vec<String>,
    /// Neither side COMPLETE.
    both_failed: Vec<String>,
}

impl Tally {
    fn add(&mut self, what: String, o: Outcome) {
        self.transfers += 1;
        match (&o.passive, &o.active) {
            (Ok(()), Ok(())) => self.both_complete += 1,
            (Err(_), Err(_)) => self.both_failed.push(format!("{what}: {o:?}")),
            _ => self.disagreements.push(format!("{what}: {o:?}")),
        }
    }
}

/// Runs `per_case` transfers of each case (each end, each direction) over
/// `lane`, at most `parallel` at a time, and returns the tally.
async fn run_lane(lane: Lane, per_case: u64, parallel: usize) -> Tally {
    let cases: Vec<(End, Dir)> = if lane.0 == TransportKind::Local {
        vec![(End::Drop, Dir::Read), (End::Drop, Dir::Write)]
    } else {
        [End::Exit, End::Quit, End::Drop]
            .into_iter()
            .flat_map(|e| [(e, Dir::Read), (e, Dir::Write)])
            .collect()
    };
    let local = Arc::new(connector_for(lane).await);
    // The active peer processes of the drop cases, one per parallel lane
    // of work (the exit cases start their own).
    let mut actives = Vec::new();
    if lane.0 != TransportKind::Local {
        for _ in 0..parallel {
            actives.push(Arc::new(peer_for(lane).await));
        }
    }
    let mut work: Vec<(End, Dir, u64)> = Vec::new();
    for n in 0..per_case {
        for &(e, d) in &cases {
            work.push((e, d, n));
        }
    }
    let mut tally = Tally::default();
    let mut set = JoinSet::new();
    let mut next = 0usize;
    loop {
        while set.len() < parallel && next < work.len() {
            let (end, dir, n) = work[next];
            let local = local.clone();
            let active = actives.get(next % parallel.max(1)).cloned();
            next += 1;
            set.spawn(async move {
                let o = match end {
                    End::Exit => exit_after(&local, lane, dir, After::Exit, n).await,
                    End::Quit => exit_after(&local, lane, dir, After::Quit, n).await,
                    End::Drop => drop_after(&local, active.as_deref(), lane, dir, n).await,
                };
                (format!("{lane:?} {end:?} {dir:?} #{n}"), o)
            });
        }
        match set.join_next().await {
            Some(r) => {
                let (what, o) = r.expect("a transfer task panicked");
                tally.add(what, o);
            }
            None => break,
        }
    }
    tally
}

/// Runs every lane and asserts that no transfer ended COMPLETE on one side
/// only, and that all but a few (at most one per lane, or 1 in 200)
/// completed on both: nothing may fail for the passive side's going away.
///
/// The few that may fail on both sides: a striped TCP transfer between
/// two fresh processes very rarely stalls with both sides alive (about 1
/// in 5,000 striped transfers, on the code before and after this fix; both
/// sides then end when the reader gives up, CANCELLED, and agree). That is
/// another fault, counted and printed here, not hidden.
async fn all_lanes_agree(per_case: u64, parallel: usize) {
    let mut lanes = lanes();
    lanes.push((TransportKind::Local, 1));
    let mut bad = Vec::new();
    for lane in lanes {
        let t = run_lane(lane, per_case, parallel).await;
        eprintln!(
            "{lane:?}: {} transfers, {} COMPLETE on both sides, {} disagreements, {} failed on both",
            t.transfers,
            t.both_complete,
            t.disagreements.len(),
            t.both_failed.len()
        );
        for d in &t.both_failed {
            eprintln!("failed on both sides: {d}");
        }
        bad.extend(t.disagreements.iter().map(|d| format!("disagreement: {d}")));
        if t.both_failed.len() > (t.transfers / 200).max(1) {
            bad.extend(
                t.both_failed
                    .iter()
                    .map(|d| format!("failed on both sides: {d}")),
            );
        }
    }
    assert!(
        bad.is_empty(),
        "{} transfers went wrong:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Over every transport, each case (exit at once, exit normally, drop the
/// connector; READ and WRITE) 16 times: 96 transfers per transport between
/// two processes, 32 over the in-process one (a few seconds). Before the
/// fix, about 2 in 100 disagreed (striped TCP and cross-memory attach).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_agree_when_the_passive_side_goes_away_at_once() {
    all_lanes_agree(16, 4).await;
}

/// The same, 1,002 transfers per transport between two processes (167 of
/// each case), 334 over the in-process one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "stress: minutes on a small machine"]
async fn stress_both_sides_agree_when_the_passive_side_goes_away_at_once() {
    all_lanes_agree(167, 4).await;
}
