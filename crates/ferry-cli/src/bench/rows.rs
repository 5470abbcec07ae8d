//! The measured rows of the sweep, each run in slices. A Ferry row and its
//! baseline take turns slice by slice ([`ROUNDS`] each, see
//! [`Bench::pair`]): this machine's speed drifts within minutes, and rows
//! measured one after the other would compare two moments as much as two
//! ways of copying.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::bail;
use ferry::{RdmaMetadata, TransportKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{row, Bench, Lane, Row, STREAMS};
use crate::peer::{self, Cmd, Request};

/// How many slices a Ferry row and its baseline each run in, taking turns.
pub(super) const ROUNDS: usize = 4;

/// How much one slice of a row measures: `n` operations, or fewer once
/// `time` has passed (at least `min`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slice {
    pub(super) n: usize,
    pub(super) min: usize,
    pub(super) time: Duration,
}

impl Slice {
    /// Whether a slice that measured `done` operations since `start` goes on.
    fn more(&self, done: usize, start: Instant) -> bool {
        done < self.n && (done < self.min || start.elapsed() < self.time)
    }

    /// How many operations of `bytes` a loop without a clock runs (it
    /// cannot stop at `time`): about `time` worth at 2 GB/s at most, at
    /// least `min`.
    pub(super) fn unclocked(&self, bytes: u64) -> usize {
        let at_2gbps = (self.time.as_secs_f64() * 2e9 / bytes.max(1) as f64) as usize;
        self.n.min(at_2gbps.max(self.min))
    }
}

/// Operations measured (their latencies) and the wall time they took;
/// for Ferry rows also each operation's transfer phase (see
/// [`Samples::transfer_row`]).
#[derive(Debug, Default)]
pub(super) struct Samples {
    pub(super) lat: Vec<Duration>,
    pub(super) wall: Duration,
    pub(super) transfer: Vec<Duration>,
}

impl Samples {
    pub(super) fn add(&mut self, other: Samples) {
        self.lat.extend(other.lat);
        self.wall += other.wall;
        self.transfer.extend(other.transfer);
    }

    /// The row of the transfer phases alone: each operation from the
    /// active side's `begin_read`/`begin_write` to the later of the two
    /// completions, leaving out the passive side's creation and the hand-
    /// over of its metadata (the bench's control pipe); its GB/s is the
    /// bytes over the sum of those phases.
    pub(super) fn transfer_row(
        &self,
        kind: &str,
        via: &str,
        op: &str,
        block: u64,
        batch: usize,
    ) -> Row {
        let mut lat = self.transfer.clone();
        let wall = lat.iter().sum();
        row(kind, via, op, block, batch, &mut lat, wall)
    }

    pub(super) fn into_row(
        mut self,
        kind: &str,
        via: &str,
        op: &str,
        block: u64,
        batch: usize,
    ) -> Row {
        row(kind, via, op, block, batch, &mut self.lat, self.wall)
    }
}

impl Bench {
    /// One slice of a row of `bytes` per operation: a [`ROUNDS`]th of the
    /// row's operations and time.
    pub(super) fn slice(&self, bytes: u64) -> Slice {
        Slice {
            n: self.iters_for(bytes).div_ceil(ROUNDS),
            min: self.opts.iters.0.div_ceil(ROUNDS),
            time: self.opts.row_time / ROUNDS as u32,
        }
    }

    /// A Ferry row over `via` and its baseline (`cma`, `ucx_get` or
    /// `tcp_stream`), taking turns slice by slice; with `striped`, also
    /// the striped TCP row against the same baseline. The rows in the
    /// order they are printed: the baseline first.
    pub(super) async fn pair(
        &mut self,
        via: Lane,
        op: &str,
        block: u64,
        batch: usize,
        striped: bool,
    ) -> anyhow::Result<Vec<Row>> {
        let sl = self.slice(block * batch as u64);
        let (mut base, mut ferry, mut split) = <(Samples, Samples, Samples)>::default();
        let (mut used, mut reg) = (None, Vec::new());
        for _ in 0..ROUNDS {
            match via {
                Lane::Cma => base.add(self.cma_slice(op, block, batch, sl).await?),
                Lane::Ucx => {
                    let (s, r) = self.ucx_slice(op, block, batch, sl).await?;
                    base.add(s);
                    reg.extend(r);
                }
                _ => base.add(self.tcp_slice(op, block, batch, sl).await?),
            }
            let (s, t) = self.ferry_slice(via, op, block, batch, sl).await?;
            ferry.add(s);
            used = used.or(t);
            if striped {
                split.add(
                    self.ferry_slice(Lane::Striped, op, block, batch, sl)
                        .await?
                        .0,
                );
            }
        }
        let (base_name, via_name) = match via {
            Lane::Cma => ("cma", "cma"),
            Lane::Ucx => ("ucx_get", "ucx"),
            _ => ("tcp_stream", "tcp"),
        };
        let mut b = base.into_row(base_name, via_name, op, block, batch);
        if via == Lane::Ucx {
            b.reg_us = median_us(&mut reg);
        }
        let used = used.map(|t| t.name()).unwrap_or("?");
        let mut rows = vec![ferry.into_row("ferry", used, op, block, batch)];
        if striped {
            let mut s = split.into_row("ferry", "tcp", op, block, batch);
            s.streams = Some(STREAMS);
            rows.push(s);
        }
        for r in &mut rows {
            r.baseline = Some(format!("{base_name} {op}"));
            r.ratio = Some(r.gbps / b.gbps.max(1e-12));
        }
        rows.insert(0, b);
        Ok(rows)
    }

    /// One Ferry operation, end to end: the target creates the passive
    /// side, hands its metadata over the control pipe, this process runs the
    /// active side, and both report completion. Its end-to-end time, its
    /// transfer phase (from the active side's `begin_*` to the later
    /// completion on one clock, else to this side's), and the transport.
    pub(super) async fn one(
        &mut self,
        via: Lane,
        op: &str,
        block: u64,
        batch: usize,
    ) -> anyhow::Result<(Duration, Duration, Option<TransportKind>)> {
        let t = Instant::now();
        let cmd = if op == "read" {
            Cmd::Readable
        } else {
            Cmd::Writable
        };
        let mut r = Request::new(0, cmd);
        r.sizes = vec![block; batch];
        r.reuse = true;
        if matches!(via, Lane::Ucx | Lane::UcxDevice) {
            r.lane = Some("ucx".into());
        }
        // Device memory on both sides for the device lanes.
        let device = match via {
            Lane::Staged | Lane::Ipc | Lane::UcxDevice => self.opts.device.clone(),
            _ => None,
        };
        r.device = device.clone();
        let mut a = self.peer.request(r).await?;
        let m = a.expect("metadata").await?;
        let meta = RdmaMetadata::from_json(m.metadata.as_deref().unwrap_or_default())?;
        if self.target_host.is_none() {
            self.target_host = Some(meta.host_id().to_string());
        }
        let created = m.created_ns;
        let descs = self.pool.take(block, batch, device.as_deref())?;
        let began = crate::clock::monotonic_ns();
        let local = match via {
            Lane::Cma | Lane::Ipc => &self.cma,
            Lane::Tcp | Lane::Staged => &self.tcp,
            Lane::Striped => &self.striped,
            Lane::Ucx | Lane::UcxDevice => match &self.ucx {
                Some(u) => &u.connector,
                None => bail!("no UCX lane"),
            },
        };
        let ours;
        let (descs, used) = if op == "read" {
            let o = local.begin_read(&meta, descs).await?;
            o.wait_for_completion().await?;
            ours = crate::clock::monotonic_ns();
            let used = o.transport();
            (o.into_descriptors(), used)
        } else {
            let o = local.begin_write(descs, &meta).await?;
            o.wait_for_completion().await?;
            ours = crate::clock::monotonic_ns();
            let used = o.transport();
            (o.into_descriptors(), used)
        };
        let done = a.expect("done").await?;
        let mut elapsed = t.elapsed();
        if let Some(e) = done.error {
            bail!("the target's side failed: {e}");
        }
        // End to end as defined: from the passive side's creation to the
        // later of the two completions (one clock on one host; otherwise
        // from this side's request to the target's answer, which is longer).
        let mut end = ours;
        if let (true, Some(c), Some(theirs)) = (self.same_clock, created, done.done_ns) {
            if c > 0 && theirs > 0 {
                end = ours.max(theirs);
                elapsed = Duration::from_nanos(end.saturating_sub(c));
            }
        }
        self.pool.put(descs);
        Ok((
            elapsed,
            Duration::from_nanos(end.saturating_sub(began)),
            used,
        ))
    }

    /// One slice of a Ferry row: a warm-up operation (it allocates the
    /// pooled buffers on both sides the first time), then operations back
    /// to back; and the transport the last one used.
    pub(super) async fn ferry_slice(
        &mut self,
        via: Lane,
        op: &str,
        block: u64,
        batch: usize,
        sl: Slice,
    ) -> anyhow::Result<(Samples, Option<TransportKind>)> {
        self.one(via, op, block, batch).await?;
        let mut lat = Vec::with_capacity(sl.n);
        let mut transfer = Vec::with_capacity(sl.n);
        let mut used = None;
        let start = Instant::now();
        while sl.more(lat.len(), start) {
            let (d, phase, t) = self.one(via, op, block, batch).await?;
            lat.push(d);
            transfer.push(phase);
            used = t;
        }
        let wall = start.elapsed();
        Ok((
            Samples {
                lat,
                wall,
                transfer,
            },
            used,
        ))
    }

    /// One slice of the `tcp_stream` row: a fresh connection to the
    /// target, one warm-up exchange, then exchanges back to back.
    async fn tcp_slice(
        &mut self,
        op: &str,
        block: u64,
        batch: usize,
        sl: Slice,
    ) -> anyhow::Result<Samples> {
        let bytes = block * batch as u64;
        let mut r = Request::new(0, Cmd::TcpStream);
        r.sizes = vec![bytes];
        let mut a = self.peer.request(r).await?;
        let addr = a.expect("listening").await?.address.unwrap_or_default();
        let mut s = tokio::net::TcpStream::connect(&addr).await?;
        s.set_nodelay(true)?;
        let mut d = crate::buffers::host_buffer(bytes as usize)?;
        let buf = d.as_mut_slice().unwrap_or_default();
        let mut lat = Vec::with_capacity(sl.n);
        let mut ack = [0u8; 1];
        let mut one =
            async |s: &mut tokio::net::TcpStream, buf: &mut [u8]| -> std::io::Result<Duration> {
                let t = Instant::now();
                if op == "write" {
                    s.write_all(b"w").await?;
                    s.write_all(buf).await?;
                    s.read_exact(&mut ack).await?;
                } else {
                    s.write_all(b"r").await?;
                    s.read_exact(buf).await?;
                }
                Ok(t.elapsed())
            };
        one(&mut s, buf).await?;
        let start = Instant::now();
        while sl.more(lat.len(), start) {
            lat.push(one(&mut s, buf).await?);
        }
        let wall = start.elapsed();
        drop(s);
        a.expect("done").await?;
        Ok(Samples {
            lat,
            wall,
            ..Samples::default()
        })
    }

    /// One slice of the raw cross-memory-attach loop between the two
    /// processes: the destination copies with `process_vm_readv`, as
    /// Ferry's `cma` does (for `read` this process copies from the target,
    /// for `write` the target copies from this process). No control
    /// messages are timed. The first copy of a slice warms up.
    async fn cma_slice(
        &mut self,
        op: &str,
        block: u64,
        batch: usize,
        sl: Slice,
    ) -> anyhow::Result<Samples> {
        let bytes = block * batch as u64;
        let iters = sl.unclocked(bytes);
        let (lat, wall) = if op == "read" {
            let mut r = Request::new(0, Cmd::Lend);
            r.sizes = vec![bytes];
            let lent = self.peer.request(r).await?.expect("lent").await?;
            let pid = lent.pid.unwrap_or(0);
            let addr: u64 = lent.address.as_deref().unwrap_or("0").parse()?;
            let mut d = crate::buffers::host_buffer(bytes as usize)?;
            let buf = d.as_mut_slice().unwrap_or_default();
            peer::copy_in_chunks(pid, addr, buf)?;
            let mut lat = Vec::with_capacity(iters);
            let start = Instant::now();
            for _ in 0..iters {
                let t = Instant::now();
                peer::copy_in_chunks(pid, addr, black_box(&mut *buf))?;
                lat.push(t.elapsed());
            }
            (lat, start.elapsed())
        } else {
            let buf = crate::buffers::host_buffer(bytes as usize)?;
            let mut r = Request::new(0, Cmd::Pull);
            r.sizes = vec![bytes];
            r.pid = Some(std::process::id());
            r.address = Some(buf.as_slice().map_or(0, |b| b.as_ptr() as usize) as u64);
            r.count = Some(iters + 1);
            let done = self.peer.request(r).await?.expect("done").await?;
            drop(buf);
            if let Some(e) = done.error {
                bail!("the target could not copy from this process: {e}");
            }
            let lat: Vec<Duration> = done
                .lat_ns
                .unwrap_or_default()
                .into_iter()
                .skip(1)
                .map(Duration::from_nanos)
                .collect();
            let wall = lat.iter().sum();
            (lat, wall)
        };
        if lat.is_empty() {
            bail!("the target measured no copy");
        }
        Ok(Samples {
            lat,
            wall,
            ..Samples::default()
        })
    }

    pub(super) fn memcpy_row(&self, block: u64, batch: usize) -> anyhow::Result<Row> {
        let bytes = (block * batch as u64) as usize;
        let s = crate::buffers::host_buffer(bytes)?;
        let mut d = crate::buffers::host_buffer(bytes)?;
        let (src, dst) = (
            s.as_slice().unwrap_or_default(),
            d.as_mut_slice().unwrap_or_default(),
        );
        self.timed("memcpy", "copy", block, batch, || {
            dst.copy_from_slice(black_box(src));
            black_box(&mut *dst);
            Ok(())
        })
    }

    /// A row of `f` on this process alone (`local`): once to warm up, then
    /// as many times as a row of `block * batch` bytes runs (at least the
    /// fewest, at most the row's time).
    pub(super) fn timed(
        &self,
        kind: &str,
        op: &str,
        block: u64,
        batch: usize,
        mut f: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<Row> {
        let iters = self.iters_for(block * batch as u64);
        f()?;
        let mut lat: Vec<Duration> = Vec::with_capacity(iters);
        let start = Instant::now();
        while lat.len() < iters
            && (lat.len() < self.opts.iters.0 || start.elapsed() < self.opts.row_time)
        {
            let t = Instant::now();
            f()?;
            lat.push(t.elapsed());
        }
        Ok(row(
            kind,
            "local",
            op,
            block,
            batch,
            &mut lat,
            start.elapsed(),
        ))
    }
}

/// The median of `ns` (nanoseconds) in microseconds, `None` if empty.
fn median_us(ns: &mut [u64]) -> Option<f64> {
    ns.sort_unstable();
    ns.get(ns.len() / 2).map(|&n| n as f64 / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transfer row counts the transfer phases alone: the bytes of
    /// every operation over the sum of their phases, whatever the
    /// end-to-end latencies and wall time were.
    #[test]
    fn the_transfer_row_is_the_bytes_over_the_phases() {
        let ms = Duration::from_millis;
        let s = Samples {
            lat: vec![ms(3), ms(5)],
            wall: ms(10),
            transfer: vec![ms(1), ms(3)],
        };
        let block = 1_000_000;
        let phase = s.transfer_row("ferry cuda:0 transfer", "cuda-ipc", "read", block, 2);
        let end_to_end = s.into_row("ferry cuda:0", "cuda-ipc", "read", block, 2);
        // Two operations of 2 MB: 4 MB in 10 ms, and in 4 ms.
        assert!((end_to_end.gbps - 0.4).abs() < 1e-9, "{}", end_to_end.gbps);
        assert!((phase.gbps - 1.0).abs() < 1e-9, "{}", phase.gbps);
        assert_eq!(phase.iters, 2);
        assert!((phase.lat_us_avg - 2000.0).abs() < 1e-6);
        assert_eq!(phase.kind, "ferry cuda:0 transfer");
    }
}
