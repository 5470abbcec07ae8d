//! One slice of each kind of row, between this process (the holder) and
//! the owner process: the raw copy loop, today's per-operation capability,
//! and the grant (event-driven, or in low-latency mode).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use ferry::{Connector, GrantLane, Pool, RdmaMetadata, TransportKind};

use super::holder::Held;
use super::proto::{ended, Cmd, Ids, Owner, Req};
use super::raw;
use super::stats::{inflight, inflight_blocking, Budget, Samples, Timed};
use crate::clock::monotonic_ns;
use crate::kv::{block_ok, fill_block};

/// What this side's block `id` holds: [`fill_block`] of `id + LOCAL_IDS`,
/// unlike any block of the owner's.
pub(super) const LOCAL_IDS: u32 = 1 << 24;

/// How long the owner's notification thread spins before parking in
/// low-latency mode: longer than [`GAP`], so that paced writes find it
/// spinning.
pub(super) const SPIN: Duration = Duration::from_millis(1);

/// The pause between the paced WRITEs that time one notification at a
/// time (see [`Side::paced`]).
pub(super) const GAP: Duration = Duration::from_micros(200);

/// One row's transfers: the blocks each of its workers moves per
/// operation (the same blocks at every operation of that worker).
#[derive(Debug, Clone)]
pub(super) struct Case {
    /// Bytes per block.
    pub(super) block: usize,
    /// WRITE (this side's blocks into the owner's) or READ.
    pub(super) write: bool,
    /// Per worker: the owner's blocks, as the owner is told them.
    pub(super) remote: Vec<Ids>,
    /// Per worker: the same, resolved.
    pub(super) remote_ids: Vec<Vec<u32>>,
    /// Per worker: this side's blocks.
    pub(super) local: Vec<Vec<u32>>,
}

impl Case {
    /// Operations in flight.
    pub(super) fn inflight(&self) -> usize {
        self.local.len()
    }

    /// Bytes per operation (of worker 0).
    pub(super) fn bytes(&self) -> u64 {
        (self.block * self.local.first().map_or(0, Vec::len)) as u64
    }
}

/// The holder's side of the run, over one pool on each side.
pub(super) struct Side {
    pub(super) owner: Arc<Owner>,
    pub(super) c: Arc<Connector>,
    pub(super) local: Pool,
    pub(super) pid: u32,
    pub(super) base: u64,
    /// The event-driven grant over the owner's pool, open here.
    pub(super) grant: Option<Arc<Held>>,
    /// The same pool granted in low-latency mode, open here.
    pub(super) spin: Option<Arc<Held>>,
    /// The same pool granted again, opened by TCP (each operation served
    /// in the owner's runtime).
    pub(super) tcp: Option<Arc<Held>>,
    /// The raw loop's memory for transfers of many blocks.
    raw_buf: std::sync::Mutex<Option<ferry::Descriptor<'static>>>,
}

impl Side {
    /// Pools of `blocks` blocks of `block` bytes on both sides, the owner's
    /// granted to this side's connector (and again in low-latency mode
    /// with `spin`) and opened here.
    pub(super) async fn new(
        owner: Arc<Owner>,
        c: Arc<Connector>,
        block: usize,
        blocks: u32,
        spin: bool,
    ) -> anyhow::Result<Side> {
        let mut r = Req::new(Cmd::Pool);
        (r.block, r.blocks) = (block, blocks);
        let a = owner.call(r).await?;
        let (Some(pid), Some(base)) = (a.pid, a.base) else {
            bail!("the owner did not say where its pool lies");
        };
        let local = tokio::task::spawn_blocking(move || -> anyhow::Result<Pool> {
            let p = Pool::allocate(block * blocks as usize, block)?;
            fill(&p)?;
            Ok(p)
        })
        .await??;
        let mut side = Side {
            owner,
            c,
            local,
            pid,
            base,
            grant: None,
            spin: None,
            tcp: None,
            raw_buf: std::sync::Mutex::new(None),
        };
        side.grant = Some(Arc::new(side.open(0, None).await?));
        if spin {
            side.spin = Some(Arc::new(side.open(1, Some(SPIN)).await?));
        }
        side.tcp = Some(Arc::new(side.open_via(2, None, GrantLane::Tcp).await?));
        Ok(side)
    }

    /// Asks the owner for grant `tag` of its pool and opens it.
    pub(super) async fn open(&self, tag: u32, spin: Option<Duration>) -> anyhow::Result<Held> {
        self.open_via(tag, spin, GrantLane::Any).await
    }

    /// [`open`](Self::open) by lane `via`.
    pub(super) async fn open_via(
        &self,
        tag: u32,
        spin: Option<Duration>,
        via: GrantLane,
    ) -> anyhow::Result<Held> {
        let mut r = Req::new(Cmd::Grant);
        r.tag = tag;
        r.holder = Some(self.c.worker_id().to_string());
        r.spin_us = spin.map(|d| d.as_micros() as u64);
        let a = self.owner.call(r).await?;
        let m = a
            .metadata
            .ok_or_else(|| anyhow!("the owner answered no grant metadata"))?;
        super::holder::open(&self.c, &m, via).await
    }

    /// Fills this side's blocks again (after READs landed in them).
    pub(super) async fn refill(&self) -> anyhow::Result<()> {
        let p = self.local.clone();
        tokio::task::spawn_blocking(move || fill(&p)).await?
    }

    /// One slice of the raw copy loop: one thread per worker.
    pub(super) fn raw_slice(&self, case: &Case, budget: Budget) -> anyhow::Result<Samples> {
        let (pid, base, block, write) = (self.pid, self.base, case.block, case.write);
        if case.local.iter().all(|l| l.len() == 1) {
            // One block per operation: straight from and into the pool.
            let states: Vec<(u32, u32)> = case
                .remote_ids
                .iter()
                .zip(&case.local)
                .map(|(r, l)| (r[0], l[0]))
                .collect();
            let local = &self.local;
            return tokio::task::block_in_place(|| {
                inflight_blocking(states, budget, |&mut (r, l), _| {
                    let at = base + r as u64 * block as u64;
                    let t = Instant::now();
                    if write {
                        local.with_block(l, |b| raw::write(pid, at, b))??;
                    } else {
                        local.with_block_mut(l, |b| raw::read(pid, at, b))??;
                    }
                    Ok(t.elapsed())
                })
            });
        }
        // Blocks: a plain buffer of the pool's size (made once per side),
        // one slice per block.
        let kept = self.raw_buf.lock().unwrap().take();
        let mut buf = match kept {
            Some(b) => b,
            None => crate::buffers::host_buffer(self.local.size())?,
        };
        let out = raw_blocks(&mut buf, case, (pid, base), budget);
        *self.raw_buf.lock().unwrap() = Some(buf);
        out
    }

    /// One slice of today's per-operation capability: per operation the
    /// owner creates a READABLE or WRITABLE over its blocks and passes its
    /// metadata, this side runs `begin_read` / `begin_write`. Latency from
    /// the owner's creation to this side's completion; the owner's
    /// "notification" of a WRITE is its own completion.
    pub(super) async fn per_op_slice(
        &self,
        case: &Case,
        budget: Budget,
    ) -> anyhow::Result<Samples> {
        let (owner, c, local) = (self.owner.clone(), self.c.clone(), self.local.clone());
        let case = Arc::new(case.clone());
        inflight(case.inflight(), budget, move |w, _| {
            let (owner, c, local, case) = (owner.clone(), c.clone(), local.clone(), case.clone());
            async move {
                let mut r = Req::new(Cmd::PerOp);
                r.write = case.write;
                r.ids = Some(case.remote[w].clone());
                let (a, done) = owner.per_op(r).await?;
                let m = RdmaMetadata::from_json(a.metadata.as_deref().unwrap_or_default())?;
                let created = a.created_ns.unwrap_or(0);
                let l = &case.local[w];
                let used = if case.write {
                    let op = c.begin_write(vec![local.shared_blocks(l)?], &m).await?;
                    op.wait_for_completion().await?;
                    op.transport()
                } else {
                    let op = c.begin_read(&m, vec![local.blocks(l)?]).await?;
                    op.wait_for_completion().await?;
                    op.transport()
                };
                let ours = monotonic_ns();
                if used != Some(TransportKind::Cma) {
                    bail!("a per-operation transfer went by {used:?}, not cma");
                }
                let theirs = ended(done).await?;
                let since = |t: u64| Duration::from_nanos(t.saturating_sub(created));
                Ok((since(ours), case.write.then(|| since(theirs))))
            }
        })
        .await
    }

    /// One slice of one-sided operations on grant `held`: one warm-up
    /// operation, then the slice; for WRITEs, each operation's notification
    /// latency as the owner measured it on arrival.
    pub(super) async fn grant_slice(
        &self,
        held: &Arc<Held>,
        case: &Case,
        budget: Budget,
    ) -> anyhow::Result<Samples> {
        let local = self.local.clone();
        let case = Arc::new(case.clone());
        one(held, &local, &case, 0, false).await?;
        let (h, l, c) = (held.clone(), local.clone(), case.clone());
        let mut s = inflight(case.inflight(), budget, move |w, _| {
            let (h, l, c) = (h.clone(), l.clone(), c.clone());
            async move { one(&h, &l, &c, w, true).await }
        })
        .await?;
        if case.write {
            s.notes = self.notes(s.ops()).await?;
        }
        Ok(s)
    }

    /// `n` WRITEs of `case`'s first worker on `held`, [`GAP`] apart: the
    /// latency of one notification at a time, with no queue before it (a
    /// closed loop's WRITEs post faster than the owner takes their
    /// notifications, whose latency then includes the queue).
    pub(super) async fn paced(
        &self,
        held: &Arc<Held>,
        case: &Case,
        n: usize,
    ) -> anyhow::Result<Samples> {
        let rt = tokio::runtime::Handle::current();
        let start = Instant::now();
        let lat = tokio::task::block_in_place(|| {
            (0..n)
                .map(|_| {
                    let t = rt.block_on(one(held, &self.local, case, 0, true))?;
                    std::thread::sleep(GAP);
                    Ok(t.0)
                })
                .collect::<anyhow::Result<Vec<Duration>>>()
        })?;
        let wall = start.elapsed();
        let notes = self.notes(n).await?;
        Ok(Samples { lat, notes, wall })
    }

    /// The notification latencies of the last `n` WRITEs, as they arrive.
    async fn notes(&self, n: usize) -> anyhow::Result<Vec<Duration>> {
        let mut got = Vec::with_capacity(n);
        let until = Instant::now() + Duration::from_secs(5);
        while got.len() < n {
            let a = self.owner.call(Req::new(Cmd::Notes)).await?;
            got.extend(a.notes.into_iter().map(Duration::from_nanos));
            if got.len() < n {
                if Instant::now() > until {
                    bail!("the owner was notified of {} of {n} writes", got.len());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        Ok(got)
    }

    /// Undoes what the rows before moved for `case` (zeroes the owner's
    /// blocks of a WRITE, fills this side's blocks of a READ again), so
    /// that [`Side::verify`] after the grant's slice checks the grant's
    /// bytes.
    pub(super) async fn forget(&self, case: &Case) -> anyhow::Result<()> {
        for (w, l) in case.local.iter().enumerate() {
            if case.write {
                let mut q = Req::new(Cmd::Wipe);
                q.ids = Some(case.remote[w].clone());
                self.owner.call(q).await?;
            } else {
                for &id in l {
                    self.local
                        .with_block_mut(id, |b| fill_block(b, id + LOCAL_IDS))?;
                }
            }
        }
        Ok(())
    }

    /// Checks every byte that the grant moved for `case`: READ here, WRITE
    /// at the owner.
    pub(super) async fn verify(&self, case: &Case) -> anyhow::Result<()> {
        for (w, (r, l)) in case.remote_ids.iter().zip(&case.local).enumerate() {
            if case.write {
                let mut q = Req::new(Cmd::Check);
                q.ids = Some(case.remote[w].clone());
                q.expect = Some(Ids::List(l.iter().map(|id| id + LOCAL_IDS).collect()));
                self.owner.call(q).await?;
            } else {
                for (&r, &l) in r.iter().zip(l) {
                    if !self.local.with_block(l, |b| block_ok(b, r))? {
                        bail!("block {l} does not hold the owner's block {r} read");
                    }
                }
            }
        }
        Ok(())
    }
}

/// One slice of the raw loop over blocks: `buf` (this side's memory, as
/// large as its pool) split into one slice per block.
fn raw_blocks(
    buf: &mut ferry::Descriptor<'static>,
    case: &Case,
    (pid, base): (u32, u64),
    budget: Budget,
) -> anyhow::Result<Samples> {
    let (block, write) = (case.block, case.write);
    let mut slots: Vec<Option<&mut [u8]>> = buf
        .as_mut_slice()
        .ok_or_else(|| anyhow!("the baseline's buffer is not host memory"))?
        .chunks_exact_mut(block)
        .map(Some)
        .collect();
    let mut states = Vec::new();
    for (r, l) in case.remote_ids.iter().zip(&case.local) {
        let mine = l
            .iter()
            .map(|&id| slots.get_mut(id as usize).and_then(Option::take))
            .collect::<Option<Vec<&mut [u8]>>>()
            .ok_or_else(|| anyhow!("a block of this side twice in one row"))?;
        states.push((r.as_slice(), mine));
    }
    tokio::task::block_in_place(|| {
        inflight_blocking(states, budget, |(r, mine), _| {
            let t = Instant::now();
            if write {
                let src: Vec<&[u8]> = mine.iter().map(|b| &**b).collect();
                raw::blocks(pid, base, block, r, raw::Local::From(&src))?;
            } else {
                raw::blocks(pid, base, block, r, raw::Local::Into(mine))?;
            }
            Ok(t.elapsed())
        })
    })
}

/// Fills `p`'s block `k` as [`fill_block`] fills `k + LOCAL_IDS`.
fn fill(p: &Pool) -> anyhow::Result<()> {
    for id in 0..p.block_count() as u32 {
        p.with_block_mut(id, |b| fill_block(b, id + LOCAL_IDS))?;
    }
    Ok(())
}

/// Worker `w`'s operation of `case` on grant `h`; a WRITE's notification
/// carries its post time (`note`: else none).
async fn one(h: &Held, local: &Pool, case: &Case, w: usize, note: bool) -> anyhow::Result<Timed> {
    let (r, l) = (&case.remote_ids[w], &case.local[w]);
    let post = monotonic_ns().to_le_bytes();
    let t = Instant::now();
    if case.write {
        h.write(local, l, r, note.then_some(&post[..])).await?;
    } else {
        h.read(r, local, l).await?;
    }
    Ok((t.elapsed(), None))
}
