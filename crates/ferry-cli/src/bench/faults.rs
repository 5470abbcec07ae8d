//! `ferry bench --faults`: failure as a measured figure. For each fault —
//! the peer killed (SIGKILL), stopped (SIGSTOP) for longer than the
//! liveness bound, the link cut, the peer restarted with the same worker
//! id, the control plane's server restarted — injected mid-transfer at
//! 4 KiB, 64 MiB and a KV shape, over each lane, between two processes and
//! (as root, with `ip netns`) between two network namespaces:
//!
//! - each side's time from the fault to its operation's final state, that
//!   state and its cause (this process, the *survivor*, reads from the
//!   *faulted* peer's readable; a killed peer reports nothing, "—"; a
//!   stopped one is let go (SIGCONT) after the survivor's measurement and
//!   answers then, its time counted from the fault);
//! - the bytes that landed in the survivor's memory after its operation
//!   ended (or after the bench cancelled it at the timeout): must be 0;
//! - whether the next operation to the resumed, reconnected or restarted
//!   peer succeeds.
//!
//! Every fault has a timeout (the bound plus a slack): a fault not detected
//! by then is reported so, and the operation cancelled; nothing waits longer.
//! The bound is `FERRY_LIVENESS_MS`, set in both processes (this one starts
//! itself again with it when its environment differs).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context;
use ferry::{Connector, TransportKind};
use serde::Serialize;

use super::human;

mod hosts;
mod trial;

/// The liveness bound in milliseconds, read by the library's configuration
/// where it has liveness heartbeats (0: off).
pub const LIVENESS_ENV: &str = "FERRY_LIVENESS_MS";

/// A fault injected into the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL.
    Kill,
    /// SIGSTOP, for longer than the bound (until the survivor's timeout).
    Stop,
    /// The link between the two hosts cut (namespaces only).
    Cut,
    /// SIGKILL, and the peer started again with the same worker id and port.
    Restart,
    /// The control plane's server restarted.
    ControlRestart,
}

impl Fault {
    /// Its name in the rows.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Cut => "cut",
            Fault::Restart => "restart",
            Fault::ControlRestart => "control_restart",
        }
    }
}

/// A lane: which transport carries the READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// TCP only.
    Tcp,
    /// Cross-memory attach for every size.
    Cma,
    /// UCX for every size (where libucp loads in both processes).
    Ucx,
}

impl Lane {
    fn name(self) -> &'static str {
        match self {
            Lane::Tcp => "tcp",
            Lane::Cma => "cma",
            Lane::Ucx => "ucx",
        }
    }
}

/// A transfer's shape: `blocks` descriptors of `block` bytes.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Its name in the rows.
    pub name: String,
    /// Bytes per descriptor.
    pub block: u64,
    /// Descriptors.
    pub blocks: usize,
}

impl Shape {
    fn plain(bytes: u64) -> Shape {
        Shape {
            name: human(bytes).replace(' ', ""),
            block: bytes,
            blocks: 1,
        }
    }

    /// The KV shape: 2,048 blocks of 32 KiB (`kv-vllm`'s block, 64 MiB).
    fn kv() -> Shape {
        Shape {
            name: "kv 2048x32KiB".into(),
            block: 32 << 10,
            blocks: 2048,
        }
    }

    fn bytes(&self) -> u64 {
        self.block * self.blocks as u64
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The liveness bound.
    pub bound: Duration,
    /// Added to the bound: how long each fault is given.
    pub slack: Duration,
    /// Faults to inject.
    pub faults: Vec<Fault>,
    /// Lanes to run (each where it is available).
    pub lanes: Vec<Lane>,
    /// Shapes.
    pub shapes: Vec<Shape>,
    /// Also between two network namespaces (where this process may make them).
    pub namespaces: bool,
    /// Write JSON lines here (`-` for stdout).
    pub json: Option<PathBuf>,
}

impl Options {
    /// Every fault, shape and lane, between processes and namespaces.
    pub fn full(bound: Duration) -> Self {
        Options {
            bound,
            slack: Duration::from_secs(5),
            faults: vec![
                Fault::Kill,
                Fault::Stop,
                Fault::Cut,
                Fault::Restart,
                Fault::ControlRestart,
            ],
            lanes: vec![Lane::Tcp, Lane::Cma, Lane::Ucx],
            shapes: vec![Shape::plain(4 << 10), Shape::plain(64 << 20), Shape::kv()],
            namespaces: true,
            json: None,
        }
    }

    /// For CI: 4 KiB, tcp and cma, kill and stop, between two processes.
    pub fn quick(bound: Duration) -> Self {
        Options {
            slack: Duration::from_secs(2),
            faults: vec![Fault::Kill, Fault::Stop],
            lanes: vec![Lane::Tcp, Lane::Cma],
            shapes: vec![Shape::plain(4 << 10)],
            namespaces: false,
            ..Options::full(bound)
        }
    }
}

/// One row: one fault, lane and shape.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `kill`, `stop`, `cut`, `restart` or `control_restart`.
    pub fault: String,
    /// `processes` (two processes of this host) or `namespaces`.
    pub hosts: String,
    /// The lane asked for (`tcp`, `cma`, `ucx`).
    pub transport: String,
    /// The transport that carried the faulted READ, once known.
    pub carried_by: Option<String>,
    /// The shape's name.
    pub shape: String,
    /// Bytes of the transfer.
    pub bytes: u64,
    /// Descriptors of the transfer.
    pub blocks: usize,
    /// Whether the fault applies here (else `note` says why not).
    pub applicable: bool,
    /// What "mid-transfer" means for this shape.
    pub mid_transfer: String,
    /// The liveness bound, ms.
    pub bound_ms: u64,
    /// How long the fault was given, ms.
    pub timeout_ms: u64,
    /// The target for the survivor's time, ms (kill: 100; stop and cut:
    /// the bound + 100).
    pub target_ms: Option<u64>,
    /// The warm-up READ's time (the same shape, unfaulted), ms.
    pub unfaulted_ms: Option<f64>,
    /// Whether the survivor's operation reached a final state in time.
    pub detected: bool,
    /// Ms from the fault to the survivor's final state.
    pub survivor_ms: Option<f64>,
    /// The survivor's final state.
    pub survivor_state: Option<String>,
    /// Its cause (the error's Display).
    pub survivor_cause: Option<String>,
    /// Ms from the fault to the faulted side's final state (its clock is
    /// this host's; `None`: it reports nothing, or did not end).
    pub faulted_ms: Option<f64>,
    /// The faulted side's final state (`None`: killed, it reports nothing).
    pub faulted_state: Option<String>,
    /// Its cause.
    pub faulted_cause: Option<String>,
    /// Destination bytes that differ from the fill when the survivor's
    /// operation ended.
    pub landed_before_end: Option<u64>,
    /// Destination bytes that changed after the survivor's operation ended
    /// or was cancelled (must be 0).
    pub landed_after_end: Option<u64>,
    /// The next operation to the peer: `ok (…)` or `failed: …`.
    pub next_op: Option<String>,
    /// Anything else the row needs to say.
    pub note: Option<String>,
}

impl Row {
    fn new(run: &Run, fault: Fault, lane: Lane, shape: &Shape) -> Row {
        let bound = run.bound.as_millis() as u64;
        Row {
            fault: fault.name().into(),
            hosts: run.hosts().into(),
            transport: lane.name().into(),
            carried_by: None,
            shape: shape.name.clone(),
            bytes: shape.bytes(),
            blocks: shape.blocks,
            applicable: true,
            mid_transfer: trial::mid_transfer(shape).into(),
            bound_ms: bound,
            timeout_ms: run.timeout.as_millis() as u64,
            target_ms: match fault {
                Fault::Kill | Fault::Restart => Some(100),
                Fault::Stop | Fault::Cut => Some(bound + 100),
                Fault::ControlRestart => None,
            },
            unfaulted_ms: None,
            detected: false,
            survivor_ms: None,
            survivor_state: None,
            survivor_cause: None,
            faulted_ms: None,
            faulted_state: None,
            faulted_cause: None,
            landed_before_end: None,
            landed_after_end: None,
            next_op: None,
            note: None,
        }
    }

    fn not_applicable(mut self, why: &str) -> Row {
        self.applicable = false;
        self.target_ms = None;
        self.note = Some(why.into());
        self
    }
}

/// The state of one pass (processes, or namespaces).
pub(super) struct Run {
    exe: PathBuf,
    bound: Duration,
    timeout: Duration,
    ns: Option<hosts::Namespace>,
    tcp: Connector,
    cma: Option<Connector>,
    ucx: Option<Connector>,
    n: AtomicU32,
}

impl Run {
    async fn start(
        exe: &Path,
        opts: &Options,
        ns: Option<hosts::Namespace>,
    ) -> anyhow::Result<Run> {
        let here = ns
            .as_ref()
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |n| n.here);
        let listen = SocketAddr::new(here, 0);
        let b = || Connector::builder().listen(listen);
        let tcp = b().transports(&[TransportKind::Tcp]).build().await?;
        let cma = if ns.is_none() && opts.lanes.contains(&Lane::Cma) {
            Some(
                b().transports(&[TransportKind::Cma, TransportKind::Tcp])
                    .cma_threshold(0)
                    .build()
                    .await?,
            )
        } else {
            None
        };
        let ucx = if opts.lanes.contains(&Lane::Ucx) {
            match ferry::ucx::status() {
                Ok(_) => Some(crate::peer::ucx_lane(b()).build().await?),
                Err(why) => {
                    eprintln!("faults: ucx rows skipped: no UCX here ({why})");
                    None
                }
            }
        } else {
            None
        };
        Ok(Run {
            exe: exe.to_path_buf(),
            bound: opts.bound,
            timeout: opts.bound + opts.slack,
            ns,
            tcp,
            cma,
            ucx,
            n: AtomicU32::new(0),
        })
    }

    fn hosts(&self) -> &'static str {
        if self.ns.is_some() {
            "namespaces"
        } else {
            "processes"
        }
    }

    fn peer_ip(&self) -> IpAddr {
        self.ns
            .as_ref()
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |n| n.there)
    }

    fn connector(&self, lane: Lane) -> &Connector {
        match lane {
            Lane::Tcp => &self.tcp,
            Lane::Cma => self.cma.as_ref().unwrap_or(&self.tcp),
            Lane::Ucx => self.ucx.as_ref().unwrap_or(&self.tcp),
        }
    }

    fn has(&self, lane: Lane) -> bool {
        match lane {
            Lane::Tcp => true,
            Lane::Cma => self.cma.is_some(),
            Lane::Ucx => self.ucx.is_some(),
        }
    }

    fn next_n(&self) -> u32 {
        self.n.fetch_add(1, Ordering::Relaxed)
    }
}

/// Whether this build's library reads [`LIVENESS_ENV`].
fn library_reads_bound() -> bool {
    let builder = ferry::ConnectorBuilder::default();
    let connector = ferry::config::Config::resolve(&builder)
        .map(|c| c.knobs().iter().any(|k| k.name == LIVENESS_ENV))
        .unwrap_or(false);
    connector
        || ferry::config::process()
            .knobs()
            .iter()
            .any(|k| k.name == LIVENESS_ENV)
}

/// Starts this command again with [`LIVENESS_ENV`] set to the bound where
/// this process's environment says otherwise (so that this process's
/// connectors run with the bound too); `None` where it already does.
pub fn restart_with_bound(bound: Duration) -> anyhow::Result<Option<i32>> {
    let want = bound.as_millis().to_string();
    if std::env::var(LIVENESS_ENV).ok().as_deref() == Some(want.as_str()) {
        return Ok(None);
    }
    let exe = std::env::current_exe()?;
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(LIVENESS_ENV, &want)
        .status()
        .context("starting this command again with the liveness bound")?;
    Ok(Some(status.code().unwrap_or(1)))
}

/// Runs the fault rows; prints the table (and JSON lines, if asked).
pub async fn run(exe: &Path, opts: Options) -> anyhow::Result<Vec<Row>> {
    let mut json: Option<Box<dyn std::io::Write>> = match &opts.json {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
        Some(p) => Some(Box::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
    };
    let mut rows = Vec::new();
    let mut passes = vec![None];
    let mut lines = Vec::new();
    if opts.namespaces {
        match hosts::Namespace::up() {
            Ok(ns) => passes.push(Some(ns)),
            Err(why) => lines.push(format!("namespaces: not run: {why}")),
        }
    }
    for ns in passes {
        let run = Run::start(exe, &opts, ns).await?;
        for &fault in &opts.faults {
            for &lane in &opts.lanes {
                if !run.has(lane) {
                    continue;
                }
                for shape in &opts.shapes {
                    let na = not_applicable(&run, fault, lane);
                    let row = match na {
                        Some(why) => Row::new(&run, fault, lane, shape).not_applicable(why),
                        None => {
                            eprint!(
                                "\r{:<10} {:<8} {:<4} {:<14}",
                                run.hosts(),
                                fault.name(),
                                lane.name(),
                                shape.name
                            );
                            trial::run(&run, fault, lane, shape).await
                        }
                    };
                    if let Some(j) = &mut json {
                        serde_json::to_writer(&mut *j, &row)?;
                        j.write_all(b"\n")?;
                        j.flush()?;
                    }
                    let one_row = row.applicable.then_some(()).is_none();
                    rows.push(row);
                    if one_row {
                        // Not applicable: one row says so for every shape.
                        break;
                    }
                }
            }
        }
        if run.ns.is_some() && opts.lanes.contains(&Lane::Cma) {
            lines.push(
                "namespaces: no cma rows (cross-memory attach is never set up between two hosts)"
                    .into(),
            );
        }
    }
    eprintln!("\r{:<60}", "faults done");
    print_table(&opts, &rows, &lines);
    Ok(rows)
}

/// Why `fault` does not apply to this pass and lane, if it does not.
fn not_applicable(run: &Run, fault: Fault, lane: Lane) -> Option<&'static str> {
    match fault {
        Fault::Cut if run.ns.is_none() => Some(
            "not applicable between two processes of one host: no link to cut (see the namespace rows)",
        ),
        Fault::ControlRestart => Some(
            "not applicable: the bench hands metadata over the peer's pipe, no ferry-control server is in the path; once handed over, a transfer never touches the control plane",
        ),
        Fault::Restart if lane == Lane::Ucx => Some(
            "not applicable: the peer's UCX connector takes no worker id of its own",
        ),
        _ => None,
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("—".into(), |m| format!("{m:.1}"))
}

fn print_table(opts: &Options, rows: &[Row], lines: &[String]) {
    let bound = opts.bound.as_millis();
    let reads = if library_reads_bound() {
        "one of this build's configuration knobs"
    } else {
        "not among this build's configuration knobs (no liveness heartbeats here): a stopped peer or a cut link is detected as before, if at all"
    };
    println!(
        "faults: liveness bound {bound} ms ({LIVENESS_ENV}={bound} in both processes, {reads}); each fault given {:.1} s; targets: kill and restart <= 100 ms, stop and cut <= bound + 100 ms; bytes after the end: 0",
        (opts.bound + opts.slack).as_secs_f64()
    );
    println!(
        "{:<3} {:<10} {:<15} {:<4} {:<14} {:>9}  {:>20}  {:<11} {:>10}  {:<11} {:>11} {:>10}  next op",
        "#", "hosts", "fault", "via", "shape", "warm ms", "survivor ms / target", "state",
        "faulted ms", "state", "after end", "before end",
    );
    for (i, r) in rows.iter().enumerate() {
        if !r.applicable {
            println!(
                "{:<3} {:<10} {:<15} {:<4} {:<14} {}",
                i + 1,
                r.hosts,
                r.fault,
                r.transport,
                "(all)",
                r.note.as_deref().unwrap_or_default()
            );
            continue;
        }
        let surv = match (r.detected, r.survivor_ms, r.target_ms) {
            (true, Some(m), Some(t)) => format!("{m:.1} / {t}"),
            (true, Some(m), None) => format!("{m:.1}"),
            _ => format!("> {:.1} s", r.timeout_ms as f64 / 1e3),
        };
        let via = match &r.carried_by {
            Some(c) if *c != r.transport => format!("{}>{c}", r.transport),
            _ => r.transport.clone(),
        };
        println!(
            "{:<3} {:<10} {:<15} {:<4} {:<14} {:>9}  {:>20}  {:<11} {:>10}  {:<11} {:>11} {:>10}  {}",
            i + 1,
            r.hosts,
            r.fault,
            via,
            r.shape,
            opt_ms(r.unfaulted_ms),
            surv,
            r.survivor_state.as_deref().unwrap_or("—"),
            opt_ms(r.faulted_ms),
            r.faulted_state.as_deref().unwrap_or("—"),
            r.landed_after_end.map_or("—".into(), |b| format!("{b} B vs 0")),
            r.landed_before_end.map_or("—".into(), |b| format!("{b} B")),
            r.next_op.as_deref().unwrap_or("—"),
        );
    }
    println!("causes (Display of each side's error):");
    for (i, r) in rows.iter().enumerate().filter(|(_, r)| r.applicable) {
        println!(
            "  #{:<3} survivor: {}; faulted: {}{}",
            i + 1,
            r.survivor_cause.as_deref().unwrap_or("—"),
            r.faulted_cause.as_deref().unwrap_or("—"),
            r.note
                .as_deref()
                .map(|n| format!(" [{n}]"))
                .unwrap_or_default()
        );
    }
    println!("mid-transfer:");
    for s in &opts.shapes {
        println!("  {:<14} {}", s.name, trial::mid_transfer(s));
    }
    println!(
        "columns: the survivor (this process) READs the faulted peer's readable into memory filled with 0xA5; times from the fault on one clock (both processes on this host); \
         warm: the same READ unfaulted; faulted: a killed peer reports nothing (—), a stopped one answers once let go (SIGCONT) after the survivor's measurement; \
         after end: destination bytes that changed after the survivor's operation ended (or the bench cancelled it), the peer let go or the link restored, and {} ms passed; \
         next op: a 4 KiB READ from the resumed, reconnected or restarted peer",
        trial::GRACE.as_millis()
    );
    for l in lines {
        println!("{l}");
    }
}
