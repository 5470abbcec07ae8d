//! One row of `ferry bench --faults`: a fresh peer process, a warm-up READ
//! (the unfaulted time), then a READ of the shape from the peer's readable
//! into this process's memory, the fault injected mid-transfer, and what
//! each side reports, what landed after the end, and the next operation.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use ferry::{Connector, Descriptor, RdmaMetadata, ReadOperation};

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
    lane: Lane,
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
            lane,
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
        sizes: Vec<u64>,
        seed: u64,
    ) -> anyhow::Result<(Answers, RdmaMetadata)> {
        let mut r = Request::new(0, Cmd::Readable);
        r.sizes = sizes;
        r.seed = seed;
        r.lane = (self.lane == Lane::Ucx).then(|| "ucx".into());
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
    sizes: Vec<u64>,
    seed: u64,
) -> anyhow::Result<Duration> {
    let (_a, m) = peer.readable(sizes.clone(), seed).await?;
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

/// A point in time on both clocks: this process's, and the one both
/// processes share (for the peer's `done_ns`).
type At = (Instant, u64);

fn now() -> At {
    (Instant::now(), crate::clock::monotonic_ns())
}

/// A READ that may still be on its way to being posted.
type Begin<'a> = Pin<Box<dyn Future<Output = ferry::Result<ReadOperation<'static>>> + Send + 'a>>;

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
    let warm = clean_read(c, &peer, sizes.clone(), 1).await?;
    row.unfaulted_ms = Some(ms(warm));

    let (mut answers, m) = peer.readable(sizes, 2).await?;
    let port = m.addresses().first().map_or(0, |a| a.port());
    let pid = peer.pid()?;
    let held = shape.bytes() <= HELD_MAX;
    let (op, begin, posted) = if held {
        post_held(c, &m, shape, pid).await?
    } else {
        let (op, posted) =
            post_in_flight(c, &peer, shape, warm, m.clone(), &mut answers, row).await?;
        (Some(op), None, posted)
    };
    let (fault_at, fault_ns) = inject(run, fault, pid, held, posted)?;
    let deadline = fault_at + run.timeout;

    // The survivor's READ until its final state or the timeout, while a
    // restarted peer starts again with the same worker id and port.
    let restart = async {
        if fault != Fault::Restart {
            return None;
        }
        let _ = peer.proc.kill().await;
        let args = [
            "--listen".to_string(),
            format!("{ip}:{port}"),
            "--worker-id".into(),
            worker_id.clone(),
        ];
        Some(Peer::start(run, &args, &peer.env).await)
    };
    let (survived, restarted) = tokio::join!(survive(op, begin, deadline), restart);
    let op = survivor_view(row, run, survived, fault_at, deadline);
    let at_end = at_end(row, op.as_ref());

    // The faulted side's view, with the peer let go or the link restored.
    if matches!(fault, Fault::Stop | Fault::Cut) {
        faulted_side(row, run, fault, pid, &mut answers, deadline, fault_ns).await?;
    }
    tokio::time::sleep(GRACE).await;
    after_end(row, op.as_ref(), at_end).await;
    drop(op);

    // The next operation to the peer (resumed, reconnected or restarted).
    let next = match (fault, restarted) {
        (Fault::Restart, Some(Ok(p))) => {
            peer.proc = p;
            Some(&peer)
        }
        (Fault::Restart, Some(Err(e))) => {
            row.next_op = Some(format!("the peer did not restart: {e:#}"));
            None
        }
        (Fault::Stop | Fault::Cut, _) => Some(&peer),
        _ => None,
    };
    if let Some(p) = next {
        row.next_op = Some(match clean_read(c, p, vec![4096], 3).await {
            Ok(t) => format!("ok ({:.1} ms)", ms(t)),
            Err(e) => format!("failed: {e:#}"),
        });
    }
    let _ = peer.proc.kill().await;
    Ok(())
}

/// Posts the READ while the source is held stopped: the operation, or the
/// READ still being posted after 100 ms (it may wait for the source), and
/// when it was posted.
async fn post_held<'a>(
    c: &'a Connector,
    m: &'a RdmaMetadata,
    shape: &Shape,
    pid: u32,
) -> anyhow::Result<(Option<ReadOperation<'static>>, Option<Begin<'a>>, At)> {
    signal(pid, libc::SIGSTOP)?;
    stopped(pid).await;
    let posted = now();
    let mut begin: Begin<'a> = Box::pin(c.begin_read(m, destination(shape)));
    match tokio::time::timeout(Duration::from_millis(100), &mut begin).await {
        Ok(Ok(op)) => Ok((Some(op), None, posted)),
        Ok(Err(e)) => {
            signal(pid, libc::SIGCONT)?;
            bail!("begin_read failed before the fault: {e}")
        }
        Err(_) => Ok((None, Some(begin), posted)),
    }
}

/// Posts the READ and waits half the unfaulted time; where it ended
/// first, again on a fresh readable, twice as soon (up to [`TRIES`]).
async fn post_in_flight(
    c: &Connector,
    peer: &Peer,
    shape: &Shape,
    warm: Duration,
    first: RdmaMetadata,
    answers: &mut Answers,
    row: &mut Row,
) -> anyhow::Result<(ReadOperation<'static>, At)> {
    let mut delay = warm / 2;
    let mut m = first;
    let mut attempt = 1;
    loop {
        let posted = now();
        let op = tokio::time::timeout(STEP, c.begin_read(&m, destination(shape)))
            .await
            .map_err(|_| anyhow!("begin_read did not return within {STEP:?}"))??;
        tokio::time::sleep_until((posted.0 + delay).into()).await;
        if !op.status().is_terminal() {
            return Ok((op, posted));
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
            return Ok((op, posted));
        }
        drop(op);
        let _ = tokio::time::timeout(STEP, answers.expect("done")).await;
        (*answers, m) = peer.readable(vec![shape.block; shape.blocks], 2).await?;
        delay /= 2;
        attempt += 1;
    }
}

/// Injects `fault` into process `pid`: when it landed. A stop of a held
/// source landed when the READ was posted to it.
fn inject(run: &Run, fault: Fault, pid: u32, held: bool, posted: At) -> anyhow::Result<At> {
    Ok(match fault {
        Fault::Kill | Fault::Restart => {
            signal(pid, libc::SIGKILL)?;
            now()
        }
        Fault::Stop if held => posted,
        Fault::Stop => {
            signal(pid, libc::SIGSTOP)?;
            now()
        }
        Fault::Cut => {
            let ns = run.ns.as_ref().ok_or_else(|| anyhow!("no link to cut"))?;
            ns.cut().map_err(|e| anyhow!(e))?;
            let at = now();
            if held {
                signal(pid, libc::SIGCONT)?;
            }
            at
        }
        Fault::ControlRestart => bail!("no control-plane server in this bench"),
    })
}

/// What the survivor's READ came to by `deadline`: the operation, its
/// result and when; or why it was never posted, and when that was known.
type Survived = Result<(ReadOperation<'static>, ferry::Result<()>, Instant), (Instant, String)>;

/// Waits for the survivor's READ (or for it to be posted) until `deadline`.
async fn survive(
    op: Option<ReadOperation<'static>>,
    begin: Option<Begin<'_>>,
    deadline: Instant,
) -> Survived {
    let op = match (op, begin) {
        (Some(op), _) => op,
        (None, Some(begin)) => match tokio::time::timeout_at(deadline.into(), begin).await {
            Ok(Ok(op)) => op,
            Ok(Err(e)) => return Err((Instant::now(), e.to_string())),
            Err(_) => return Err((Instant::now(), "begin_read did not return".into())),
        },
        (None, None) => return Err((Instant::now(), "no READ was posted".into())),
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let res = op.wait_for_completion_timeout(left).await;
    Ok((op, res, Instant::now()))
}

/// Records the survivor's final state, cause and time; cancels a READ
/// that did not end by its deadline.
fn survivor_view(
    row: &mut Row,
    run: &Run,
    survived: Survived,
    fault_at: Instant,
    deadline: Instant,
) -> Option<ReadOperation<'static>> {
    let (op, res, at) = match survived {
        Err((at, why)) => {
            row.survivor_state = Some("NOT_STARTED".into());
            row.survivor_cause = Some(why);
            row.survivor_ms = Some(ms(at - fault_at));
            row.detected = at < deadline;
            return None;
        }
        Ok(s) => s,
    };
    match res {
        Err(ferry::Error::Timeout(_)) if !op.status().is_terminal() => {
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
    row.carried_by = op.transport().map(|t| t.name().to_string());
    Some(op)
}

/// The destination's bytes when the survivor's READ ended, where its
/// memory was released (`descriptors` waits up to 1 s for a copy still
/// in flight); else the row says why not.
fn at_end(row: &mut Row, op: Option<&ReadOperation<'static>>) -> Option<Vec<u8>> {
    let op = op?;
    let bytes = tokio::task::block_in_place(|| op.descriptors().map(snapshot));
    match &bytes {
        Some(b) => row.landed_before_end = Some(b.iter().filter(|&&x| x != FILL).count() as u64),
        None => {
            let why = if op.status().is_terminal() {
                format!("{}, a copy into it still in flight", op.status())
            } else {
                format!(
                    "{}: not final, the memory stays the operation's",
                    op.status()
                )
            };
            add_note(
                row,
                format!("the READ's memory not released within 1 s of its end ({why})"),
            );
        }
    }
    bytes
}

/// The faulted peer's view of a stop or a cut: a stopped peer is let go
/// (SIGCONT) and answers; a cut one may answer before the deadline, then
/// the link comes back.
async fn faulted_side(
    row: &mut Row,
    run: &Run,
    fault: Fault,
    pid: u32,
    answers: &mut Answers,
    deadline: Instant,
    fault_ns: u64,
) -> anyhow::Result<()> {
    if fault == Fault::Stop {
        signal(pid, libc::SIGCONT)?;
    } else if let Some(ns) = &run.ns {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Ok(ev) = tokio::time::timeout(left, answers.expect("done")).await {
            faulted_view(row, ev.ok(), fault_ns);
        }
        ns.restore().map_err(|e| anyhow!(e))?;
    }
    if row.faulted_state.is_none() {
        let wait = run.bound + Duration::from_secs(1);
        match tokio::time::timeout(wait, answers.expect("done")).await {
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
    Ok(())
}

/// Counts the destination bytes that changed since `at_end`; where the
/// memory was not released at the end, says what became of the READ.
async fn after_end(row: &mut Row, op: Option<&ReadOperation<'static>>, at_end: Option<Vec<u8>>) {
    let Some(op) = op else { return };
    match at_end {
        Some(before) => {
            let now = tokio::task::block_in_place(|| op.descriptors().map(snapshot));
            if let Some(now) = now {
                let changed = before.iter().zip(&now).filter(|(a, b)| a != b).count();
                row.landed_after_end = Some(changed as u64);
            }
        }
        None => {
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
    }
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
