//! `ferry bench`: bandwidth, operation rate and end-to-end latency between two
//! processes, per transport, with the baselines of the same run (memcpy, a
//! raw cross-memory-attach loop, a plain TCP stream, a raw UCX get loop) so
//! that every figure can be read as a ratio.
//!
//! By default it starts a target process (`ferry peer`) itself and runs as
//! the initiator. For two hosts, run `ferry bench --role target --control
//! 0.0.0.0:7000` on one and `ferry bench --control HOST:7000` on the other.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use ferry::{Connector, ConnectorBuilder, Descriptor, RdmaMetadata, TransportKind};
use serde::Serialize;

use crate::peer::{self, Cmd, PeerProcess, Request};

mod device;
pub mod faults;
mod rows;
mod ucx;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Block sizes (bytes per descriptor).
    pub blocks: Vec<u64>,
    /// Descriptors per operation.
    pub batches: Vec<usize>,
    /// The most bytes one operation may move (larger rows are skipped).
    pub max_op_bytes: u64,
    /// Bytes to move per row (iterations = this / bytes per op, bounded).
    pub budget: u64,
    /// Fewest and most iterations per row.
    pub iters: (usize, usize),
    /// Stop a row after this long (at least the fewest iterations run).
    pub row_time: Duration,
    /// Seconds of idleness over which CPU time is measured.
    pub idle: Duration,
    /// Write JSON lines here (`-` for stdout).
    pub json: Option<PathBuf>,
    /// Listen address of this process's connector.
    pub listen: String,
    /// A shared secret for every connector of the run, the target's
    /// included (`None`: `FERRY_SECRET` if set, as for any connector).
    pub secret: Option<String>,
    /// GPU memory on both sides (`cuda:N`, or `sim`): the device sweep
    /// (see `bench/device.rs`) instead of the host one.
    pub device: Option<String>,
    /// The end-to-end digest on for every Ferry row, on both sides
    /// (`ConnectorBuilder::digest`; the target through `FERRY_DIGEST`):
    /// its cost is these rows against the same rows of a run without it.
    pub digest: bool,
}

impl Options {
    /// The full sweep.
    pub fn full() -> Self {
        Options {
            blocks: vec![4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20],
            batches: vec![1, 16, 64],
            max_op_bytes: 256 << 20,
            budget: 1 << 30,
            iters: (40, 2000),
            row_time: Duration::from_secs(2),
            idle: Duration::from_secs(5),
            json: None,
            listen: "127.0.0.1:0".into(),
            secret: None,
            device: None,
            digest: false,
        }
    }

    /// A sweep that finishes in well under a minute (for CI).
    pub fn quick() -> Self {
        Options {
            blocks: vec![4 << 10, 64 << 10, 1 << 20, 64 << 20],
            batches: vec![1, 64],
            max_op_bytes: 64 << 20,
            budget: 128 << 20,
            iters: (8, 300),
            row_time: Duration::from_millis(700),
            idle: Duration::from_secs(1),
            ..Options::full()
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `ferry`, or the baseline's name (`memcpy`, `cma`, `tcp_stream`,
    /// `ucx_get`).
    pub kind: String,
    /// The transport that carried it (`tcp`, `cma`, `ucx`; `local` for memcpy).
    pub transport: String,
    /// `read`, `write`, `copy` or `cold_start`.
    pub op: String,
    /// Bytes per descriptor.
    pub block_size: u64,
    /// Descriptors per operation.
    pub batch: usize,
    /// Operations measured.
    pub iters: usize,
    /// Gigabytes (1e9 bytes) per second.
    pub gbps: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Mean end-to-end latency, microseconds.
    pub lat_us_avg: f64,
    /// Median latency.
    pub lat_us_p50: f64,
    /// 99th percentile latency.
    pub lat_us_p99: f64,
    /// TCP connections the transfer was split over (Ferry rows over TCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streams: Option<usize>,
    /// The baseline this row is compared with (Ferry rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// `gbps` divided by the baseline's (Ferry rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Median microseconds to register the lent buffer with UCX
    /// (`ucp_mem_map` and `ucp_rkey_pack`; `ucx_get` rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reg_us: Option<f64>,
    /// Every byte was digested on both sides and compared (`--digest`;
    /// Ferry rows).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub digest: bool,
}

fn row(
    kind: &str,
    transport: &str,
    op: &str,
    block: u64,
    batch: usize,
    lat: &mut [Duration],
    wall: Duration,
) -> Row {
    lat.sort_unstable();
    let n = lat.len().max(1);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let pct = |p: usize| us(lat[(lat.len() * p / 100).min(lat.len() - 1)]);
    let bytes = block as f64 * batch as f64 * lat.len() as f64;
    Row {
        kind: kind.into(),
        transport: transport.into(),
        op: op.into(),
        block_size: block,
        batch,
        iters: lat.len(),
        gbps: bytes / wall.as_secs_f64() / 1e9,
        ops_per_s: lat.len() as f64 / wall.as_secs_f64(),
        lat_us_avg: lat.iter().map(|d| us(*d)).sum::<f64>() / n as f64,
        lat_us_p50: pct(50),
        lat_us_p99: pct(99),
        streams: None,
        baseline: None,
        ratio: None,
        reg_us: None,
        digest: false,
    }
}

/// Local buffers reused across iterations, allocated as NumPy allocates
/// large arrays (see [`host_buffer`](crate::buffers::host_buffer)).
#[derive(Default)]
struct Pool(HashMap<(bool, u64), Vec<Descriptor<'static>>>);

impl Pool {
    /// `batch` buffers of `block` bytes, in host memory or on `device`.
    fn take(
        &mut self,
        block: u64,
        batch: usize,
        device: Option<&str>,
    ) -> std::io::Result<Vec<Descriptor<'static>>> {
        let key = (device.is_some(), block);
        (0..batch)
            .map(|_| match self.0.get_mut(&key).and_then(|l| l.pop()) {
                Some(d) => Ok(d),
                None => match device {
                    None => crate::buffers::host_buffer(block as usize),
                    Some(dev) => crate::buffers::device_buffer(dev, block as usize),
                },
            })
            .collect()
    }

    fn put(&mut self, descs: Vec<Descriptor<'static>>) {
        for d in descs {
            let key = (!d.device().is_cpu(), d.size() as u64);
            self.0.entry(key).or_default().push(d);
        }
    }
}

/// Streams of the striped TCP rows.
const STREAMS: usize = 4;
/// The smallest transfer measured striped (the library's default threshold).
const STRIPE_MIN: u64 = ferry::DEFAULT_STRIPE_THRESHOLD;

/// Which of the initiator's connectors runs a Ferry row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// TCP, as the library chooses (one stream on this host).
    Tcp,
    /// Cross-memory attach for every size.
    Cma,
    /// TCP split over [`STREAMS`] connections.
    Striped,
    /// UCX for every size, on both sides ([`peer::ucx_lane`]).
    Ucx,
    /// TCP with device memory on both sides (`--device`): staged through
    /// host memory.
    Staged,
    /// Device memory on both sides (`--device cuda:N`) with the
    /// cross-memory attach connector: CUDA IPC where the driver lends.
    Ipc,
    /// Device memory on both sides (`--device cuda:N`) over the UCX lane:
    /// through UCX where both processes' UCX moves CUDA memory.
    UcxDevice,
}

struct Bench {
    opts: Options,
    peer: PeerProcess,
    /// A connector restricted to TCP.
    tcp: Connector,
    /// A connector that sends every transfer by cross-memory attach.
    cma: Connector,
    /// A connector restricted to TCP that splits transfers of
    /// [`STRIPE_MIN`] bytes or more over [`STREAMS`] connections.
    striped: Connector,
    /// The UCX lane and the raw baseline's worker, when UCX runs here.
    ucx: Option<ucx::Side>,
    /// The target runs on this host: both processes read one monotonic clock.
    same_clock: bool,
    /// The host id of the target's metadata, once one arrived.
    target_host: Option<String>,
    pool: Pool,
    rows: Vec<Row>,
    json: Option<Box<dyn std::io::Write>>,
}

impl Bench {
    fn iters_for(&self, bytes: u64) -> usize {
        ((self.opts.budget / bytes.max(1)) as usize).clamp(self.opts.iters.0, self.opts.iters.1)
    }

    fn emit(&mut self, mut r: Row) -> anyhow::Result<()> {
        r.digest = self.opts.digest && r.kind.starts_with("ferry");
        if let Some(j) = &mut self.json {
            serde_json::to_writer(&mut *j, &r)?;
            j.write_all(b"\n")?;
            j.flush()?;
        }
        self.rows.push(r);
        Ok(())
    }

    async fn cold_start(&mut self, exe: Option<&Path>) -> anyhow::Result<Option<Row>> {
        // A fresh pair: a new target process (when we start it) and a new connector here.
        let Some(exe) = exe else { return Ok(None) };
        let fresh_peer =
            PeerProcess::spawn(exe, &["--listen", "127.0.0.1:0"], &target_env(&self.opts)).await?;
        let fresh = builder(&self.opts)
            .listen(any_port(&self.opts.listen)?)
            .build()
            .await?;
        let t = Instant::now();
        let mut r = Request::new(0, Cmd::Writable);
        r.sizes = vec![4096];
        r.reuse = true;
        let mut a = fresh_peer.request(r).await?;
        let m = a.expect("metadata").await?;
        let meta = RdmaMetadata::from_json(m.metadata.as_deref().unwrap_or_default())?;
        let o = fresh
            .begin_write(vec![vec![1u8; 4096].into()], &meta)
            .await?;
        o.wait_for_completion().await?;
        a.expect("done").await?;
        let d = t.elapsed();
        Ok(Some(row(
            "ferry",
            o.transport().map(|t| t.name()).unwrap_or("?"),
            "cold_start",
            4096,
            1,
            &mut [d],
            d,
        )))
    }
}

/// The host id `c` writes into its metadata.
async fn own_host_id(c: &Connector) -> anyhow::Result<String> {
    let probe = c.create_readable(vec![vec![0u8; 1].into()]).await?;
    Ok(probe.metadata().host_id().to_string())
}

/// A connector builder with the run's secret, if it has one.
fn builder(opts: &Options) -> ConnectorBuilder {
    let b = match &opts.secret {
        Some(s) => Connector::builder().secret(s),
        None => Connector::builder(),
    };
    // Only when asked: else `FERRY_DIGEST` decides, as for any connector.
    if opts.digest {
        b.digest(true)
    } else {
        b
    }
}

/// The environment of a target process this run starts.
fn target_env(opts: &Options) -> Vec<(&'static str, &str)> {
    let mut env: Vec<(&'static str, &str)> = opts
        .secret
        .iter()
        .map(|s| (ferry::SECRET_ENV, s.as_str()))
        .collect();
    if opts.device.as_deref() == Some("sim") {
        env.push((crate::gpu::SIMULATED_GPU_ENV, "1"));
    }
    if opts.digest {
        env.push((ferry::DIGEST_ENV, "1"));
    }
    env
}

/// `listen` with port 0: one more connector on the same address.
fn any_port(listen: &str) -> anyhow::Result<std::net::SocketAddr> {
    let mut a: std::net::SocketAddr = listen.parse()?;
    a.set_port(0);
    Ok(a)
}

fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn print_table(rows: &[Row]) {
    // As wide as the longest kind ("ferry cuda:0 transfer"), so that the
    // columns stay aligned.
    let w = rows.iter().map(|r| r.kind.len()).max().unwrap_or(0).max(11);
    let via = |r: &Row| match r.streams {
        Some(n) => format!("{} x{n}", r.transport),
        None => r.transport.clone(),
    };
    let v = rows.iter().map(|r| via(r).len()).max().unwrap_or(0).max(6);
    println!(
        "{:<w$} {:<v$} {:<10} {:>8} {:>5} {:>8} {:>10} {:>10} {:>10} {:>10}  vs baseline",
        "kind", "via", "op", "block", "batch", "GB/s", "ops/s", "avg us", "p50 us", "p99 us",
    );
    for r in rows {
        let vs = match (&r.baseline, r.ratio) {
            (Some(b), Some(x)) => format!("{x:.2}x {b}"),
            _ => String::new(),
        };
        println!(
            "{:<w$} {:<v$} {:<10} {:>8} {:>5} {:>8.3} {:>10.0} {:>10.1} {:>10.1} {:>10.1}  {}",
            r.kind,
            via(r),
            r.op,
            human(r.block_size),
            r.batch,
            r.gbps,
            r.ops_per_s,
            r.lat_us_avg,
            r.lat_us_p50,
            r.lat_us_p99,
            vs
        );
    }
}

/// Runs the initiator: against a target it starts (`control` = None) or one
/// serving on a control address.
pub async fn initiator(
    exe: &Path,
    control: Option<&str>,
    opts: Options,
) -> anyhow::Result<Vec<Row>> {
    let tcp = builder(&opts)
        .listen(opts.listen.parse()?)
        .transports(&[TransportKind::Tcp])
        .build()
        .await?;
    // The other connectors listen on the same address, on ports of their own.
    let other = any_port(&opts.listen)?;
    let cma = builder(&opts)
        .listen(other)
        .transports(&[TransportKind::Cma, TransportKind::Tcp])
        .cma_threshold(0)
        .build()
        .await?;
    let striped = builder(&opts)
        .listen(other)
        .transports(&[TransportKind::Tcp])
        .tcp_streams(STREAMS)
        .stripe_threshold(STRIPE_MIN)
        .build()
        .await?;
    let peer = match control {
        Some(addr) => PeerProcess::connect(addr).await?,
        None => PeerProcess::spawn(exe, &["--listen", "127.0.0.1:0"], &target_env(&opts)).await?,
    };
    let json: Option<Box<dyn std::io::Write>> = match &opts.json {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
        Some(p) => Some(Box::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
    };
    let mut b = Bench {
        opts: opts.clone(),
        peer,
        tcp,
        cma,
        striped,
        ucx: ucx::Side::start(&opts, other).await,
        same_clock: control.is_none(),
        target_host: None,
        pool: Pool::default(),
        rows: Vec::new(),
        json,
    };

    if let Some(d) = &opts.device {
        if d == "sim" {
            // SAFETY: no device descriptor exists yet in this process (the
            // sweeps before this make none), and the device sweep makes
            // them only through `buffers::device_buffer`.
            #[allow(unsafe_code)]
            unsafe {
                crate::gpu::simulate_gpu()
            };
        } else if let Err(why) = ferry::cuda::status() {
            anyhow::bail!("--device {d}: CUDA unavailable here: {why} (--device sim measures the staging path with host memory standing in)");
        }
        b.device_sweep().await?;
        return Ok(b.rows);
    }
    if opts.secret.is_some() || std::env::var_os(ferry::SECRET_ENV).is_some() {
        eprintln!("with a shared secret: every TCP connection is authenticated and encrypted");
    }
    if opts.digest {
        eprintln!("with --digest: every byte of every Ferry row is digested on both sides and compared (CRC-32)");
    }
    let cold = b.cold_start(control.is_none().then_some(exe)).await?;
    if let Some(r) = cold {
        b.emit(r)?;
    }

    let shapes: Vec<(u64, usize)> = opts
        .blocks
        .iter()
        .flat_map(|&bl| opts.batches.iter().map(move |&ba| (bl, ba)))
        .filter(|&(bl, ba)| bl * ba as u64 <= opts.max_op_bytes)
        .collect();
    // Cross-memory attach only between processes of one host that the
    // kernel lets attach to each other: find out with one operation.
    let attach = {
        let (_, _, r) = b.one(Lane::Cma, "read", 4096, 1).await?;
        let (_, _, w) = b.one(Lane::Cma, "write", 4096, 1).await?;
        r == Some(TransportKind::Cma) && w == Some(TransportKind::Cma)
    };
    if !attach {
        eprintln!("cross-memory attach is not possible with this target (other host, or refused by the kernel): TCP only");
    }
    // Same host (same kernel, such as another network namespace): the
    // library keeps one stream, so striping gets rows of its own (between
    // hosts the `tcp` rows are striped already).
    let own = own_host_id(&b.tcp).await?;
    let striped_rows = b.target_host.as_deref() == Some(own.as_str());
    // UCX only if both processes run it (both sides print why not).
    let with_ucx = b.ucx_probe().await;
    let per_op = 2 * (1 + usize::from(attach) + usize::from(with_ucx));
    let striped_shapes = shapes
        .iter()
        .filter(|&&(bl, ba)| striped_rows && bl * ba as u64 >= STRIPE_MIN)
        .count();
    let total = shapes.len() * (1 + 2 * per_op) + 2 * striped_shapes;
    let mut done = 0;
    let mut progress = |what: &str, op: &str, block: u64, batch: usize| {
        done += 1;
        eprint!(
            "\r[{done:>3}/{total}] {op:<5} {:>7} x{batch:<3} {what:<12}",
            human(block)
        );
    };
    for &(block, batch) in &shapes {
        progress("memcpy", "copy", block, batch);
        let m = b.memcpy_row(block, batch)?;
        b.emit(m)?;
        for op in ["read", "write"] {
            let mut pairs = vec![(Lane::Tcp, "tcp_stream")];
            if attach {
                pairs.insert(0, (Lane::Cma, "cma"));
            }
            if with_ucx {
                pairs.push((Lane::Ucx, "ucx_get"));
            }
            for (via, base_name) in pairs {
                let name = match via {
                    Lane::Cma => "ferry cma",
                    Lane::Ucx => "ferry ucx",
                    _ => "ferry tcp",
                };
                let striped =
                    via == Lane::Tcp && striped_rows && block * batch as u64 >= STRIPE_MIN;
                progress(base_name, op, block, batch);
                progress(name, op, block, batch);
                if striped {
                    progress("ferry tcp x4", op, block, batch);
                }
                for r in b.pair(via, op, block, batch, striped).await? {
                    b.emit(r)?;
                }
            }
        }
    }
    eprintln!("\r{:<60}", "sweep done");

    // Idle cost: CPU time of both processes over an idle period.
    let cpu = |ev: peer::Event| ev.micros.unwrap_or(0);
    let before_peer = cpu(b
        .peer
        .request(Request::new(0, Cmd::CpuTime))
        .await?
        .expect("cpu")
        .await?);
    let before_self = peer::process_cpu_micros();
    tokio::time::sleep(opts.idle).await;
    let after_peer = cpu(b
        .peer
        .request(Request::new(0, Cmd::CpuTime))
        .await?
        .expect("cpu")
        .await?);
    let after_self = peer::process_cpu_micros();

    print_table(&b.rows);
    println!("{}", buffers_line());
    if opts.digest {
        println!(
            "digest: on for every ferry row, both sides (CRC-32 of every byte, compared before COMPLETE); \
             its cost: these rows against the same rows of a run without --digest (the baselines do not digest)"
        );
    }
    ucx::print_lines(b.ucx.as_ref(), &b.rows);
    println!(
        "idle: over {:?} with connections open, the target used {} ms of CPU and this process {} ms (the clock ticks in 10 ms steps)",
        opts.idle,
        after_peer.saturating_sub(before_peer) / 1000,
        after_self.saturating_sub(before_self) / 1000
    );
    Ok(b.rows)
}

/// How the run's buffers were allocated, and what the kernel does with
/// huge-page advice (`/sys/kernel/mm/transparent_hugepage/enabled`).
fn buffers_line() -> String {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!(
        "buffers: on both sides (and for every baseline) allocated as NumPy allocates large arrays: \
         anonymous page-aligned mappings advised MADV_HUGEPAGE, written once (THP: {thp})"
    )
}

/// Runs the target: serves the peer protocol to one initiator on `control`,
/// with a shared secret if `secret` is set (else `FERRY_SECRET`, if set).
/// Its connector listens on `listen`; on all interfaces (`0.0.0.0`), it
/// listens instead on the address the initiator connected to.
pub async fn target(control: &str, listen: &str, secret: Option<&str>) -> anyhow::Result<()> {
    let l = tokio::net::TcpListener::bind(control)
        .await
        .with_context(|| format!("binding the control address {control}"))?;
    eprintln!("target: waiting for an initiator on {}", l.local_addr()?);
    let (s, from) = l.accept().await?;
    eprintln!("target: initiator {from} connected");
    s.set_nodelay(true)?;
    let mut listen: std::net::SocketAddr = listen.parse()?;
    if listen.ip().is_unspecified() {
        // Listen where the initiator reached this host: an address it can
        // reach by construction, and the one the metadata then advertises
        // (the host name's addresses may lie elsewhere, such as in another
        // network namespace of the same machine).
        listen.set_ip(s.local_addr()?.ip());
    }
    let (r, w) = s.into_split();
    let mut b = Connector::builder().listen(listen);
    if let Some(s) = secret {
        b = b.secret(s);
    }
    // The UCX lane's connector listens on the same address, another port.
    let mut other = listen;
    other.set_port(0);
    let ucx = b.clone().listen(other);
    peer::run_on(b.build().await?, Some(ucx), r, w).await
}
