//! What the bench and its owner process (`ferry grant-target`) say to each
//! other: one JSON line per request on the owner's stdin, one or two JSON
//! lines per answer on its stdout, matched by id.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{oneshot, Mutex};

/// What the owner is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum Cmd {
    /// Allocate a pool of `blocks` blocks of `block` bytes (replacing the
    /// last one and dropping the grants over it), block `k` filled as
    /// [`fill_block`](crate::kv::fill_block) fills id `k`; answers its
    /// `pid` and `base` address.
    #[default]
    Pool,
    /// Grant the pool to `holder` (READ and WRITE), as grant `tag`, with
    /// `spin_us` of spinning before parking (low-latency mode) if given;
    /// answers its `metadata`, and records the latency of each write's
    /// notification (see [`Cmd::Notes`]).
    Grant,
    /// Revoke and drop every grant.
    Revoke,
    /// Today's per-operation capability over blocks `ids` of the pool:
    /// READABLE (`write` false) or WRITABLE; answers `metadata` and
    /// `created_ns`, then (a second line) `done_ns` or `error`.
    PerOp,
    /// Answers (and forgets) the notification latencies recorded since
    /// the last `notes`, in nanoseconds: the arrival on the owner's clock
    /// less the post time the payload carries.
    Notes,
    /// Sleeps `idle_ms` and answers the CPU time this process used
    /// meanwhile, in nanoseconds, all its threads (the sleep's own timer
    /// and the connector's included), and its grants' notification
    /// threads' alone.
    Idle,
    /// Checks that blocks `ids` hold what `fill_block` puts in blocks
    /// `expect` (a WRITE's result); answers `error` if not.
    Check,
    /// Zeroes blocks `ids` (what no block is filled with), so that a
    /// [`Cmd::Check`] after the next WRITEs sees their bytes, not what
    /// earlier rows left.
    Wipe,
}

/// Block ids: listed, or a slice of a seeded permutation
/// ([`ids`](crate::kv::ids)`(blocks, run, seed)[from..to]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Ids {
    /// These ids.
    List(Vec<u32>),
    /// `ids(blocks, run, seed)[from..to]`.
    Perm {
        blocks: u32,
        run: u32,
        seed: u64,
        from: u32,
        to: u32,
    },
}

/// The last permutation [`Ids::resolve`] made, by `(blocks, run, seed)`:
/// the requests of one row all slice the same one.
pub(super) type PermCache = std::sync::Mutex<Option<((u32, u32, u64), Arc<Vec<u32>>)>>;

impl Ids {
    /// The ids (a permutation made once per `cache`).
    pub(super) fn resolve(&self, cache: &PermCache) -> Vec<u32> {
        match self {
            Ids::List(v) => v.clone(),
            Ids::Perm {
                blocks,
                run,
                seed,
                from,
                to,
            } => {
                let key = (*blocks, *run, *seed);
                let all = {
                    let mut c = cache.lock().unwrap();
                    match &*c {
                        Some((k, all)) if *k == key => all.clone(),
                        _ => {
                            let all = Arc::new(crate::kv::ids(*blocks, *run, *seed));
                            *c = Some((key, all.clone()));
                            all
                        }
                    }
                };
                let (a, b) = (
                    (*from as usize).min(all.len()),
                    (*to as usize).min(all.len()),
                );
                all[a..b.max(a)].to_vec()
            }
        }
    }
}

/// One request line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Req {
    pub(super) id: u64,
    pub(super) cmd: Cmd,
    #[serde(default)]
    pub(super) block: usize,
    #[serde(default)]
    pub(super) blocks: u32,
    #[serde(default)]
    pub(super) write: bool,
    #[serde(default)]
    pub(super) ids: Option<Ids>,
    #[serde(default)]
    pub(super) expect: Option<Ids>,
    #[serde(default)]
    pub(super) holder: Option<String>,
    #[serde(default)]
    pub(super) spin_us: Option<u64>,
    #[serde(default)]
    pub(super) tag: u32,
    #[serde(default)]
    pub(super) idle_ms: u64,
}

impl Req {
    pub(super) fn new(cmd: Cmd) -> Req {
        Req {
            cmd,
            ..Req::default()
        }
    }
}

/// One answer line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Answer {
    pub(super) id: u64,
    /// The second answer of a `per_op`.
    #[serde(default)]
    pub(super) done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) metadata: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) created_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) done_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) base: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) notes: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) cpu_ns: Option<u64>,
    /// For `idle`: the CPU time of the grants' notification threads
    /// meanwhile, microseconds (10 ms ticks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) grant_cpu_us: Option<u64>,
}

type Waiting = Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;

/// The owner process, driven over its stdin and stdout; requests may be
/// made from many tasks at once.
pub(super) struct Owner {
    stdin: Mutex<tokio::process::ChildStdin>,
    waiting: Waiting,
    next: std::sync::atomic::AtomicU64,
    _child: tokio::process::Child,
}

impl Owner {
    /// Starts `exe grant-target`, cross-memory attach for every size.
    pub(super) async fn spawn(exe: &Path) -> anyhow::Result<Owner> {
        let mut child = Command::new(exe)
            .arg("grant-target")
            .env("FERRY_TRANSPORTS", "cma,tcp")
            .env("FERRY_CMA_THRESHOLD", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting ferry grant-target")?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let waiting: Waiting = Arc::default();
        let w = waiting.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(a) = serde_json::from_str::<Answer>(&l) {
                    // First answers wait under id*2, a per-op's second
                    // under id*2+1.
                    let key = a.id * 2 + u64::from(a.done);
                    if let Some(tx) = w.lock().unwrap().remove(&key) {
                        let _ = tx.send(a);
                    }
                }
            }
        });
        Ok(Owner {
            stdin: Mutex::new(stdin),
            waiting,
            next: 1.into(),
            _child: child,
        })
    }

    /// Sends `r` (its id set here); answers its first answer, and with
    /// `second` a receiver of its second one.
    async fn send(
        &self,
        mut r: Req,
        second: bool,
    ) -> anyhow::Result<(Answer, Option<oneshot::Receiver<Answer>>)> {
        r.id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut done = None;
        {
            let mut w = self.waiting.lock().unwrap();
            w.insert(r.id * 2, tx);
            if second {
                let (dtx, drx) = oneshot::channel();
                w.insert(r.id * 2 + 1, dtx);
                done = Some(drx);
            }
        }
        let mut line = serde_json::to_vec(&r)?;
        line.push(b'\n');
        {
            let mut s = self.stdin.lock().await;
            s.write_all(&line).await?;
            s.flush().await?;
        }
        let a = rx.await.map_err(|_| anyhow!("the grant target exited"))?;
        if let Some(e) = &a.error {
            return Err(anyhow!("grant target: {e}"));
        }
        Ok((a, done))
    }

    /// A request with one answer.
    pub(super) async fn call(&self, r: Req) -> anyhow::Result<Answer> {
        Ok(self.send(r, false).await?.0)
    }

    /// A `per_op` request: its metadata answer and a receiver of its end.
    pub(super) async fn per_op(
        &self,
        r: Req,
    ) -> anyhow::Result<(Answer, oneshot::Receiver<Answer>)> {
        let (a, done) = self.send(r, true).await?;
        Ok((a, done.ok_or_else(|| anyhow!("no second answer"))?))
    }
}

/// Waits for a `per_op`'s second answer: when the owner saw the end.
pub(super) async fn ended(done: oneshot::Receiver<Answer>) -> anyhow::Result<u64> {
    let a = done.await.map_err(|_| anyhow!("the grant target exited"))?;
    if let Some(e) = a.error {
        return Err(anyhow!("grant target: {e}"));
    }
    Ok(a.done_ns.unwrap_or(0))
}
