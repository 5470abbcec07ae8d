//! One row of `ferry bench --faults`: a fresh peer process, a warm-up READ
//! (the unfaulted time), then a READ of the shape from the peer's readable
//! into this process's memory, the fault injected mid-transfer, and what
//! each side reports, what landed after the end, and the next operation.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use ferry::{Connector, Descriptor, RdmaMetadata};

use super::{Fault, Lane, Row, Run, Shape, LIVENESS_ENV};
use crate::peer::{Answers, Cmd, Event, PeerProcess, Request};

/// The byte the destination is filled with before the faulted READ.
const FILL: u8 = 0xA5;
/// How long the destination is watched after its operation ended (and the
/// faulted peer resumed or the link came back) for bytes that land late.
pub(super) const GRACE: Duration = Duration::from_millis(300);
/// The most one step that needs the peer (a warm-up, a next operation) may take.
const STEP: Duration = Duration::from_secs(10);
/// Shapes up to this many bytes are posted while the peer is held stopped
/// (they would complete before any fault could land otherwise).
const HELD_MAX: u64 = 1 << 20;
/// Tries to land a fault while a larger READ is in flight.
const TRIES: usize = 4;

/// What "mid-transfer" means for `shape`.
pub(super) fn mid_transfer(shape: &Shape) -> &'static str {
    if shape.bytes() <= HELD_MAX {
        "posted: the READ is posted while the source is held (SIGSTOP), the fault injected, then the source let go"
    } else {
        "in flight: the fault lands half the warm-up's transfer time after posting (where the READ ended first: again, twice as soon, up to 4 tries)"
    }
}

/// Sends a signal to process `pid`.
fn signal(pid: u32, sig: i32) -> anyhow::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: `kill` takes no pointer; it only sends a signal to a child
    // process of this one that has not been waited for (its pid is ours).
    let rc = unsafe { libc::kill(pid as i32, sig) };
    if rc != 0 {
        bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until process `pid` is stopped (state `T` in /proc), at most 1 s.
async fn stopped(pid: u32) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').map(|(_, a)| a.trim_start());
        if state.is_some_and(|s| s.starts_with('T') || s.starts_with('t')) {
            return;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// The destination: the shape's blocks, filled with [`FILL`].
fn destination(shape: &Shape) -> Vec<Descriptor<'static>> {
    (0..shape.blocks)
        .map(|_| Descriptor::from_vec(vec![FILL; shape.block as usize]))
        .collect()
}

/// The destination's bytes, end to end.
fn snapshot(descs: &[Descriptor<'_>]) -> Vec<u8> {
    descs
        .iter()
        .flat_map(|d| d.as_slice().unwrap_or_default().iter().copied())
        .collect()
}

/// A peer of this row, with how to start it again.
struct Peer {
    proc: PeerProcess,
    env: Vec<(&'static str, String)>,
}

impl Peer {
    async fn spawn(run: &Run, lane: Lane, listen: String, worker_id: &str) -> anyhow::Result<Peer> {
        let mut env = vec![(LIVENESS_ENV, run.bound.as_millis().to_string())];
        match lane {
            Lane::Tcp => env.push((ferry::TRANSPORTS_ENV, "tcp".into())),
            Lane::Cma => {
                env.push((ferry::TRANSPORTS_ENV, "cma,tcp".into()));
                env.push((ferry::CMA_THRESHOLD_ENV, "0".into()));
            }
            Lane::Ucx => {}
        }
        let args = vec![
            "--listen".into(),
            listen,
            "--worker-id".into(),
            worker_id.into(),
        ];
        Ok(Peer {
            proc: Self::start(run, &args, &env).await?,
            env,
        })
    }

    async fn start(
        run: &Run,
        args: &[String],
        env: &[(&'static str, String)],
    ) -> anyhow::Result<PeerProcess> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match &run.ns {
            Some(ns) => PeerProcess::spawn_in(&ns.wrapper(), &run.exe, &args, &env).await,
            None => PeerProcess::spawn(&run.exe, &args, &env).await,
        }
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.proc
            .pid()
            .ok_or_else(|| anyhow!("the peer has no pid"))
    }

    /// Exposes `sizes` holding `seed`'s pattern; the answers and metadata.
    async fn readable(
        &self,
        lane: Lane,
        sizes: Vec<u64>,
        seed: u64,
    ) -> anyhow::Result<(Answers, RdmaMetadata)> {
        let mut r = Request::new(0, Cmd::Readable);
        r.sizes = sizes;
        r.seed = seed;
        r.lane = (lane == Lane::Ucx).then(|| "ucx".into());
        let mut a = self.proc.request(r).await?;
        let m = tokio::time::timeout(STEP, a.expect("metadata"))
            .await
            .map_err(|_| anyhow!("the peer did not expose within {STEP:?}"))??;
        let m = RdmaMetadata::from_json(m.metadata.as_deref().unwrap_or_default())?;
        Ok((a, m))
    }
}

/// One READ of `sizes` with `seed`'s pattern from a fresh readable of
/// `peer`, checked: its time, or why it failed.
async fn clean_read(
    c: &Connector,
    peer: &Peer,
    lane: Lane,
    sizes: Vec<u64>,
    seed: u64,
) -> anyhow::Result<Duration> {
    let (_a, m) = peer.readable(lane, sizes.clone(), seed).await?;
    // Filled (its pages touched) as the faulted READ's destination is.
    let dest: Vec<_> = sizes
        .iter()
        .map(|&s| Descriptor::from_vec(vec![FILL; s as usize]))
        .collect();
    let t = Instant::now();
    let op = tokio::time::timeout(STEP, c.begin_read(&m, dest))
        .await
        .map_err(|_| anyhow!("begin_read did not return within {STEP:?}"))??;
    op.wait_for_completion_timeout(STEP).await?;
    let took = t.elapsed();
    let descs = tokio::task::block_in_place(|| op.into_descriptors());
    if !crate::peer::verify(&descs, seed) {
        bail!("the bytes read are not the source's");
    }
    Ok(took)
}

/// Runs one row.
pub(super) async fn run(run: &Run, fault: Fault, lane: Lane, shape: &Shape) -> Row {
    let mut row = Row::new(run, fault, lane, shape);
    if let Err(e) = measure(run, fault, lane, shape, &mut row).await {
        row.note = Some(format!("not measured: {e:#}"));
    }
    row
}

async fn measure(
    run: &Run,
    fault: Fault,
    lane: Lane,
    shape: &Shape,
    row: &mut Row,
) -> anyhow::Result<()> {
    let c = run.connector(lane);
    let ip = run.peer_ip();
    let worker_id = format!("faults-{}-{}", std::process::id(), run.next_n());
    let mut peer = Peer::spawn(run, lane, format!("{ip}:0"), &worker_id).await?;
    let sizes = vec![shape.block; shape.blocks];

    // Warm-up: the connection is made, and the unfaulted time measured.
    let warm = clean_read(c, &peer, lane, sizes.clone(), 1).await?;
    row.unfaulted_ms = Some(ms(warm));

    let (mut answers, m) = peer.readable(lane, sizes.clone(), 2).await?;
    let port = m.addresses().first().map_or(0, |a| a.port());
    let pid = peer.pid()?;
    let held = shape.bytes() <= HELD_MAX;
    let mut posted = (Instant::now(), crate::clock::monotonic_ns());
    let mut begin = None;
    let mut op_early = None;
    if held {
        signal(pid, libc::SIGSTOP)?;
        stopped(pid).await;
        posted = (Instant::now(), crate::clock::monotonic_ns());
        let mut fut = Box::pin(c.begin_read(&m, destination(shape)));
        // A READ posted to a held source may wait for it to begin; the
        // fault lands all the same after 100 ms.
        match tokio::time::timeout(Duration::from_millis(100), &mut fut).await {
            Ok(Ok(op)) => op_early = Some(op),
            Ok(Err(e)) => {
                signal(pid, libc::SIGCONT)?;
                bail!("begin_read failed before the fault: {e}");
            }
            Err(_) => begin = Some(fut),
        }
    } else {
        // Half the unfaulted time after posting; where the READ ended
        // before that, again on a fresh readable, twice as soon.
        let mut delay = warm / 2;
        let mut m = m.clone();
        for attempt in 1..=TRIES {
            posted = (Instant::now(), crate::clock::monotonic_ns());
            let op = tokio::time::timeout(STEP, c.begin_read(&m, destination(shape)))
                .await
                .map_err(|_| anyhow!("begin_read did not return within {STEP:?}"))??;
            tokio::time::sleep_until((posted.0 + delay).into()).await;
            if !op.status().is_terminal() {
                op_early = Some(op);
                break;
            }
            if attempt == TRIES {
                add_note(
                    row,
                    format!(
                        "the READ ended ({}) before the fault landed, {TRIES} times (the last {:.1} ms after posting)",
                        op.status(),
                        ms(delay)
                    ),
                );
                op_early = Some(op);
                break;
            }
            drop(op);
            let _ = tokio::time::timeout(STEP, answers.expect("done")).await;
            (answers, m) = peer.readable(lane, sizes.clone(), 2).await?;
            delay /= 2;
        }
    }

    // The fault.
    let (fault_at, fault_ns) = match fault {
        Fault::Kill | Fault::Restart => {
            signal(pid, libc::SIGKILL)?;
            (Instant::now(), crate::clock::monotonic_ns())
        }
        Fault::Stop if held => posted,
        Fault::Stop => {
            signal(pid, libc::SIGSTOP)?;
            (Instant::now(), crate::clock::monotonic_ns())
        }
        Fault::Cut => {
            let ns = run.ns.as_ref().ok_or_else(|| anyhow!("no link to cut"))?;
            ns.cut().map_err(|e| anyhow!(e))?;
            let at = (Instant::now(), crate::clock::monotonic_ns());
            if held {
                signal(pid, libc::SIGCONT)?;
            }
            at
        }
        Fault::ControlRestart => bail!("no control-plane server in this bench"),
    };
    let deadline = fault_at + run.timeout;

    // The survivor: this process's READ, until its final state or the timeout.
    let restart = async {
        if fault == Fault::Restart {
            let _ = peer.proc.kill().await;
            let args = vec![
                "--listen".to_string(),
                format!("{ip}:{port}"),
                "--worker-id".into(),
                worker_id.clone(),
            ];
            Some(Peer::start(run, &args, &peer.env).await)
        } else {
            None
        }
    };
    let survive = async {
        let op = match (op_early.take(), begin.as_mut()) {
            (Some(op), _) => op,
            (None, Some(begin)) => match tokio::time::timeout_at(deadline.into(), begin).await {
                Ok(Ok(op)) => op,
                Ok(Err(e)) => return Err((Instant::now(), e.to_string())),
                Err(_) => return Err((Instant::now(), "begin_read did not return".to_string())),
            },
            (None, None) => return Err((Instant::now(), "no READ was posted".to_string())),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let res = op.wait_for_completion_timeout(left).await;
        Ok((op, res, Instant::now()))
    };
    let (survived, restarted) = tokio::join!(survive, restart);
    drop(begin);
    let op = match survived {
        Err((at, why)) => {
            row.survivor_state = Some("NOT_STARTED".into());
            row.survivor_cause = Some(why);
            row.survivor_ms = Some(ms(at - fault_at));
            row.detected = at < deadline;
            None
        }
        Ok((op, res, at)) => {
            match res {
                Err(ferry::Error::Timeout(_)) if !op.status().is_terminal() => {
                    row.detected = false;
                    let before = op.status();
                    op.cancel();
                    row.survivor_state = Some(op.status().to_string());
                    if !op.status().is_terminal() {
                        add_note(
                            row,
                            format!("cancel returned with the READ still {}", op.status()),
                        );
                    }
                    row.survivor_cause = Some(format!(
                        "not detected within {:.1} s ({before} until then); cancelled by the bench",
                        run.timeout.as_secs_f64()
                    ));
                }
                res => {
                    row.detected = true;
                    row.survivor_ms = Some(ms(at - fault_at));
                    row.survivor_state = Some(op.status().to_string());
                    row.survivor_cause = res.err().map(|e| e.to_string());
                }
            }
            Some(op)
        }
    };
    row.carried_by = op
        .as_ref()
        .and_then(|o| o.transport())
        .map(|t| t.name().to_string());
    // `descriptors` waits (up to 1 s) for a copy still in flight.
    let at_end = op
        .as_ref()
        .and_then(|o| tokio::task::block_in_place(|| o.descriptors().map(snapshot)));
    match &at_end {
        Some(b) => row.landed_before_end = Some(b.iter().filter(|&&x| x != FILL).count() as u64),
        None => {
            if let Some(o) = &op {
                let why = if o.status().is_terminal() {
                    format!("{}, a copy into it still in flight", o.status())
                } else {
                    format!(
                        "{}: not final, the memory stays the operation's",
                        o.status()
                    )
                };
                add_note(
                    row,
                    format!("the READ's memory not released within 1 s of its end ({why})"),
                );
            }
        }
    }

    // The faulted side's view, and the peer brought back.
    match fault {
        Fault::Kill | Fault::Restart => {}
        Fault::Stop | Fault::Cut => {
            if fault == Fault::Stop {
                signal(pid, libc::SIGCONT)?;
            } else if let Some(ns) = &run.ns {
                // Until the survivor's deadline, the peer may see the cut
                // on its own; then the link comes back.
                let left = deadline.saturating_duration_since(Instant::now());
                if let Ok(ev) = tokio::time::timeout(left, answers.expect("done")).await {
                    faulted_view(row, ev.ok(), fault_ns);
                }
                ns.restore().map_err(|e| anyhow!(e))?;
            }
            if row.faulted_state.is_none() {
                let wait = run.bound + Duration::from_secs(1);
                let ev = tokio::time::timeout(wait, answers.expect("done")).await;
                match ev {
                    Ok(ev) => faulted_view(row, ev.ok(), fault_ns),
                    Err(_) => {
                        row.faulted_state = Some("IN_PROGRESS".into());
                        row.faulted_cause = Some(format!(
                            "no final state within {:.1} s of being let go",
                            wait.as_secs_f64()
                        ));
                    }
                }
            }
        }
        Fault::ControlRestart => {}
    }
    tokio::time::sleep(GRACE).await;
    if let (Some(before), Some(op)) = (&at_end, &op) {
        if let Some(now) = op.descriptors().map(snapshot) {
            let changed = before.iter().zip(&now).filter(|(a, b)| a != b).count();
            row.landed_after_end = Some(changed as u64);
        }
    } else if let Some(op) = &op {
        let _ = op.wait_for_completion_timeout(STEP).await;
        let released = tokio::task::block_in_place(|| op.descriptors().is_some());
        add_note(
            row,
            format!(
                "once the peer was let go: {}, memory {}; the bytes after the end are not measurable",
                op.status(),
                if released { "released" } else { "still held" }
            ),
        );
    }
    drop(op);

    // The next operation to the peer (resumed, reconnected or restarted).
    let next = match fault {
        Fault::Kill | Fault::ControlRestart => None,
        Fault::Restart => match restarted {
            Some(Ok(p)) => {
                peer.proc = p;
                Some(&peer)
            }
            Some(Err(e)) => {
                row.next_op = Some(format!("the peer did not restart: {e:#}"));
                None
            }
            None => None,
        },
        Fault::Stop | Fault::Cut => Some(&peer),
    };
    if let Some(p) = next {
        row.next_op = Some(match clean_read(c, p, lane, vec![4096], 3).await {
            Ok(t) => format!("ok ({:.1} ms)", ms(t)),
            Err(e) => format!("failed: {e:#}"),
        });
    }
    let _ = peer.proc.kill().await;
    Ok(())
}

/// Adds `what` to the row's note.
fn add_note(row: &mut Row, what: String) {
    row.note = Some(match row.note.take() {
        Some(n) => format!("{n}; {what}"),
        None => what,
    });
}

/// Records the faulted peer's `done` (its time on the shared clock).
fn faulted_view(row: &mut Row, ev: Option<Event>, fault_ns: u64) {
    let Some(ev) = ev else {
        row.faulted_state = Some("—".into());
        row.faulted_cause = Some("the peer exited without answering".into());
        return;
    };
    row.faulted_ms = ev.done_ns.map(|d| d.saturating_sub(fault_ns) as f64 / 1e6);
    row.faulted_state = ev.status;
    row.faulted_cause = ev.error;
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
