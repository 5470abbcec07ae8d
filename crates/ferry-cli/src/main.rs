use std::net::SocketAddr;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

mod sandbox;

/// Ferry: move memory between the workers of an inference graph.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

// Parsed once at start-up: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Start a peer process, let it read a buffer from this one and write it back, and print what moved and how fast.
    Demo {
        /// Bytes to move, e.g. 64MiB, 4KiB or 1000.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        size: u64,
        /// Split the buffer into this many descriptors.
        #[arg(long, default_value_t = 1)]
        descriptors: usize,
    },
    /// Measure bandwidth, operation rate and latency between two processes, with baselines.
    Bench {
        /// A short sweep that finishes in under a minute.
        #[arg(long)]
        quick: bool,
        /// `initiator` (default: measures; starts a target itself unless --control is given) or `target`.
        #[arg(long, default_value = "initiator")]
        role: String,
        /// The target's control address (initiator: where to connect; target: where to listen).
        #[arg(long)]
        control: Option<String>,
        /// This process's connector listen address (use 0.0.0.0:0 between
        /// hosts: a target then listens on the address the initiator reached).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Block sizes, e.g. 4KiB,1MiB,64MiB.
        #[arg(long, value_delimiter = ',', value_parser = parse_size)]
        blocks: Vec<u64>,
        /// Descriptors per operation, e.g. 1,16,64.
        #[arg(long, value_delimiter = ',')]
        batches: Vec<usize>,
        /// Also write one JSON object per measured row to this file (`-`: stdout).
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Also draw the run as an SVG picture here: GB/s and latency
        /// (p50, p99) against block size, per transport, with the baselines.
        #[arg(long)]
        plot: Option<std::path::PathBuf>,
        /// A shared secret for both processes (authenticated, encrypted
        /// connections); default: FERRY_SECRET, if set. Give the target the
        /// same one.
        #[arg(long)]
        secret: Option<String>,
        /// `sweep` (block sizes and batches, the default), `kv` (KV-cache
        /// shapes: paged descriptors, see `ferry_cli::kv`) or `grant`
        /// (one-sided operations on a standing grant, next to per-operation
        /// capabilities and raw copies: see `ferry_cli::grantbench`).
        #[arg(long, default_value = "sweep")]
        workload: String,
        /// For `--workload kv` and `grant`: requests in flight, e.g. 1,8,32.
        #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 8, 32])]
        inflight: Vec<usize>,
        /// For `--workload kv` and `grant`: only these shapes, e.g. kv-vllm,kv-tp8
        /// (default: all; `--quick` picks its own unless this is given).
        #[arg(long, value_delimiter = ',')]
        shapes: Vec<String>,
        /// For `--workload kv`: only these transports, among cma and tcp
        /// (default: both); for `--faults`: among tcp, cma and ucx.
        #[arg(long, value_delimiter = ',')]
        via: Vec<ferry::TransportKind>,
        /// For the sweep: GPU memory on both sides, `cuda:N` (or `sim`:
        /// host memory standing in for a GPU, to measure the staging path
        /// without one). Measures Ferry over TCP with device memory
        /// (staged through host memory) against Ferry over TCP with host
        /// memory, turn by turn, and the device's copies; on a GPU also
        /// CUDA IPC against `cuMemcpyDtoD`.
        #[arg(long)]
        device: Option<String>,
        /// Inject faults mid-transfer instead (kill, stop, cut, restart,
        /// control-plane restart) and measure each side's time to its final
        /// state, its cause, the bytes that land after the end and the next
        /// operation; with --quick: 4 KiB, tcp and cma, kill and stop.
        #[arg(long)]
        faults: bool,
        /// For --faults: the liveness bound in ms, set as FERRY_LIVENESS_MS
        /// in both processes (default: FERRY_LIVENESS_MS if set, else 1000;
        /// 500 with --quick).
        #[arg(long)]
        liveness_ms: Option<u64>,
        /// Digest every byte of every Ferry operation on both sides and
        /// compare before it completes (`FERRY_DIGEST=1` in the target this
        /// run starts; give a target on another host `FERRY_DIGEST=1`):
        /// compare the rows with those of a run without it for its cost.
        #[arg(long)]
        digest: bool,
    },
    /// The target of `ferry bench --workload kv` (JSON lines on stdin).
    #[command(hide = true)]
    KvTarget,
    /// The owner process of `ferry bench --workload grant` (JSON lines on stdin).
    #[command(hide = true)]
    GrantTarget,
    /// Run a worker driven by JSON lines on stdin (used by demo, bench and tests).
    Peer {
        /// Where to listen.
        #[arg(long, default_value = "0.0.0.0:0")]
        listen: SocketAddr,
        /// This worker's id (default: random).
        #[arg(long)]
        worker_id: Option<String>,
        /// Refuse cross-memory attach with a seccomp filter, as a default
        /// container profile does (for tests of the fallback).
        #[arg(long)]
        deny_cma: bool,
    },
    /// Check a metadata JSON document read from stdin and print what it grants (never the token).
    Inspect,
    /// Say what this machine offers Ferry: CUDA, UCX (and whether it moves GPU memory), cross-memory attach.
    Status,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((s, 1));
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size like 4096, 4KiB, 64MiB or 1GiB"))
}

/// `ferry bench --faults`.
async fn run_faults(
    quick: bool,
    liveness_ms: Option<u64>,
    via: &[ferry::TransportKind],
    json: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    use ferry_cli::bench::faults;
    let from_env = std::env::var(faults::LIVENESS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    let ms = liveness_ms
        .or(from_env)
        .unwrap_or(if quick { 500 } else { 1000 });
    let bound = std::time::Duration::from_millis(ms);
    if let Some(code) = faults::restart_with_bound(bound)? {
        std::process::exit(code);
    }
    let mut opts = if quick {
        faults::Options::quick(bound)
    } else {
        faults::Options::full(bound)
    };
    if !via.is_empty() {
        opts.lanes = via
            .iter()
            .map(|t| match t {
                ferry::TransportKind::Tcp => Ok(faults::Lane::Tcp),
                ferry::TransportKind::Cma => Ok(faults::Lane::Cma),
                ferry::TransportKind::Ucx => Ok(faults::Lane::Ucx),
                other => anyhow::bail!("--faults runs over tcp, cma and ucx, not {other}"),
            })
            .collect::<anyhow::Result<_>>()?;
    }
    opts.json = json;
    let exe = std::env::current_exe()?;
    faults::run(&exe, opts).await.map(drop)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("FERRY_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.cmd.unwrap_or(Cmd::Demo {
        size: 64 << 20,
        descriptors: 1,
    }) {
        Cmd::KvTarget => {
            let c = ferry::Connector::builder().build().await?;
            ferry_cli::kv::target(c).await
        }
        Cmd::GrantTarget => {
            let c = ferry::Connector::builder().build().await?;
            ferry_cli::grantbench::target(c).await
        }
        Cmd::Demo { size, descriptors } => {
            let exe = std::env::current_exe()?;
            ferry_cli::demo::run(&exe, size, descriptors).await
        }
        Cmd::Bench {
            quick,
            role,
            control,
            listen,
            blocks,
            batches,
            json,
            plot,
            secret,
            workload,
            inflight,
            shapes,
            via,
            device,
            faults,
            liveness_ms,
            digest,
        } => {
            if faults {
                return run_faults(quick, liveness_ms, &via, json).await;
            }
            if workload == "kv" {
                let exe = std::env::current_exe()?;
                let out: Option<Box<dyn std::io::Write>> = match &json {
                    None => None,
                    Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
                    Some(p) => Some(Box::new(std::fs::File::create(p)?)),
                };
                let only = ferry_cli::kv::Only {
                    shapes,
                    transports: via,
                };
                return ferry_cli::kv::run(&exe, quick, &inflight, &only, out)
                    .await
                    .map(drop);
            }
            if workload == "grant" {
                let exe = std::env::current_exe()?;
                let json: Option<Box<dyn std::io::Write>> = match &json {
                    None => None,
                    Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
                    Some(p) => Some(Box::new(std::fs::File::create(p)?)),
                };
                let opts = ferry_cli::grantbench::Options {
                    quick,
                    sizes: blocks,
                    inflight,
                    shapes,
                    json,
                };
                return ferry_cli::grantbench::run(&exe, opts).await.map(drop);
            }
            if workload != "sweep" {
                anyhow::bail!("unknown workload {workload:?}: sweep, kv or grant");
            }
            let mut opts = if quick {
                ferry_cli::bench::Options::quick()
            } else {
                ferry_cli::bench::Options::full()
            };
            if !blocks.is_empty() {
                // Blocks asked for by name run at least once (batch 1),
                // however large.
                let largest = blocks.iter().copied().max().unwrap_or(0);
                opts.max_op_bytes = opts.max_op_bytes.max(largest);
                opts.blocks = blocks;
            }
            if !batches.is_empty() {
                opts.batches = batches;
            }
            opts.json = json;
            opts.listen = listen.clone();
            opts.secret = secret.clone();
            opts.device = device;
            opts.digest = digest;
            match role.as_str() {
                "initiator" => {
                    let exe = std::env::current_exe()?;
                    let rows = ferry_cli::bench::initiator(&exe, control.as_deref(), opts).await?;
                    if let Some(path) = plot {
                        ferry_cli::plot::write(&rows, &path)?;
                        eprintln!("plot written to {}", path.display());
                    }
                    Ok(())
                }
                "target" => {
                    let control = control.as_deref().unwrap_or("0.0.0.0:7000");
                    ferry_cli::bench::target(control, &listen, secret.as_deref()).await
                }
                other => anyhow::bail!("--role must be initiator or target, not {other:?}"),
            }
        }
        Cmd::Peer {
            listen,
            worker_id,
            deny_cma,
        } => {
            if deny_cma {
                sandbox::deny_cross_memory_attach()?;
            }
            // SAFETY: at the start of the peer process, before any device
            // descriptor; the peer describes device memory only through
            // `buffers::device_buffer`.
            unsafe { ferry_cli::gpu::simulate_gpu_if_asked() };
            let mut b = ferry::Connector::builder().listen(listen);
            if let Some(id) = worker_id {
                b = b.worker_id(id);
            }
            let ucx = ferry::Connector::builder().listen(SocketAddr::new(listen.ip(), 0));
            ferry_cli::peer::run(b.build().await?, Some(ucx)).await
        }
        Cmd::Status => {
            println!("{}", ferry_cli::status::report());
            Ok(())
        }
        Cmd::Inspect => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
            let m = ferry::RdmaMetadata::from_json(s.trim())?;
            println!("{m:#?}");
            Ok(())
        }
    }
}
