//! `ferry bench --workload grant`: one-sided READ and WRITE on a standing
//! grant between two processes of one host, each row next to the same
//! transfer as today's per-operation capability and the lane's raw copy,
//! measured in the same run, taking turns slice by slice.
//!
//! The owner is `ferry grant-target` (driven by JSON lines on its stdin):
//! it allocates a pool, grants it to this process's connector and passes
//! the grant's metadata over the pipe; this process opens it and reads or
//! writes blocks of it by index, from and into its own pool. Rows, per
//! transfer (4 KiB, 64 KiB, 1 MiB, 64 MiB blocks, one block per
//! operation; then the KV shapes of [`crate::kv::SHAPES`], their blocks
//! split between the requests in flight), READ and WRITE, 1, 8 and 32 in
//! flight:
//!
//! - `raw`: `process_vm_readv` / `process_vm_writev` loops between the two
//!   processes, one thread per operation in flight (the lane's limit);
//! - `per-op`: today's capability, per operation: the owner creates a
//!   READABLE or WRITABLE over its blocks and passes its metadata, this
//!   side runs `begin_read` / `begin_write` (latency from the owner's
//!   creation, as the sweep's end-to-end latency);
//! - `grant`: `read_blocks` / `write_blocks` on the grant, event-driven;
//!   `grant-spin`: the same grant in low-latency mode (the owner spins
//!   1 ms, `measure::SPIN`, before parking; 4 KiB only).
//!
//! At 4 KiB, WRITEs one at a time (200 µs apart, `measure::GAP`) also time the
//! notification alone: in a closed loop the holder posts faster than the
//! owner takes notifications, and their latency includes the queue.
//!
//! Columns: post → completion latency on this side (p50, p99); post →
//! the owner's notification of a WRITE (p50, p99: the owner timestamps the
//! arrival on `CLOCK_MONOTONIC`, which every process of the host shares,
//! against the post time the notification's payload carries; a per-op
//! WRITE's notification is the owner's completion); GB/s and operations
//! per second over the wall time from the first post to the last
//! completion; and each row's GB/s and p50 as ratios to the per-op and raw
//! rows beside it. Under the table: the owner's CPU while idle with a
//! grant open.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use ferry::{Connector, TransportKind};
use serde::Serialize;

mod holder;
mod measure;
mod owner;
mod proto;
mod raw;
mod stats;
mod target;

pub use target::target;

use measure::{Case, Side};
use proto::{Cmd, Ids, Owner, Req};
use stats::{pct_us, Budget, Samples};

/// What to measure.
pub struct Options {
    /// Seconds, not minutes (for CI): smaller transfers, pools and slices.
    pub quick: bool,
    /// Bytes per block of the one-block rows (default 4 KiB, 64 KiB,
    /// 1 MiB, 64 MiB).
    pub sizes: Vec<u64>,
    /// Operations in flight.
    pub inflight: Vec<usize>,
    /// Only these KV shapes (default: all; `--quick`: two small ones).
    pub shapes: Vec<String>,
    /// Also one JSON object per row here.
    pub json: Option<Box<dyn Write>>,
}

/// The one-block rows' sizes by default.
pub const SIZES: [u64; 4] = [4 << 10, 64 << 10, 1 << 20, 64 << 20];

/// A row's figures as ratios to a baseline's.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ratios {
    /// GB/s over the baseline's (ops/s: the same ratio).
    pub gbps: f64,
    /// p50 latency over the baseline's.
    pub lat_p50: f64,
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct GrantRow {
    /// The transfer: its block size (`4 KiB`) or the KV shape's name.
    pub workload: String,
    /// `raw`, `per-op`, `grant`, `grant-spin` or `grant-tcp` (the grant
    /// opened by TCP: each operation served in the owner's runtime).
    pub kind: &'static str,
    /// `read` or `write`.
    pub op: &'static str,
    /// Operations in flight.
    pub inflight: usize,
    /// Bytes per block.
    pub block: usize,
    /// Bytes per operation (of the first in flight).
    pub bytes: u64,
    /// Operations measured.
    pub ops: usize,
    /// Post → completion on the posting side, microseconds.
    pub lat_us_p50: f64,
    /// The same, 99th percentile.
    pub lat_us_p99: f64,
    /// Post → the owner's notification (WRITE), microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify_us_p50: Option<f64>,
    /// The same, 99th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify_us_p99: Option<f64>,
    /// Gigabytes (1e9 bytes) per second.
    pub gbps: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Against the per-op row of the same transfer and in-flight count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_per_op: Option<Ratios>,
    /// Against the raw row of the same transfer and in-flight count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_raw: Option<Ratios>,
}

/// The notification latency of paced 4 KiB WRITEs, one at a time.
#[derive(Debug, Clone, Serialize)]
pub struct Paced {
    /// `notify-paced`.
    pub kind: &'static str,
    /// `grant` or `grant-spin`.
    pub grant: &'static str,
    /// WRITEs timed.
    pub ops: usize,
    /// Microseconds between one's completion and the next's post.
    pub gap_us: f64,
    /// Post → completion on the holder, microseconds.
    pub lat_us_p50: f64,
    /// Post → the owner's notification, microseconds.
    pub notify_us_p50: f64,
    /// The same, 99th percentile.
    pub notify_us_p99: f64,
}

/// How long and how much.
struct Plan {
    rounds: usize,
    /// Rounds of a KV row: one transfer of the shape each.
    kv_rounds: usize,
    /// Per row and kind, all rounds together.
    row_time: Duration,
    /// Bytes per slice at most.
    slice_bytes: u64,
    /// Operations per slice at most.
    max_ops: u64,
    /// The largest pool on each side of the one-block rows: in-flight
    /// counts beyond its blocks are skipped.
    pool_bytes: u64,
    idle: Duration,
    /// Paced WRITEs per grant.
    paced: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                rounds: 2,
                kv_rounds: 2,
                row_time: Duration::from_millis(60),
                slice_bytes: 32 << 20,
                max_ops: 400,
                pool_bytes: 64 << 20,
                idle: Duration::from_millis(500),
                paced: 50,
            }
        } else {
            Plan {
                rounds: 3,
                kv_rounds: 5,
                row_time: Duration::from_millis(1200),
                slice_bytes: 1 << 30,
                max_ops: 20_000,
                pool_bytes: 2 << 30,
                idle: Duration::from_secs(3),
                paced: 1000,
            }
        }
    }

    fn budget(&self, bytes: u64, k: usize) -> Budget {
        Budget {
            n: (self.slice_bytes / bytes.max(1)).clamp(k as u64, self.max_ops.max(k as u64)),
            min: k as u64,
            time: self.row_time / self.rounds as u32,
        }
    }
}

/// The shapes a run measures.
fn shapes(quick: bool, only: &[String]) -> anyhow::Result<Vec<crate::kv::Shape>> {
    let all = crate::kv::SHAPES;
    if !only.is_empty() {
        let names: Vec<&str> = all.iter().map(|s| s.name).collect();
        if let Some(bad) = only.iter().find(|n| !names.contains(&n.as_str())) {
            return Err(anyhow!(
                "unknown shape {bad:?}: one of {}",
                names.join(", ")
            ));
        }
        return Ok(all
            .into_iter()
            .filter(|s| only.iter().any(|n| n == s.name))
            .collect());
    }
    if !quick {
        return Ok(all.to_vec());
    }
    // READ and WRITE, 8 MiB each.
    Ok(vec![
        crate::kv::Shape {
            name: "kv-tp8/2k",
            blocks: 2048,
            ..all[2]
        },
        crate::kv::Shape {
            name: "kv-vllm-write/256",
            blocks: 256,
            ..all[1]
        },
    ])
}

/// Human bytes: `4 KiB`, `64 MiB`.
fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The one-block case: worker `w` moves block `w` of the owner's pool
/// from or into its block `w`.
fn one_block_case(size: u64, k: usize, write: bool) -> Case {
    let ids: Vec<Vec<u32>> = (0..k as u32).map(|w| vec![w]).collect();
    Case {
        block: size as usize,
        write,
        remote: ids.iter().map(|v| Ids::List(v.clone())).collect(),
        remote_ids: ids.clone(),
        local: ids,
    }
}

/// A KV shape's case: its blocks (shuffled ids, different on each side,
/// as the kv workload's) split evenly between `k` requests.
fn shape_case(s: &crate::kv::Shape, k: usize) -> Case {
    let seed = 0x5eed;
    let n = s.blocks as usize;
    let per = n.div_ceil(k);
    let theirs = crate::kv::ids(s.blocks, s.run, seed);
    let mine = crate::kv::ids(s.blocks, s.run, seed ^ 0xa5a5);
    let mut c = Case {
        block: s.block,
        write: s.write,
        remote: Vec::new(),
        remote_ids: Vec::new(),
        local: Vec::new(),
    };
    for w in 0..k {
        let (from, to) = ((w * per).min(n), ((w + 1) * per).min(n));
        c.remote.push(Ids::Perm {
            blocks: s.blocks,
            run: s.run,
            seed,
            from: from as u32,
            to: to as u32,
        });
        c.remote_ids.push(theirs[from..to].to_vec());
        c.local.push(mine[from..to].to_vec());
    }
    c
}

/// Measures `case` (named `workload`): its kinds take turns slice by
/// slice, the first slice of the grant (over cma, and over TCP where it
/// runs) checked byte for byte on memory the rows before did not fill. Its rows, the
/// raw one first.
async fn measure_case(
    side: &Side,
    rounds: usize,
    workload: &str,
    case: &Case,
    budget: Budget,
) -> anyhow::Result<Vec<GrantRow>> {
    let (mut raw, mut per_op, mut grant, mut spin, mut tcp) =
        <(Samples, Samples, Samples, Samples, Samples)>::default();
    let held = side.grant.clone().ok_or_else(|| anyhow!("no grant open"))?;
    for round in 0..rounds {
        raw.add(side.raw_slice(case, budget)?);
        per_op.add(side.per_op_slice(case, budget).await?);
        if round == 0 {
            side.forget(case).await?;
        }
        grant.add(side.grant_slice(&held, case, budget).await?);
        if round == 0 {
            side.verify(case).await?;
        }
        if let Some(s) = &side.spin {
            spin.add(side.grant_slice(s, case, budget).await?);
        }
        if let Some(t) = &side.tcp {
            if round == 0 {
                side.forget(case).await?;
            }
            tcp.add(side.grant_slice(t, case, budget).await?);
            if round == 0 {
                side.verify(case).await?;
            }
        }
    }
    let row = |kind: &'static str, s: &Samples| -> GrantRow {
        let k = case.inflight();
        let all: usize = case.local.iter().map(Vec::len).sum();
        // Each in flight moves its own blocks: the bytes of all of them
        // per round of `k` operations.
        let bytes = s.ops() as f64 / k as f64 * (all * case.block) as f64;
        let wall = s.wall.as_secs_f64().max(1e-9);
        GrantRow {
            workload: workload.to_string(),
            kind,
            op: if case.write { "write" } else { "read" },
            inflight: k,
            block: case.block,
            bytes: case.bytes(),
            ops: s.ops(),
            lat_us_p50: pct_us(&s.lat, 50).unwrap_or(0.0),
            lat_us_p99: pct_us(&s.lat, 99).unwrap_or(0.0),
            notify_us_p50: pct_us(&s.notes, 50),
            notify_us_p99: pct_us(&s.notes, 99),
            gbps: bytes / wall / 1e9,
            ops_per_s: s.ops() as f64 / wall,
            vs_per_op: None,
            vs_raw: None,
        }
    };
    let vs = |r: &GrantRow, b: &GrantRow| Ratios {
        gbps: r.gbps / b.gbps.max(1e-12),
        lat_p50: r.lat_us_p50 / b.lat_us_p50.max(1e-12),
    };
    let raw = row("raw", &raw);
    let mut per_op = row("per-op", &per_op);
    per_op.vs_raw = Some(vs(&per_op, &raw));
    let mut rows = vec![raw, per_op];
    let mut kinds = vec![("grant", grant)];
    if side.spin.is_some() {
        kinds.push(("grant-spin", spin));
    }
    if side.tcp.is_some() {
        kinds.push(("grant-tcp", tcp));
    }
    for (kind, s) in kinds {
        let mut r = row(kind, &s);
        r.vs_per_op = Some(vs(&r, &rows[1]));
        r.vs_raw = Some(vs(&r, &rows[0]));
        rows.push(r);
    }
    Ok(rows)
}

/// Runs the grant workload, prints its table, and writes its rows as JSON
/// lines to `opts.json` if given.
pub async fn run(exe: &Path, mut opts: Options) -> anyhow::Result<Vec<GrantRow>> {
    let plan = Plan::new(opts.quick);
    let sizes = if opts.sizes.is_empty() {
        SIZES.to_vec()
    } else {
        opts.sizes.clone()
    };
    let shapes = shapes(opts.quick, &opts.shapes)?;
    let mut inflights = opts.inflight.clone();
    inflights.retain(|&k| k > 0);
    if inflights.is_empty() {
        inflights = vec![1, 8, 32];
    }
    let most = inflights.iter().copied().max().unwrap_or(1);
    let owner = Arc::new(Owner::spawn(exe).await?);
    let c = Arc::new(
        Connector::builder()
            .transports(&[TransportKind::Cma, TransportKind::Tcp])
            .cma_threshold(0)
            .build()
            .await?,
    );
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut last = None;
    let mut paced = Vec::new();
    for &size in &sizes {
        let fits = (plan.pool_bytes / size.max(1)).max(1) as usize;
        let blocks = most.min(fits);
        // Free the last pools before the next ones are allocated.
        drop(last.take());
        let side = Side::new(
            owner.clone(),
            c.clone(),
            size as usize,
            blocks as u32,
            size <= 4096,
        )
        .await?;
        for write in [false, true] {
            if write {
                side.refill().await?;
            }
            for &k in &inflights {
                if k > blocks {
                    if !write {
                        skipped.push(format!("{} x{k}", human(size)));
                    }
                    continue;
                }
                let case = one_block_case(size, k, write);
                let new = measure_case(
                    &side,
                    plan.rounds,
                    &human(size),
                    &case,
                    plan.budget(size, k),
                )
                .await?;
                push_rows(&mut opts.json, &mut rows, new)?;
            }
        }
        if let (Some(g), Some(s)) = (&side.grant, &side.spin) {
            let case = one_block_case(size, 1, true);
            for (name, held) in [("grant", g), ("grant-spin", s)] {
                let got = side.paced(held, &case, plan.paced).await?;
                let p = Paced {
                    kind: "notify-paced",
                    grant: name,
                    ops: got.ops(),
                    gap_us: measure::GAP.as_secs_f64() * 1e6,
                    lat_us_p50: pct_us(&got.lat, 50).unwrap_or(0.0),
                    notify_us_p50: pct_us(&got.notes, 50).unwrap_or(0.0),
                    notify_us_p99: pct_us(&got.notes, 99).unwrap_or(0.0),
                };
                to_json(&mut opts.json, &p)?;
                paced.push(p);
            }
        }
        last = Some(side);
    }
    for s in &shapes {
        drop(last.take());
        let side = Side::new(owner.clone(), c.clone(), s.block, s.blocks, false).await?;
        for &k in &inflights {
            let k = k.min(s.blocks as usize);
            let case = shape_case(s, k);
            let budget = Budget {
                n: k as u64,
                min: k as u64,
                time: Duration::ZERO,
            };
            let new = measure_case(&side, plan.kv_rounds, s.name, &case, budget).await?;
            push_rows(&mut opts.json, &mut rows, new)?;
        }
        last = Some(side);
    }
    eprintln!("\r{:<70}", "grant workload done");
    // The owner's CPU while idle, with the last grant still open.
    // The owner's CPU while idle, measured by the owner itself around a
    // sleep: first with no grant (the last ones revoked), then with one
    // fresh event-driven grant, opened here, both after the same pause.
    let side = last.take().ok_or_else(|| anyhow!("nothing was measured"))?;
    let mut r = Req::new(Cmd::Idle);
    r.idle_ms = plan.idle.as_millis() as u64;
    owner.call(Req::new(Cmd::Revoke)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let none_us = owner.call(r.clone()).await?.cpu_ns.unwrap_or(0) as f64 / 1e3;
    let held = side.open(0, None).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = owner.call(r).await?;
    let idle_us = a.cpu_ns.unwrap_or(0) as f64 / 1e3;
    let threads_us = a.grant_cpu_us.unwrap_or(0);
    let open = 1;
    print_table(&rows);
    print_summary(&rows);
    for p in &paced {
        println!(
            "4 KiB write notification, one at a time ({} writes {:.0} us apart), {}: post -> owner p50 {:.1} us, p99 {:.1} us (post -> completion p50 {:.1} us; NIXL 1.5.1: 24.6 us until the target sees it)",
            p.ops,
            p.gap_us,
            if p.grant == "grant" { "event-driven" } else { "low-latency" },
            p.notify_us_p50,
            p.notify_us_p99,
            p.lat_us_p50
        );
    }
    if !skipped.is_empty() {
        println!(
            "skipped (more blocks in flight than a pool of {} holds): {}",
            human(plan.pool_bytes),
            skipped.join(", ")
        );
    }
    println!(
        "owner idle over {:?} with {open} grant open (event-driven, its holder attached): {threads_us} us of CPU in the grant's notification thread (10 ms ticks); the whole process {idle_us:.0} us, against {none_us:.0} us over the same time with no grant (its connector's timers, the sleep's own)",
        plan.idle,
    );
    let idle = serde_json::json!({
        "kind": "owner-idle",
        "seconds": plan.idle.as_secs_f64(),
        "cpu_us": idle_us,
        "grant_threads_cpu_us": threads_us,
        "cpu_us_without_grant": none_us,
        "grants_open": open,
    });
    to_json(&mut opts.json, &idle)?;
    drop((held, side));
    Ok(rows)
}

/// Writes `v` as one JSON line to `json`, if given.
fn to_json(json: &mut Option<Box<dyn Write>>, v: &impl Serialize) -> anyhow::Result<()> {
    if let Some(j) = json {
        serde_json::to_writer(&mut *j, v)?;
        writeln!(j)?;
    }
    Ok(())
}

/// Adds `new` to `rows` (and to `json`), saying how far the run is.
fn push_rows(
    json: &mut Option<Box<dyn Write>>,
    rows: &mut Vec<GrantRow>,
    new: Vec<GrantRow>,
) -> anyhow::Result<()> {
    for r in new {
        to_json(json, &r)?;
        let at = format!("{} {} x{} {}", r.workload, r.op, r.inflight, r.kind);
        eprint!("\r{at:<70}");
        rows.push(r);
    }
    Ok(())
}

/// `0.52x`, or `-`.
fn ratio(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(x) if x >= 100.0 => format!("{x:.0}x"),
        Some(x) if x >= 0.1 => format!("{x:.2}x"),
        Some(x) => format!("{x:.3}x"),
    }
}

fn us(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.1}"))
}

fn print_table(rows: &[GrantRow]) {
    let w = rows
        .iter()
        .map(|r| r.workload.len())
        .max()
        .unwrap_or(0)
        .max(8);
    println!(
        "{:<w$} {:<5} {:>3} {:<10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>7} {:>7} {:>7} {:>7}",
        "transfer",
        "op",
        "in",
        "kind",
        "p50 us",
        "p99 us",
        "note p50",
        "note p99",
        "GB/s",
        "ops/s",
        "GB/s",
        "p50",
        "GB/s",
        "p50",
    );
    println!("{:<w$} {:>86} {:>15}", "", "vs per-op", "vs raw");
    for r in rows {
        println!(
            "{:<w$} {:<5} {:>3} {:<10} {:>9.1} {:>9.1} {:>9} {:>9} {:>8.3} {:>9.0} {:>7} {:>7} {:>7} {:>7}",
            r.workload,
            r.op,
            r.inflight,
            r.kind,
            r.lat_us_p50,
            r.lat_us_p99,
            us(r.notify_us_p50),
            us(r.notify_us_p99),
            r.gbps,
            r.ops_per_s,
            ratio(r.vs_per_op.map(|x| x.gbps)),
            ratio(r.vs_per_op.map(|x| x.lat_p50)),
            ratio(r.vs_raw.map(|x| x.gbps)),
            ratio(r.vs_raw.map(|x| x.lat_p50)),
        );
    }
}

/// The figures, read off the rows.
fn print_summary(rows: &[GrantRow]) {
    let find = |w: &str, op: &str, k: usize, kind: &str| {
        rows.iter()
            .find(|r| r.workload == w && r.op == op && r.inflight == k && r.kind == kind)
    };
    for op in ["read", "write"] {
        if let (Some(g), Some(s)) = (
            find("4 KiB", op, 1, "grant"),
            find("4 KiB", op, 1, "grant-spin"),
        ) {
            println!(
                "4 KiB {op} p50, 1 in flight: {:.1} us event-driven, {:.1} us low-latency (anchor: NIXL 1.5.1 re-posted READ 22 us; targets: <= 44 event-driven, <= 22 low-latency)",
                g.lat_us_p50, s.lat_us_p50
            );
        }
    }
    let mut scaling = Vec::new();
    // One-block rows only: a KV row's requests split one transfer, and
    // its GB/s says what more in flight did.
    for r in rows
        .iter()
        .filter(|r| r.kind == "grant" && r.inflight > 1 && r.bytes == r.block as u64)
    {
        if let (Some(one), Some(raw_k), Some(raw_1)) = (
            find(&r.workload, r.op, 1, "grant"),
            find(&r.workload, r.op, r.inflight, "raw"),
            find(&r.workload, r.op, 1, "raw"),
        ) {
            scaling.push(format!(
                "{} {} x{}: {:.1}x (raw {:.1}x)",
                r.workload,
                r.op,
                r.inflight,
                r.ops_per_s / one.ops_per_s.max(1e-9),
                raw_k.ops_per_s / raw_1.ops_per_s.max(1e-9)
            ));
        }
    }
    if !scaling.is_empty() {
        println!(
            "grant ops/s in flight over 1 in flight (the raw loop's own, one thread each, on {} CPUs): {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            scaling.join("; ")
        );
    }
}
