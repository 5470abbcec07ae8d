//! `ferry bench --workload kv`: KV-cache shapes between two processes.
//!
//! Each shape is a number of blocks of one size, taken from a pool on each
//! side (allocated as NumPy allocates large arrays: page-aligned, advised
//! for transparent huge pages, see `Pool::allocate`), with block ids that
//! differ on the two sides. Rows, per transport (`cma` on one host, `tcp`):
//!
//! - `contiguous`: the same bytes as one plain descriptor on each side (one
//!   buffer of blocks × block bytes, allocated the same way, its blocks in
//!   order): one contiguous operation, the baseline each shape is compared
//!   with;
//! - the shape itself with 1, 8 and 32 requests in flight, the blocks split
//!   evenly between them (each request its own operation).
//!
//! Columns: GB/s and blocks per second over the wall time from the first
//! operation's creation to the last one's completion (median of the
//! rounds; a shape's rows take turns with its contiguous row, round by
//! round, so that the machine's drift weighs on the two alike); the
//! metadata's JSON bytes; the time to create one operation
//! (taking the blocks from the pool and `begin_read`/`begin_write` until
//! it returns); the median end-to-end latency of one operation.
//!
//! The target is `ferry kv-target`, driven by JSON lines on stdin.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Context};
use ferry::{Connector, Pool, RdmaMetadata, TransportKind};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::Mutex;

mod raw;
mod target;

pub use target::target;

/// One KV-cache shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Its name in the rows.
    pub name: &'static str,
    /// Bytes per block.
    pub block: usize,
    /// Blocks per transfer.
    pub blocks: u32,
    /// READ (the decode side pulls) or WRITE (the prefill side pushes).
    pub write: bool,
    /// Block ids in shuffled runs of this many that follow each other
    /// (1: every id on its own).
    pub run: u32,
}

/// The shapes of the issue (see `research/field.md`).
pub const SHAPES: [Shape; 6] = [
    Shape {
        name: "kv-vllm",
        block: 32 << 10,
        blocks: 16_384,
        write: false,
        run: 1,
    },
    Shape {
        name: "kv-vllm-write",
        block: 32 << 10,
        blocks: 16_384,
        write: true,
        run: 1,
    },
    Shape {
        name: "kv-tp8",
        block: 4 << 10,
        blocks: 16_384,
        write: false,
        run: 1,
    },
    Shape {
        name: "kv-cross-layer",
        block: 2 << 20,
        blocks: 256,
        write: false,
        run: 1,
    },
    Shape {
        name: "kv-sglang-page1-runs",
        block: 2 << 10,
        blocks: 262_144,
        write: true,
        run: 64,
    },
    Shape {
        name: "kv-sglang-page1",
        block: 2 << 10,
        blocks: 262_144,
        write: true,
        run: 1,
    },
];

/// One request to the target.
#[derive(Debug, Serialize, Deserialize)]
struct Req {
    id: u64,
    write: bool,
    block: usize,
    blocks: u32,
    /// Block ids: a permutation of the pool's (seeded), this slice of it.
    seed: u64,
    run: u32,
    from: u32,
    to: u32,
    /// WRITE: check, once written, that each block holds the initiator's
    /// block sent to it (the initiator's ids: seed `seed ^ LOCAL`).
    #[serde(default)]
    verify: bool,
    /// One plain descriptor of all the blocks' bytes instead of blocks of
    /// the pool (the `contiguous` rows; `seed`, `run`, `from`, `to` unused).
    #[serde(default)]
    contiguous: bool,
    /// Where the contiguous READ buffer of the shape lies in the target
    /// (`"<pid> <address>"`), for the raw baseline (see `raw.rs`).
    #[serde(default)]
    raw: bool,
}

/// One plain buffer of `blocks` blocks of `block` bytes (see
/// [`host_buffer`](crate::buffers::host_buffer)): block `k` filled as
/// [`fill_block`] fills block id `k` for a source, with `0xff` (written,
/// so that its pages are real, and unlike any block) for a destination.
fn contiguous_buffer(
    block: usize,
    blocks: u32,
    source: bool,
) -> anyhow::Result<ferry::Descriptor<'static>> {
    let mut d = crate::buffers::host_buffer(block * blocks as usize)?;
    let b = d.as_mut_slice().unwrap_or_default();
    if source {
        for (k, c) in b.chunks_exact_mut(block).enumerate() {
            fill_block(c, k as u32);
        }
    } else {
        b.fill(0xff);
    }
    Ok(d)
}

/// Whether the contiguous buffer `d` holds blocks `0..` in order.
fn verify_contiguous(d: &ferry::Descriptor<'_>, block: usize) -> anyhow::Result<()> {
    let b = d.as_slice().unwrap_or_default();
    for (k, c) in b.chunks_exact(block).enumerate() {
        if !block_ok(c, k as u32) {
            return Err(anyhow!(
                "block {k} of the contiguous buffer is not the source's"
            ));
        }
    }
    Ok(())
}

/// What the initiator's seed differs by from the target's.
const LOCAL: u64 = 0xa5a5;

/// Fills block `id`: its id in the first eight bytes, the rest `id as u8`.
pub fn fill_block(b: &mut [u8], id: u32) {
    b.fill(id as u8);
    let n = b.len().min(8);
    b[..n].copy_from_slice(&u64::from(id).to_le_bytes()[..n]);
}

/// Whether `b` holds what [`fill_block`] puts in block `id`.
pub fn block_ok(b: &[u8], id: u32) -> bool {
    let n = b.len().min(8);
    b[..n] == u64::from(id).to_le_bytes()[..n] && b[n..].iter().all(|&x| x == id as u8)
}

/// Whether blocks `dst` of `pool` hold blocks `src` of the other side.
fn verify(pool: &Pool, dst: &[u32], src: &[u32]) -> anyhow::Result<()> {
    for (k, (&d, &s)) in dst.iter().zip(src).enumerate() {
        if !pool.with_block(d, |b| block_ok(b, s))? {
            return Err(anyhow!(
                "block {d} (entry {k}) does not hold block {s} of the other side"
            ));
        }
    }
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    id: u64,
    #[serde(default)]
    metadata: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    done: bool,
}

/// A deterministic permutation of `0..n` in shuffled runs of `run` ids
/// that follow each other (seeded xorshift).
pub fn ids(n: u32, run: u32, seed: u64) -> Vec<u32> {
    let run = run.max(1);
    let mut starts: Vec<u32> = (0..n.div_ceil(run)).map(|i| i * run).collect();
    let mut s = seed | 1;
    for i in (1..starts.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        starts.swap(i, (s % (i as u64 + 1)) as usize);
    }
    starts
        .into_iter()
        .flat_map(|a| a..(a + run).min(n))
        .collect()
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct KvRow {
    /// The shape, or `<shape>/contiguous`.
    pub shape: String,
    /// The transport that carried it.
    pub transport: String,
    /// `read` or `write`.
    pub op: &'static str,
    /// Requests in flight.
    pub inflight: usize,
    /// Blocks per transfer (all requests).
    pub blocks: u32,
    /// Bytes per block.
    pub block: usize,
    /// GB/s over the wall time.
    pub gbps: f64,
    /// Blocks per second over the wall time.
    pub blocks_per_s: f64,
    /// Metadata JSON bytes of one request.
    pub metadata_bytes: usize,
    /// Microseconds to create one operation (median).
    pub create_us: f64,
    /// Median end-to-end latency of one request, microseconds.
    pub lat_us_p50: f64,
    /// `gbps` over the contiguous row of the same shape and transport.
    pub ratio: Option<f64>,
}

struct Target {
    stdin: tokio::process::ChildStdin,
    answers: Arc<Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Answer>>>>,
    next: u64,
    _child: tokio::process::Child,
}

impl Target {
    async fn spawn(exe: &Path, transport: TransportKind) -> anyhow::Result<Target> {
        let mut child = Command::new(exe)
            .arg("kv-target")
            .env(
                "FERRY_TRANSPORTS",
                match transport {
                    TransportKind::Tcp => "tcp".to_string(),
                    t => format!("{t},tcp"),
                },
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting ferry kv-target")?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let answers: Arc<Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Answer>>>> =
            Arc::default();
        let a = answers.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(ans) = serde_json::from_str::<Answer>(&l) {
                    // Metadata answers carry id*2, completions id*2+1.
                    let key = ans.id * 2 + u64::from(ans.done);
                    if let Some(tx) = a.lock().await.remove(&key) {
                        let _ = tx.send(ans);
                    }
                }
            }
        });
        Ok(Target {
            stdin,
            answers,
            next: 1,
            _child: child,
        })
    }

    /// Sends `r` (its id set here); answers the metadata and a receiver
    /// for the completion.
    async fn request(
        &mut self,
        mut r: Req,
    ) -> anyhow::Result<(String, tokio::sync::oneshot::Receiver<Answer>)> {
        r.id = self.next;
        self.next += 1;
        let (mtx, mrx) = tokio::sync::oneshot::channel();
        let (dtx, drx) = tokio::sync::oneshot::channel();
        {
            let mut a = self.answers.lock().await;
            a.insert(r.id * 2, mtx);
            a.insert(r.id * 2 + 1, dtx);
        }
        let mut line = serde_json::to_vec(&r)?;
        line.push(b'\n');
        self.stdin.write_all(&line).await?;
        self.stdin.flush().await?;
        let m = mrx.await.map_err(|_| anyhow!("the kv target exited"))?;
        match (m.metadata, m.error) {
            (Some(m), _) => Ok((m, drx)),
            (None, e) => Err(anyhow!("kv target: {}", e.unwrap_or_default())),
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// What the rounds of one row measured.
#[derive(Default)]
struct Rounds {
    walls: Vec<f64>,
    creates: Vec<f64>,
    lats: Vec<f64>,
    meta_bytes: usize,
}

impl Rounds {
    /// The row: medians over the rounds.
    fn row(mut self, shape: String, transport: TransportKind, s: &Shape, inflight: usize) -> KvRow {
        let wall = median(&mut self.walls);
        let n = s.blocks as usize;
        KvRow {
            shape,
            transport: transport.to_string(),
            op: if s.write { "write" } else { "read" },
            inflight,
            blocks: s.blocks,
            block: s.block,
            gbps: (s.block * n) as f64 / wall / 1e9,
            blocks_per_s: n as f64 / wall,
            metadata_bytes: self.meta_bytes,
            create_us: median(&mut self.creates),
            lat_us_p50: median(&mut self.lats),
            ratio: None,
        }
    }
}

/// Round `round` of shape `s` at `inflight` requests over `target` (the
/// first checks every byte), added to `acc`.
#[allow(clippy::too_many_arguments)]
async fn measure(
    c: &Connector,
    target: &mut Target,
    pool: &Pool,
    s: &Shape,
    inflight: usize,
    round: usize,
    transport: TransportKind,
    acc: &mut Rounds,
) -> anyhow::Result<()> {
    let Rounds {
        walls,
        creates,
        lats,
        meta_bytes,
    } = acc;
    let (run, n) = (s.run, s.blocks as usize);
    {
        let seed = 0x5eed + round as u64;
        let local_ids = ids(s.blocks, run, seed ^ LOCAL);
        let remote_ids = ids(s.blocks, run, seed);
        // The first round checks every byte (READ here, WRITE at the target).
        let check = round == 0;
        let per = n.div_ceil(inflight);
        // The target's metadata first (a side channel's work, not timed).
        let mut metas = Vec::new();
        for k in 0..inflight {
            let (from, to) = ((k * per).min(n) as u32, ((k + 1) * per).min(n) as u32);
            let req = Req {
                id: 0,
                write: s.write,
                block: s.block,
                blocks: s.blocks,
                seed,
                run,
                from,
                to,
                verify: check && s.write,
                contiguous: false,
                raw: false,
            };
            let (m, done) = target.request(req).await?;
            *meta_bytes = m.len();
            metas.push((RdmaMetadata::from_json(&m)?, done, from, to));
        }
        let start = Instant::now();
        let mut ops = Vec::new();
        for (m, done, from, to) in metas {
            let t0 = Instant::now();
            let mine = &local_ids[from as usize..to as usize];
            let op: Box<dyn ferry::Operation<'static>> = if s.write {
                Box::new(c.begin_write(vec![pool.shared_blocks(mine)?], &m).await?)
            } else {
                Box::new(c.begin_read(&m, vec![pool.blocks(mine)?]).await?)
            };
            creates.push(t0.elapsed().as_secs_f64() * 1e6);
            ops.push((t0, op, done));
        }
        for (t0, op, _) in &ops {
            op.wait_for_completion().await?;
            lats.push(t0.elapsed().as_secs_f64() * 1e6);
            if op.transport() != Some(transport) {
                return Err(anyhow!("{} carried by {:?}", s.name, op.transport()));
            }
        }
        walls.push(start.elapsed().as_secs_f64());
        let mut dones = Vec::new();
        for (_, op, done) in ops {
            drop(op);
            dones.push(done);
        }
        if check && !s.write {
            verify(pool, &local_ids, &remote_ids)?;
        }
        for done in dones {
            let a = done.await.map_err(|_| anyhow!("the kv target exited"))?;
            if let Some(e) = a.error {
                return Err(anyhow!("kv target: {e}"));
            }
        }
    }
    Ok(())
}

/// Which shapes and transports [`run`] measures: empty lists mean all.
#[derive(Debug, Clone, Default)]
pub struct Only {
    /// Shape names (see [`SHAPES`]).
    pub shapes: Vec<String>,
    /// Transports, among `cma` and `tcp`.
    pub transports: Vec<TransportKind>,
}

/// Round `round` of the `contiguous` row of shape `s`: the same bytes as
/// one plain descriptor on each side, `mine` here (the first round checks
/// every byte), added to `acc`.
async fn measure_contiguous(
    c: &Connector,
    target: &mut Target,
    s: &Shape,
    round: usize,
    transport: TransportKind,
    mine: &mut Option<ferry::Descriptor<'static>>,
    acc: &mut Rounds,
) -> anyhow::Result<()> {
    let check = round == 0;
    let req = Req {
        id: 0,
        write: s.write,
        block: s.block,
        blocks: s.blocks,
        seed: 0,
        run: s.blocks,
        from: 0,
        to: s.blocks,
        verify: check && s.write,
        contiguous: true,
        raw: false,
    };
    let (m, done) = target.request(req).await?;
    acc.meta_bytes = m.len();
    let m = RdmaMetadata::from_json(&m)?;
    let d = mine
        .take()
        .ok_or_else(|| anyhow!("the buffer was not handed back"))?;
    let start = Instant::now();
    let op: Box<dyn ferry::Operation<'static>> = if s.write {
        Box::new(c.begin_write(vec![d], &m).await?)
    } else {
        Box::new(c.begin_read(&m, vec![d]).await?)
    };
    acc.creates.push(start.elapsed().as_secs_f64() * 1e6);
    op.wait_for_completion().await?;
    let wall = start.elapsed().as_secs_f64();
    acc.walls.push(wall);
    acc.lats.push(wall * 1e6);
    if op.transport() != Some(transport) {
        return Err(anyhow!("{} carried by {:?}", s.name, op.transport()));
    }
    let d = op.into_descriptors().pop();
    if check && !s.write {
        if let Some(d) = &d {
            verify_contiguous(d, s.block)?;
        }
    }
    *mine = d;
    let a = done.await.map_err(|_| anyhow!("the kv target exited"))?;
    if let Some(e) = a.error {
        return Err(anyhow!("kv target: {e}"));
    }
    Ok(())
}

/// Runs the KV workload and prints its rows (and writes them as JSON lines
/// to `json`, if given).
pub async fn run(
    exe: &Path,
    quick: bool,
    inflights: &[usize],
    only: &Only,
    mut json: Option<Box<dyn std::io::Write>>,
) -> anyhow::Result<Vec<KvRow>> {
    let rounds = if quick { 2 } else { 5 };
    let shapes: Vec<Shape> = if quick {
        // READ and WRITE, small enough for CI.
        let small_write = Shape {
            name: "kv-sglang-page1-runs/16k",
            blocks: 16_384,
            ..SHAPES[4]
        };
        vec![SHAPES[2], small_write]
    } else {
        SHAPES.to_vec()
    };
    let shapes: Vec<Shape> = if only.shapes.is_empty() {
        shapes
    } else {
        let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        if let Some(bad) = only.shapes.iter().find(|n| !names.contains(&n.as_str())) {
            return Err(anyhow!(
                "unknown shape {bad:?}: one of {}",
                names.join(", ")
            ));
        }
        SHAPES
            .into_iter()
            .filter(|s| only.shapes.iter().any(|n| n == s.name))
            .collect()
    };
    let mut rows = Vec::new();
    println!(
        "{:<28} {:<5} {:<5} {:>8} {:>9} {:>8} {:>12} {:>9} {:>10} {:>11}",
        "shape",
        "via",
        "op",
        "inflight",
        "GB/s",
        "vs contig",
        "blocks/s",
        "meta B",
        "create us",
        "lat p50 us"
    );
    for transport in [TransportKind::Cma, TransportKind::Tcp] {
        if !only.transports.is_empty() && !only.transports.contains(&transport) {
            continue;
        }
        let mut target = Target::spawn(exe, transport).await?;
        let only: &[TransportKind] = match transport {
            TransportKind::Tcp => &[TransportKind::Tcp],
            t => &[t, TransportKind::Tcp],
        };
        let c = Connector::builder().transports(only).build().await?;
        for s in &shapes {
            let pool = Pool::allocate(s.block * s.blocks as usize, s.block)?;
            for id in 0..s.blocks {
                pool.with_block_mut(id, |b| fill_block(b, id))?;
            }
            let mut shape_rows = Vec::new();
            if transport == TransportKind::Cma {
                let req = Req {
                    id: 0,
                    write: false,
                    block: s.block,
                    blocks: s.blocks,
                    seed: 0,
                    run: s.run,
                    from: 0,
                    to: s.blocks,
                    verify: false,
                    contiguous: false,
                    raw: true,
                };
                let (at, _) = target.request(req).await?;
                let src = raw::Source::parse(&at)?;
                let s = *s;
                let rows =
                    tokio::task::spawn_blocking(move || raw::measure(&src, &s, rounds)).await??;
                shape_rows.extend(rows);
            }
            // The contiguous reference and the paged rows take turns, round
            // by round, so that the machine's drift (up to 2x within an
            // hour here) weighs on both alike.
            let mut mine = Some(contiguous_buffer(s.block, s.blocks, s.write)?);
            let mut base = Rounds::default();
            let mut paged: Vec<Rounds> = inflights.iter().map(|_| Rounds::default()).collect();
            for round in 0..rounds {
                measure_contiguous(&c, &mut target, s, round, transport, &mut mine, &mut base)
                    .await?;
                for (&k, acc) in inflights.iter().zip(&mut paged) {
                    measure(&c, &mut target, &pool, s, k, round, transport, acc).await?;
                }
            }
            let base = base.row(format!("{}/contiguous", s.name), transport, s, 1);
            shape_rows.push(base.clone());
            for (&k, acc) in inflights.iter().zip(paged) {
                let mut r = acc.row(s.name.to_string(), transport, s, k);
                r.ratio = Some(r.gbps / base.gbps);
                shape_rows.push(r);
            }
            for r in shape_rows {
                println!(
                    "{:<28} {:<5} {:<5} {:>8} {:>9.2} {:>8} {:>12.0} {:>9} {:>10.0} {:>11.0}",
                    r.shape,
                    r.transport,
                    r.op,
                    r.inflight,
                    r.gbps,
                    r.ratio.map_or("-".to_string(), |x| format!("{x:.2}")),
                    r.blocks_per_s,
                    r.metadata_bytes,
                    r.create_us,
                    r.lat_us_p50
                );
                if let Some(j) = &mut json {
                    serde_json::to_writer(&mut *j, &r)?;
                    writeln!(j)?;
                }
                rows.push(r);
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_a_permutation_in_runs() {
        let v = ids(1000, 64, 3);
        let mut sorted = v.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(v, sorted, "shuffled");
        assert_eq!(
            ids(10, 10, 9),
            (0..10).collect::<Vec<_>>(),
            "one run: in order"
        );
        let runs = v.windows(2).filter(|w| w[1] != w[0] + 1).count();
        assert!(runs < 1000 / 64 + 1, "{runs} breaks");
    }

    #[test]
    fn blocks_are_told_apart() {
        let mut b = vec![0u8; 100];
        fill_block(&mut b, 300);
        assert!(block_ok(&b, 300));
        assert!(!block_ok(&b, 44), "same low byte, other id");
        b[99] ^= 1;
        assert!(!block_ok(&b, 300));
        let mut tiny = [0u8; 3];
        fill_block(&mut tiny, 0x010203);
        assert!(block_ok(&tiny, 0x010203));
    }
}
