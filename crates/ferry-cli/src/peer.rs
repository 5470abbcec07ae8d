//! The peer process: a Ferry worker driven by JSON lines on stdin, answering
//! with JSON lines on stdout. `ferry demo`, the benchmark and the tests start
//! it with `ferry peer` and exchange metadata with it over that pipe, just as
//! a real graph exchanges metadata over HTTP or NATS.
//!
//! Every request carries an `id`; every answer names the request's `id`.
//! Requests are served concurrently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry::{
    Connector, ConnectorBuilder, Descriptor, Device, Operation, RdmaMetadata, TransportKind,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use crate::buffers::{device_buffer, device_of, host_buffer};
use crate::pattern;

mod driver;
pub(crate) mod ucx;

pub use driver::{Answers, PeerProcess};

/// What the driver asks the peer to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cmd {
    /// Expose buffers holding `seed`'s pattern for reading; answers `metadata`, then `done`.
    Readable,
    /// Expose zeroed buffers for writing; answers `metadata`, then `done`
    /// with `verified` (whether they hold `seed`'s pattern) and `checksum`.
    Writable,
    /// Read `metadata` into zeroed buffers; answers `done` with `verified`.
    Read,
    /// Write buffers holding `seed`'s pattern into `metadata`; answers `done`.
    Write,
    /// Cancel request `target` (must still be running); answers `ok`.
    Cancel,
    /// Checksum of the buffers request `target` ended with; answers `checksum`.
    Checksum,
    /// Answers `stats` with the connector's counters.
    Stats,
    /// Exit the process at once (no clean-up, like a crash).
    Crash,
    /// Baseline: accept one plain TCP connection on the answered `address`;
    /// then for each byte `w` read `sizes[0]` bytes and answer one byte, and
    /// for each byte `r` send `sizes[0]` bytes.
    TcpStream,
    /// Answers `cpu` with this process's CPU time in microseconds.
    CpuTime,
    /// Baseline: keep a buffer of `sizes[0]` bytes and answer `lent` with
    /// this process's `pid` and the buffer's `address` (replaces the last one).
    Lend,
    /// Baseline: copy `sizes[0]` bytes from `address` of process `pid` by
    /// cross-memory attach, `count` times; answers `done` with `lat_ns`.
    Pull,
    /// Raw UCX baseline: keep a buffer of `sizes[0]` bytes registered with
    /// UCX (`count` registrations timed, the last one kept; replaces the
    /// last buffer) and answer `lent` with its offer in `ucx` and the
    /// registration times in `lat_ns`.
    UcxLend,
    /// Raw UCX baseline: get the buffer that the offer in `ucx` describes,
    /// `count` times; answers `done` with `lat_ns`.
    UcxPull,
}

/// What a peer process does as soon as an operation it serves ends, before
/// it answers anything: how a worker that exits after its last request
/// ends (the exit code says how the operation ended, [`EXIT_COMPLETE`] or
/// [`EXIT_NOT_COMPLETE`], since no answer follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum After {
    /// Exit at once, without any clean-up (`_exit`, as Python's `os._exit`).
    Exit,
    /// Exit normally (`exit`: the C library's exit handlers run, open
    /// sockets close as the process ends).
    Quit,
}

/// The exit code of a peer that ended as its request's [`After`] said,
/// its operation COMPLETE.
pub const EXIT_COMPLETE: i32 = 0;
/// The same, its operation not COMPLETE.
pub const EXIT_NOT_COMPLETE: i32 = 3;

/// One request line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the driver; answers carry it.
    pub id: u64,
    /// What to do.
    pub cmd: Cmd,
    /// Descriptor sizes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sizes: Vec<u64>,
    /// Pattern seed.
    #[serde(default)]
    pub seed: u64,
    /// Remote metadata JSON, for `read` and `write`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
    /// The request that `cancel` and `checksum` act on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<u64>,
    /// Give up waiting after this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Benchmark mode: take buffers from a pool and give them back after,
    /// without filling, checking or keeping them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse: bool,
    /// For `pull`: the process to copy from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// For `pull`: the address to copy from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<u64>,
    /// For `pull` and `ucx_pull`: how many copies; for `ucx_lend`: how
    /// many registrations to time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// `ucx`: run `readable`, `writable`, `read` or `write` on the peer's
    /// UCX connector ([`ucx_lane`]), made at its first use; otherwise on
    /// its main one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// Pooled buffers (`reuse`) in device memory: `cuda:N`, or `sim` (host
    /// memory described as `cuda:0`, in a peer started with
    /// [`SIMULATED_GPU_ENV`](crate::gpu::SIMULATED_GPU_ENV)); see
    /// [`device_buffer`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// For `ucx_pull`: the offer of the lender's `lent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ucx: Option<Vec<u8>>,
    /// For `readable`, `writable`, `read` and `write`: end the process as
    /// soon as the operation ends (see [`After`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<After>,
}

impl Request {
    /// A request with only `id` and `cmd` set.
    pub fn new(id: u64, cmd: Cmd) -> Self {
        Request {
            id,
            cmd,
            sizes: Vec::new(),
            seed: 0,
            metadata: None,
            target: None,
            deadline_ms: None,
            reuse: false,
            pid: None,
            address: None,
            count: None,
            lane: None,
            ucx: None,
            device: None,
            after: None,
        }
    }
}

/// One answer line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Event {
    /// The request answered (0 for `ready`).
    pub id: u64,
    /// `ready`, `metadata`, `done`, `ok`, `checksum`, `stats` or `error`.
    pub event: String,
    /// For `ready`: the peer's worker id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// For `metadata`: the JSON to hand to the other side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
    /// For `done`: the final status name (e.g. `COMPLETE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// For `done`: the status just before a `cancel` acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_cancel: Option<String>,
    /// The error message, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether received bytes match the pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
    /// Checksum of the buffers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u64>,
    /// Microseconds from the request to the end of the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micros: Option<u64>,
    /// For `stats`: exposed operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed: Option<usize>,
    /// For `stats`: open connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<usize>,
    /// For `stats`: requests in flight on its connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<usize>,
    /// For `listening`: where to connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// For `done`: the transport that carried the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// For `lent`: the process id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// For `metadata`: when the passive operation was created
    /// ([`clock::monotonic_ns`](crate::clock::monotonic_ns)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_ns: Option<u64>,
    /// For `done`: when this side saw the end (same clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_ns: Option<u64>,
    /// For `pull`'s and `ucx_pull`'s `done`: nanoseconds per copy; for
    /// `ucx_lend`'s `lent`: nanoseconds per registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat_ns: Option<Vec<u64>>,
    /// For `ucx_lend`'s `lent`: what a getter needs (worker address, buffer
    /// address and length, packed remote key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ucx: Option<Vec<u8>>,
}

impl Event {
    fn new(id: u64, event: &str) -> Self {
        Event {
            id,
            event: event.into(),
            ..Default::default()
        }
    }
}

/// The descriptors of `sizes`, filled with `seed`'s pattern or zeroed.
pub fn buffers(sizes: &[u64], seed: Option<u64>) -> Vec<Descriptor<'static>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let v = match seed {
                Some(seed) => pattern::make(seed, i, s as usize),
                None => vec![0; s as usize],
            };
            Descriptor::from_vec(v)
        })
        .collect()
}

/// Whether every descriptor holds `seed`'s pattern.
pub fn verify(descs: &[Descriptor<'_>], seed: u64) -> bool {
    descs.iter().enumerate().all(|(i, d)| {
        d.as_slice()
            .is_some_and(|s| pattern::first_mismatch(seed, i, s).is_none())
    })
}

/// A checksum over all descriptors.
pub fn checksum(descs: &[Descriptor<'_>]) -> u64 {
    descs.iter().fold(0u64, |acc, d| {
        acc.rotate_left(7) ^ pattern::checksum(d.as_slice().unwrap_or_default())
    })
}

struct PeerState {
    connector: Connector,
    /// How to make the UCX lane's connector, and the one made.
    ucx_builder: Option<ConnectorBuilder>,
    ucx_lane: tokio::sync::OnceCell<Result<Connector, String>>,
    raw_ucx: ucx::Raw,
    out: mpsc::UnboundedSender<Event>,
    cancels: Mutex<HashMap<u64, oneshot::Sender<()>>>,
    kept: Mutex<HashMap<u64, Vec<Descriptor<'static>>>>,
    pool: Mutex<HashMap<(Device, u64), Vec<Descriptor<'static>>>>,
    lent: Mutex<Option<Descriptor<'static>>>,
}

impl PeerState {
    fn send(&self, e: Event) {
        let _ = self.out.send(e);
    }

    /// The connector request `r` names.
    async fn connector_for(&self, r: &Request) -> Result<&Connector, String> {
        match r.lane.as_deref() {
            None => Ok(&self.connector),
            Some("ucx") => {
                let made = self.ucx_lane.get_or_init(|| async {
                    let b = self
                        .ucx_builder
                        .clone()
                        .ok_or("this peer has no UCX lane")?;
                    ucx_lane(b).build().await.map_err(|e| e.to_string())
                });
                made.await.as_ref().map_err(Clone::clone)
            }
            Some(other) => Err(format!("no lane {other:?} (only ucx)")),
        }
    }

    /// Pooled buffers of these sizes (see [`host_buffer`]).
    fn pooled(
        &self,
        sizes: &[u64],
        device: Option<&str>,
    ) -> std::io::Result<Vec<Descriptor<'static>>> {
        let mut pool = self.pool.lock().unwrap();
        let key = match device {
            None => Device::CPU,
            Some(d) => device_of(d)?,
        };
        sizes
            .iter()
            .map(|&s| match pool.get_mut(&(key, s)).and_then(|l| l.pop()) {
                Some(d) => Ok(d),
                None => match device {
                    None => host_buffer(s as usize),
                    Some(d) => device_buffer(d, s as usize),
                },
            })
            .collect()
    }

    fn unpool(&self, descs: Vec<Descriptor<'static>>) {
        let mut pool = self.pool.lock().unwrap();
        for d in descs {
            if d.is_writable() && !d.is_paged() {
                pool.entry((d.device(), d.size() as u64))
                    .or_default()
                    .push(d);
            }
        }
    }

    fn bufs(&self, r: &Request, seed: Option<u64>) -> Result<Vec<Descriptor<'static>>, String> {
        if r.reuse {
            self.pooled(&r.sizes, r.device.as_deref())
                .map_err(|e| e.to_string())
        } else {
            Ok(buffers(&r.sizes, seed))
        }
    }

    fn send_metadata(&self, id: u64, m: &RdmaMetadata, created_ns: u64) {
        let mut ev = Event::new(id, "metadata");
        ev.metadata = Some(m.to_json());
        ev.created_ns = Some(created_ns);
        self.send(ev);
    }

    /// Waits for `op` (or a cancel of request `id`), then reports.
    async fn finish(
        &self,
        r: &Request,
        started: Instant,
        op: Box<dyn Operation<'static>>,
        seed: Option<u64>,
    ) {
        let (id, deadline) = (r.id, r.deadline_ms);
        let (tx, rx) = oneshot::channel();
        self.cancels.lock().unwrap().insert(id, tx);
        let mut ev = Event::new(id, "done");
        let waited = async {
            match deadline {
                Some(ms) => {
                    tokio::time::timeout(Duration::from_millis(ms), op.wait_for_completion())
                        .await
                        .unwrap_or(Err(ferry::Error::Timeout(Duration::from_millis(ms))))
                }
                None => op.wait_for_completion().await,
            }
        };
        let result = tokio::select! {
            res = waited => {
                if let Some(after) = r.after {
                    if let Err(e) = &res {
                        // Only when it did not complete: says why, on stderr.
                        eprintln!("peer: request {id} ended {}: {e}", op.status());
                    }
                    end_process(after, res.is_ok());
                }
                ev.done_ns = Some(crate::clock::monotonic_ns());
                res
            }
            _ = rx => {
                ev.before_cancel = Some(op.status().to_string());
                op.cancel();
                Err(ferry::Error::Cancelled)
            }
        };
        self.cancels.lock().unwrap().remove(&id);
        ev.micros = Some(started.elapsed().as_micros() as u64);
        ev.status = Some(op.status().to_string());
        ev.error = result.err().map(|e| e.to_string());
        ev.transport = op.transport().map(|t| t.to_string());
        // Waits for a copy still landing in the memory, if any: off the
        // runtime's hands (`block_in_place`), so that its other tasks (the
        // UCX worker's progress among them) keep running meanwhile.
        let descs = tokio::task::block_in_place(|| op.into_descriptors());
        if r.reuse {
            self.send(ev);
            self.unpool(descs);
            return;
        }
        if let Some(seed) = seed {
            ev.verified = Some(verify(&descs, seed));
        }
        ev.checksum = Some(checksum(&descs));
        self.kept.lock().unwrap().insert(id, descs);
        self.send(ev);
    }

    async fn handle(self: Arc<Self>, r: Request) {
        let started = Instant::now();
        let fail = |e: String| {
            let mut ev = Event::new(r.id, "done");
            ev.status = Some("NOT_STARTED".into());
            ev.error = Some(e);
            ev
        };
        let remote = || -> Result<RdmaMetadata, String> {
            let m = r.metadata.as_deref().ok_or("no metadata in request")?;
            RdmaMetadata::from_json(m).map_err(|e| ferry::Error::from(e).to_string())
        };
        let created_ns = crate::clock::monotonic_ns();
        let connector = match self.connector_for(&r).await {
            Ok(c) => c,
            Err(e) => return self.send(fail(e)),
        };
        // The buffers of the operation commands (filled with the pattern
        // where this side is the source).
        let bufs = match r.cmd {
            Cmd::Readable | Cmd::Writable | Cmd::Read | Cmd::Write => {
                let seed = matches!(r.cmd, Cmd::Readable | Cmd::Write).then_some(r.seed);
                match self.bufs(&r, seed) {
                    Ok(b) => b,
                    Err(e) => return self.send(fail(e)),
                }
            }
            _ => Vec::new(),
        };
        match r.cmd {
            Cmd::Readable => match connector.create_readable(bufs).await {
                Err(e) => self.send(fail(e.to_string())),
                Ok(op) => {
                    self.send_metadata(r.id, op.metadata(), created_ns);
                    self.finish(&r, started, Box::new(op), None).await
                }
            },
            Cmd::Writable => match connector.create_writable(bufs).await {
                Err(e) => self.send(fail(e.to_string())),
                Ok(op) => {
                    self.send_metadata(r.id, op.metadata(), created_ns);
                    let seed = (!r.reuse).then_some(r.seed);
                    self.finish(&r, started, Box::new(op), seed).await
                }
            },
            Cmd::Read => match remote() {
                Err(e) => self.send(fail(e)),
                Ok(m) => match connector.begin_read(&m, bufs).await {
                    Err(e) => self.send(fail(e.to_string())),
                    Ok(op) => {
                        let seed = (!r.reuse).then_some(r.seed);
                        self.finish(&r, started, Box::new(op), seed).await
                    }
                },
            },
            Cmd::Write => match remote() {
                Err(e) => self.send(fail(e)),
                Ok(m) => match connector.begin_write(bufs, &m).await {
                    Err(e) => self.send(fail(e.to_string())),
                    Ok(op) => self.finish(&r, started, Box::new(op), None).await,
                },
            },
            Cmd::Cancel => {
                let tx = r
                    .target
                    .and_then(|t| self.cancels.lock().unwrap().remove(&t));
                let mut ev = Event::new(r.id, if tx.is_some() { "ok" } else { "error" });
                match tx {
                    Some(tx) => {
                        let _ = tx.send(());
                    }
                    None => ev.error = Some("no such running request".into()),
                }
                self.send(ev);
            }
            Cmd::Checksum => {
                let mut ev = Event::new(r.id, "checksum");
                ev.checksum = r
                    .target
                    .and_then(|t| self.kept.lock().unwrap().get(&t).map(|d| checksum(d)));
                self.send(ev);
            }
            Cmd::Stats => {
                let mut ev = Event::new(r.id, "stats");
                ev.exposed = Some(self.connector.exposed_count());
                ev.connections = Some(self.connector.connection_count());
                ev.pending = Some(self.connector.pending_count());
                self.send(ev);
            }
            Cmd::Crash => std::process::exit(9),
            Cmd::TcpStream => {
                let size = r.sizes.first().copied().unwrap_or(0) as usize;
                let ip = self.connector.local_addr().ip();
                let listener = match tokio::net::TcpListener::bind((ip, 0)).await {
                    Ok(l) => l,
                    Err(e) => return self.send(fail(e.to_string())),
                };
                let mut ev = Event::new(r.id, "listening");
                ev.address = listener.local_addr().ok().map(|a| a.to_string());
                self.send(ev);
                if let Ok((s, _)) = listener.accept().await {
                    let _ = tcp_stream_baseline(s, size).await;
                }
                self.send(Event::new(r.id, "done"));
            }
            Cmd::CpuTime => {
                let mut ev = Event::new(r.id, "cpu");
                ev.micros = Some(process_cpu_micros());
                self.send(ev);
            }
            Cmd::Lend => {
                let buf = match host_buffer(r.sizes.first().copied().unwrap_or(0) as usize) {
                    Ok(b) => b,
                    Err(e) => return self.send(fail(e.to_string())),
                };
                let mut ev = Event::new(r.id, "lent");
                ev.pid = Some(std::process::id());
                let at = buf.as_slice().map_or(0, |b| b.as_ptr() as usize);
                ev.address = Some(at.to_string());
                *self.lent.lock().unwrap() = Some(buf);
                self.send(ev);
            }
            Cmd::Pull => {
                let size = r.sizes.first().copied().unwrap_or(0) as usize;
                let (pid, addr) = (r.pid.unwrap_or(0), r.address.unwrap_or(0));
                let count = r.count.unwrap_or(1);
                let out = tokio::task::spawn_blocking(move || {
                    let mut d = host_buffer(size)?;
                    let buf = d.as_mut_slice().unwrap_or_default();
                    let mut lat = Vec::with_capacity(count);
                    for _ in 0..count {
                        let t = Instant::now();
                        copy_in_chunks(pid, addr, buf)?;
                        lat.push(t.elapsed().as_nanos() as u64);
                    }
                    std::io::Result::Ok(lat)
                })
                .await;
                let mut ev = Event::new(r.id, "done");
                match out {
                    Ok(Ok(lat)) => ev.lat_ns = Some(lat),
                    Ok(Err(e)) => ev.error = Some(e.to_string()),
                    Err(e) => ev.error = Some(e.to_string()),
                }
                self.send(ev);
            }
            Cmd::UcxLend => self.send(self.raw_ucx.lend(&r)),
            Cmd::UcxPull => {
                let ev = self.raw_ucx.pull(&r).await;
                self.send(ev)
            }
        }
    }
}

/// Ends the process as `after` says, at once, its exit code saying whether
/// the operation completed.
fn end_process(after: After, complete: bool) -> ! {
    let code = if complete {
        EXIT_COMPLETE
    } else {
        EXIT_NOT_COMPLETE
    };
    match after {
        After::Quit => std::process::exit(code),
        #[allow(unsafe_code)]
        // SAFETY: `_exit` takes no pointer and ends the process at once;
        // nothing of this process runs after it.
        After::Exit => unsafe { libc::_exit(code) },
    }
}

/// The UCX lane: `b` restricted to UCX (and TCP, which a connector always
/// has), with every transfer, whatever its size, by UCX. `ferry bench`'s
/// `ucx` rows run between two such connectors: both processes are the
/// bench's own (a trusted network), and on a machine without RDMA UCX can
/// only emulate its gets, which the rows measure as they are.
pub fn ucx_lane(b: ConnectorBuilder) -> ConnectorBuilder {
    b.transports(&[TransportKind::Ucx, TransportKind::Tcp])
        .cma_threshold(0)
        .ucx_trusted_network(true)
        .ucx_emulated_rma(true)
}

/// The raw cross-memory-attach baseline: copies `buf.len()` bytes from
/// `addr` of process `pid` in the chunks Ferry's `cma` transport uses (one
/// `process_vm_readv` per 2 MiB, which is also faster than one huge call).
pub fn copy_in_chunks(pid: u32, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
    const CHUNK: usize = ferry::cross_memory::CHUNK;
    for (i, c) in buf.chunks_mut(CHUNK).enumerate() {
        let at = addr
            .checked_add((i * CHUNK) as u64)
            .ok_or_else(|| std::io::Error::other("address overflows"))?;
        ferry::cross_memory::copy_from_process(pid, at, c)?;
    }
    Ok(())
}

/// Serves the plain-TCP baseline on one connection until it closes.
async fn tcp_stream_baseline(s: tokio::net::TcpStream, size: usize) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    s.set_nodelay(true)?;
    let (mut rd, mut wr) = s.into_split();
    let mut d = host_buffer(size)?;
    let buf = d.as_mut_slice().unwrap_or_default();
    let mut cmd = [0u8; 1];
    loop {
        if rd.read(&mut cmd).await? == 0 {
            return Ok(());
        }
        match cmd[0] {
            b'w' => {
                rd.read_exact(buf).await?;
                wr.write_all(b"k").await?;
            }
            _ => wr.write_all(buf).await?,
        }
    }
}

/// This process's user and system CPU time, in microseconds (Linux).
pub fn process_cpu_micros() -> u64 {
    // Fields 14 and 15 of /proc/self/stat, in clock ticks (100 per second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // After the ")" the fields start at number 3, so utime (14) is index 11.
    (ticks(11) + ticks(12)) * 10_000
}

/// Runs the peer on stdin and stdout until stdin closes; with `ucx`, how to
/// make its UCX lane's connector (see [`run_on`]).
pub async fn run(connector: Connector, ucx: Option<ConnectorBuilder>) -> anyhow::Result<()> {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    // When driven through pipes (the usual case), use them as non-blocking
    // pipes: Tokio's stdin and stdout go through a blocking thread pool,
    // which would add tens of microseconds to every metadata hand-over.
    let input = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
    let output = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Sender::from_owned_fd(fd).ok());
    match (input, output) {
        (Some(i), Some(o)) => run_on(connector, ucx, i, o).await,
        _ => run_on(connector, ucx, tokio::io::stdin(), tokio::io::stdout()).await,
    }
}

/// Runs the peer on any byte stream (a pipe, or a TCP control connection
/// for two-host benchmarks) until its input closes. With `ucx`, requests of
/// lane `ucx` run on a second connector, made from it by [`ucx_lane`] at
/// the first such request (so a peer never asked starts no UCX).
pub async fn run_on<R, W>(
    connector: Connector,
    ucx: Option<ConnectorBuilder>,
    input: R,
    output: W,
) -> anyhow::Result<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let mut ready = Event::new(0, "ready");
    ready.worker_id = Some(connector.worker_id().to_string());
    tx.send(ready).ok();
    let state = Arc::new(PeerState {
        connector,
        ucx_builder: ucx,
        ucx_lane: tokio::sync::OnceCell::new(),
        raw_ucx: ucx::Raw::default(),
        out: tx,
        cancels: Mutex::new(HashMap::new()),
        kept: Mutex::new(HashMap::new()),
        pool: Mutex::new(HashMap::new()),
        lent: Mutex::new(None),
    });
    let writer = tokio::spawn(async move {
        let mut stdout = output;
        while let Some(ev) = rx.recv().await {
            let mut line = serde_json::to_vec(&ev).expect("events serialize");
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let mut lines = BufReader::new(input).lines();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Request>(&line) {
            Ok(r) => {
                tokio::spawn(state.clone().handle(r));
            }
            Err(e) => {
                let mut ev = Event::new(0, "error");
                ev.error = Some(format!("bad request: {e}"));
                state.send(ev);
            }
        }
    }
    drop(state);
    let _ = writer.await;
    Ok(())
}
