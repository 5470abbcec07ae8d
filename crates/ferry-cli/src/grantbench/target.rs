//! `ferry grant-target`: the owner process of `ferry bench --workload
//! grant`. It allocates the pool, grants it to the bench's connector and
//! passes the grant's metadata back over the pipe (as the kv workload's
//! target passes `RdmaMetadata`), timestamps each notification of a write
//! on arrival, serves today's per-operation capabilities over the same
//! pool, and tells where the pool lies for the raw baseline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context};
use ferry::{Connector, Pool};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::owner::Granted;
use super::proto::{Answer, Cmd, Req};
use crate::kv::{block_ok, fill_block};

struct State {
    connector: Connector,
    pool: Mutex<Option<Pool>>,
    grants: Mutex<HashMap<u32, Granted>>,
    /// Notification latencies (ns) not yet asked for.
    notes: Arc<Mutex<Vec<u64>>>,
    perms: super::proto::PermCache,
    out: mpsc::UnboundedSender<Answer>,
}

impl State {
    fn answer(&self, a: Answer) {
        let _ = self.out.send(a);
    }

    fn pool(&self) -> anyhow::Result<Pool> {
        self.pool
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| anyhow!("no pool yet"))
    }

    /// Serves `r`: its answer (a `per_op` answers from a task of its own).
    async fn serve(self: &Arc<Self>, r: Req) -> anyhow::Result<Answer> {
        let mut a = Answer {
            id: r.id,
            ..Answer::default()
        };
        match r.cmd {
            Cmd::Pool => {
                self.revoke_all().await?;
                *self.pool.lock().unwrap() = None;
                let (block, blocks) = (r.block, r.blocks);
                let pool = tokio::task::spawn_blocking(move || -> anyhow::Result<Pool> {
                    let size = block
                        .checked_mul(blocks as usize)
                        .ok_or_else(|| anyhow!("pool size overflows"))?;
                    let pool = Pool::allocate(size, block)?;
                    for id in 0..blocks {
                        pool.with_block_mut(id, |b| fill_block(b, id))?;
                    }
                    Ok(pool)
                })
                .await??;
                a.pid = Some(std::process::id());
                a.base = Some(pool.with_block(0, |b| b.as_ptr() as u64)?);
                *self.pool.lock().unwrap() = Some(pool);
            }
            Cmd::Grant => {
                let pool = self.pool()?;
                let holder = r.holder.as_deref();
                let g = super::owner::grant(
                    &self.connector,
                    &pool,
                    holder,
                    r.spin_us,
                    self.notes.clone(),
                )
                .await?;
                a.metadata = Some(g.metadata.clone());
                let old = self.grants.lock().unwrap().insert(r.tag, g);
                if let Some(old) = old {
                    old.revoke().await?;
                }
            }
            Cmd::Revoke => self.revoke_all().await?,
            Cmd::PerOp => {
                let pool = self.pool()?;
                let ids = r
                    .ids
                    .as_ref()
                    .map(|i| i.resolve(&self.perms))
                    .unwrap_or_default();
                let created = crate::clock::monotonic_ns();
                let op: Box<dyn ferry::Operation<'static>> = if r.write {
                    Box::new(
                        self.connector
                            .create_writable(vec![pool.blocks(&ids)?])
                            .await?,
                    )
                } else {
                    Box::new(
                        self.connector
                            .create_readable(vec![pool.shared_blocks(&ids)?])
                            .await?,
                    )
                };
                a.metadata = op.metadata().map(|m| m.to_json());
                a.created_ns = Some(created);
                let me = self.clone();
                let id = r.id;
                tokio::spawn(async move {
                    let res = op.wait_for_completion().await;
                    let done_ns = crate::clock::monotonic_ns();
                    drop(op);
                    me.answer(Answer {
                        id,
                        done: true,
                        error: res.err().map(|e| e.to_string()),
                        done_ns: Some(done_ns),
                        ..Answer::default()
                    });
                });
            }
            Cmd::Notes => a.notes = std::mem::take(&mut *self.notes.lock().unwrap()),
            Cmd::Idle => {
                let (before, threads) = (super::raw::process_cpu_ns(), grant_threads_us());
                tokio::time::sleep(std::time::Duration::from_millis(r.idle_ms)).await;
                a.cpu_ns = Some(super::raw::process_cpu_ns().saturating_sub(before));
                a.grant_cpu_us = Some(grant_threads_us().saturating_sub(threads));
            }
            Cmd::Wipe => {
                let pool = self.pool()?;
                let ids = r
                    .ids
                    .as_ref()
                    .map(|i| i.resolve(&self.perms))
                    .unwrap_or_default();
                for id in ids {
                    pool.with_block_mut(id, |b| b.fill(0))?;
                }
            }
            Cmd::Check => {
                let pool = self.pool()?;
                let ids = r
                    .ids
                    .as_ref()
                    .map(|i| i.resolve(&self.perms))
                    .unwrap_or_default();
                let expect = r
                    .expect
                    .as_ref()
                    .map(|i| i.resolve(&self.perms))
                    .unwrap_or_default();
                if ids.len() != expect.len() {
                    return Err(anyhow!("{} blocks, {} expected", ids.len(), expect.len()));
                }
                for (&id, &want) in ids.iter().zip(&expect) {
                    if !pool.with_block(id, |b| block_ok(b, want))? {
                        return Err(anyhow!("block {id} does not hold block {want} written"));
                    }
                }
            }
        }
        Ok(a)
    }

    /// Revokes every grant (before the pool under them goes).
    async fn revoke_all(&self) -> anyhow::Result<()> {
        let all: Vec<Granted> = self
            .grants
            .lock()
            .unwrap()
            .drain()
            .map(|(_, g)| g)
            .collect();
        for g in all {
            g.revoke().await?;
        }
        Ok(())
    }
}

/// The CPU time of this process's grant notification threads (named
/// `ferry-grant-<id>`), in microseconds, in the kernel's 10 ms ticks.
fn grant_threads_us() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut ticks = 0;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("ferry-grant-") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // After the ")" fields start at number 3: utime (14), stime (15).
        let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let at = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
        ticks += at(11) + at(12);
    }
    ticks * 10_000
}

/// `ferry grant-target`: serves requests on stdin until it closes.
pub async fn target(connector: Connector) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Answer>();
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(a) = rx.recv().await {
            let mut line = serde_json::to_vec(&a).unwrap_or_default();
            line.push(b'\n');
            if out.write_all(&line).await.is_err() || out.flush().await.is_err() {
                break;
            }
        }
    });
    let state = Arc::new(State {
        connector,
        pool: Mutex::new(None),
        grants: Mutex::new(HashMap::new()),
        notes: Arc::default(),
        perms: Mutex::new(None),
        out: tx,
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let r: Req = serde_json::from_str(&line).context("a grant bench request")?;
        let id = r.id;
        // Requests are served one after the other, but a per-op's wait runs
        // on a task of its own, so that many may be in flight.
        let a = match state.serve(r).await {
            Ok(a) => a,
            Err(e) => Answer {
                id,
                error: Some(format!("{e:#}")),
                ..Answer::default()
            },
        };
        state.answer(a);
    }
    state.revoke_all().await?;
    drop(state);
    let _ = writer.await;
    Ok(())
}
