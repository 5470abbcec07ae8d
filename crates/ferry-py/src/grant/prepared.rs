//! Prepared range transfers: `RemoteGrant.prepare_ranges` checks a range
//! transfer's arguments once, and the `PreparedRanges` it returns posts
//! that transfer again and again (NIXL's model: a transfer made once and
//! re-posted), each post taking its local blocks from the pool's table as
//! [`RemoteGrant`]'s `read_ranges`/`write_ranges` do, with no argument
//! parsed again.
//!
//! Three ways to post:
//!
//! - `run_blocking` runs it in the calling thread and raises if it fails;
//! - `start` runs it on Ferry's runtime and returns a `Pending`, which
//!   Python polls with no round trip through asyncio (`done()` reads one
//!   atomic);
//! - `post` is NIXL's post, one at a time: refused while the last one is in
//!   progress or once one of its `Gate`s has closed, it runs in the call
//!   what is small enough and starts the rest, and the object itself then
//!   tells how the last post went (`done`, `error`, `wait`, `times`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry::BlockRange;
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;

use super::ranges::{self, is_large, Ranges};
use super::{seconds_arg, RemoteGrant};
use crate::bridge::{block_on, block_on_detached, spawn};
use crate::errors::error_to_py;
use crate::lock;
use crate::pool::Pool;

/// The largest post copied with the GIL held, over cross-memory attach
/// only (see `PreparedRanges.run_blocking`).
pub(crate) const HOLD_GIL_MAX: u64 = 64 << 10;

/// `PreparedRanges.post`'s (and `PreparedGroup.post`'s) answers.
pub(super) const DONE: u8 = 0;
pub(super) const IN_PROGRESS: u8 = 1;
pub(super) const FAILED: u8 = 2;
pub(super) const BUSY: u8 = 3;
pub(super) const CLOSED: u8 = 4;

/// A flag that a prepared transfer's posts need open: Python closes it
/// when what the transfer names goes away (a region deregistered, an
/// agent removed), and no post starts after that.
#[pyclass(frozen, module = "ferry._ferry")]
#[derive(Default)]
pub(crate) struct Gate {
    closed: AtomicBool,
}

#[pymethods]
impl Gate {
    #[new]
    fn new() -> Self {
        Gate::default()
    }

    /// Closes it, for good.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Whether it is still open.
    #[getter]
    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::SeqCst)
    }
}

/// A range transfer over a grant, checked once, posted any number of
/// times.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct PreparedRanges {
    grant: ferry::RemoteGrant,
    pool: Py<Pool>,
    remote: Arc<[BlockRange]>,
    at: Arc<[(u32, u64)]>,
    ids: Arc<[u32]>,
    write: bool,
    large: bool,
    nbytes: u64,
    /// Whether a post runs with the GIL held (see `run_blocking`).
    hold_gil: bool,
    /// The last post made by `post`, and the gates it needs open.
    last: LastPost,
}

/// The last post of a prepared transfer (or group), and the gates a post
/// needs open.
pub(super) struct LastPost {
    gates: Vec<Py<Gate>>,
    last: Mutex<Option<Arc<Shared>>>,
}

impl LastPost {
    pub(super) fn new(gates: Vec<Py<Gate>>) -> Self {
        LastPost {
            gates,
            last: Mutex::new(None),
        }
    }

    /// Makes a new post the last one, or says why not: [`BUSY`] while the
    /// last is in progress, [`CLOSED`] once a gate has closed (that post
    /// then ends failed).
    pub(super) fn begin(&self, py: Python<'_>) -> Result<Arc<Shared>, u8> {
        let shared = Arc::new(Shared::new());
        {
            let mut last = lock(&self.last);
            if last.as_ref().is_some_and(|s| !s.is_done()) {
                return Err(BUSY);
            }
            *last = Some(shared.clone());
        }
        // The gates are read only now, after this post became the last
        // one: whoever closes a gate and then waits for the last post
        // (`wait`) either waits for this one or is seen here.
        if self.gates.iter().any(|g| !g.get().is_open()) {
            shared.fail(
                py,
                PyRuntimeError::new_err("not posted: what the transfer names is gone"),
            );
            return Err(CLOSED);
        }
        Ok(shared)
    }

    /// The last post, if any.
    pub(super) fn get(&self) -> Option<Arc<Shared>> {
        lock(&self.last).clone()
    }

    /// Whether the last post has ended (true if none was made).
    pub(super) fn done(&self) -> bool {
        self.get().is_none_or(|s| s.is_done())
    }

    /// Why the last post failed, once it has ended.
    pub(super) fn error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.get().and_then(|s| s.error(py))
    }

    /// When the last post ended, as `time.monotonic_ns()` counts.
    pub(super) fn finished_ns(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.get().map_or(Ok(None), |s| s.finished_ns(py))
    }

    /// Waits at most `timeout` seconds for the last post to end.
    pub(super) fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        self.get().map_or(Ok(true), |s| s.wait(py, timeout))
    }

    /// The last post's times (see `PreparedRanges.times`).
    pub(super) fn times(&self) -> Option<(u64, u64, Option<u64>)> {
        self.get().map(|s| s.times())
    }
}

impl PreparedRanges {
    /// The transfer's arguments for one post, its local blocks taken.
    pub(super) fn take(&self, py: Python<'_>) -> PyResult<Ranges> {
        let p = self.pool.get();
        // A READ writes into the local blocks; a WRITE only reads them.
        let claim = p.hold_block_ids(py, &self.ids, !self.write)?;
        Ok(Ranges {
            remote: self.remote.clone(),
            pool: p.rust().clone(),
            at: self.at.clone(),
            claim,
        })
    }

    /// The grant it goes through, and whether it writes.
    pub(super) fn grant(&self) -> (ferry::RemoteGrant, bool) {
        (self.grant.clone(), self.write)
    }

    /// Bytes per post.
    pub(super) fn nbytes_of(&self) -> u64 {
        self.nbytes
    }

    pub(super) async fn run(
        grant: ferry::RemoteGrant,
        write: bool,
        t: Ranges,
        notify: Option<Vec<u8>>,
    ) -> ferry::Result<()> {
        if write {
            ranges::write(grant, t, notify).await
        } else {
            ranges::read(grant, t, notify).await
        }
    }

    /// Runs one post in this call (see `run_blocking`).
    pub(super) fn run_here(
        &self,
        py: Python<'_>,
        t: Ranges,
        notify: Option<Vec<u8>>,
    ) -> PyResult<ferry::Result<()>> {
        // Not boxed: a kilobyte or more, it would take the allocator's slow
        // path at every post; a move of it costs less.
        let work = Self::run(self.grant.clone(), self.write, t, notify);
        if self.hold_gil {
            block_on(py, work)
        } else {
            block_on_detached(py, work)
        }
    }

    /// Starts one post on the runtime; it reports to `shared`.
    fn run_there(&self, t: Ranges, notify: Option<Vec<u8>>, shared: Arc<Shared>) -> PyResult<()> {
        let work = Box::pin(Self::run(self.grant.clone(), self.write, t, notify));
        spawn(async move {
            let r = work.await;
            shared.finish(r);
        })
    }
}

#[pymethods]
impl PreparedRanges {
    /// Runs one post in this call: the bytes have moved (and the
    /// notification is queued) when it returns. A post of at most 64 KiB
    /// over cross-memory attach runs with the GIL held, as long as it does
    /// not wait (the kernel copies that much in microseconds: less than
    /// letting the GIL go and taking it back); anything else, and any
    /// wait, without it (a peer over the network never holds up this
    /// process's Python threads).
    #[pyo3(signature = (notify=None))]
    fn run_blocking(&self, py: Python<'_>, notify: Option<Vec<u8>>) -> PyResult<()> {
        let t = self.take(py)?;
        self.run_here(py, t, notify)?
            .map_err(|e| error_to_py(py, e))
    }

    /// Starts one post on Ferry's runtime; a `Pending`. The local blocks
    /// are taken here (a refusal raises at once).
    #[pyo3(signature = (notify=None))]
    fn start(&self, py: Python<'_>, notify: Option<Vec<u8>>) -> PyResult<Pending> {
        let t = self.take(py)?;
        let shared = Arc::new(Shared::new());
        self.run_there(t, notify, shared.clone())?;
        Ok(Pending { shared })
    }

    /// Posts once, NIXL's way: 0 if the post ended in the call (the bytes
    /// moved), 1 if it is in progress (a large one, on Ferry's runtime), 2
    /// if it failed (`error()` says why); nothing is posted, and 3 comes
    /// back, while the last post is in progress, and 4 once a gate has
    /// closed.
    #[pyo3(signature = (notify=None))]
    fn post(&self, py: Python<'_>, notify: Option<Vec<u8>>) -> PyResult<u8> {
        let shared = match self.last.begin(py) {
            Ok(s) => s,
            Err(code) => return Ok(code),
        };
        let t = match self.take(py) {
            Ok(t) => t,
            Err(e) => {
                shared.fail(py, e);
                return Ok(FAILED);
            }
        };
        if self.large {
            if let Err(e) = self.run_there(t, notify, shared.clone()) {
                shared.fail(py, e);
                return Ok(FAILED);
            }
            shared.posted();
            return Ok(if shared.is_done() { DONE } else { IN_PROGRESS });
        }
        let r = match self.run_here(py, t, notify) {
            Ok(r) => r,
            Err(e) => {
                shared.fail(py, e);
                return Ok(FAILED);
            }
        };
        let ok = r.is_ok();
        shared.finish(r);
        shared.posted();
        Ok(if ok { DONE } else { FAILED })
    }

    /// Whether the last `post` has ended (true if none was made).
    fn done(&self) -> bool {
        self.last.done()
    }

    /// Why the last `post` failed, once it has ended; `None` if it
    /// succeeded, is in progress, or none was made.
    fn error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.last.error(py)
    }

    /// When the last `post` ended, as `time.monotonic_ns()` counts.
    fn finished_ns(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.last.finished_ns(py)
    }

    /// Nothing: a post in progress is never cut short.
    fn cancel(&self) {}

    /// Waits at most `timeout` seconds, without the GIL, for the last
    /// `post` to end; whether it has.
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        self.last.wait(py, timeout)
    }

    /// The last `post`'s times: `(start, post, transfer)`: when it began
    /// (microseconds since the epoch), how long the call took and, once it
    /// has ended, how long from its start to its end (nanoseconds); `None`
    /// if none was made.
    fn times(&self) -> Option<(u64, u64, Option<u64>)> {
        self.last.times()
    }

    /// Whether a post's copy runs off the runtime's threads (it moves at
    /// least `ferry.grant.INLINE_MAX` bytes).
    #[getter]
    fn large(&self) -> bool {
        self.large
    }

    /// Bytes per post.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Whether a post writes into the owner's memory.
    #[getter]
    fn write(&self) -> bool {
        self.write
    }
}

impl RemoteGrant {
    /// `RemoteGrant.prepare_ranges` (see there).
    pub(super) fn prepared(
        &self,
        py: Python<'_>,
        write: bool,
        remote: &Bound<'_, PyAny>,
        pool: &Bound<'_, Pool>,
        local: Vec<(i64, i64)>,
        gates: Vec<Py<Gate>>,
    ) -> PyResult<PreparedRanges> {
        let parsed = self.parse_ranges(py, remote, pool, local)?;
        let nbytes = parsed
            .remote
            .iter()
            .map(|r| r.len)
            .fold(0u64, u64::saturating_add);
        Ok(PreparedRanges {
            grant: self.inner.clone(),
            pool: pool.clone().unbind(),
            large: is_large(&parsed.remote),
            remote: parsed.remote,
            at: parsed.at,
            ids: parsed.ids.into(),
            write,
            nbytes,
            hold_gil: nbytes <= HOLD_GIL_MAX && self.inner.lane() == ferry::GrantLane::Cma,
            last: LastPost::new(gates),
        })
    }
}

/// One post's state, shared by the thread that runs it and whoever asks.
pub(super) struct Shared {
    done: AtomicBool,
    result: Mutex<Option<(ferry::Result<()>, Instant)>>,
    ended: Condvar,
    /// Threads in `wait`: `finish` wakes them only if there are any (a
    /// wake is a system call, and most posts are polled, not waited for).
    waiters: AtomicUsize,
    /// The Python exception of a failed post, made once.
    error: OnceLock<Py<PyAny>>,
    start: Instant,
    start_wall_us: u64,
    post_ns: AtomicU64,
}

impl Shared {
    fn new() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Shared {
            done: AtomicBool::new(false),
            result: Mutex::new(None),
            ended: Condvar::new(),
            waiters: AtomicUsize::new(0),
            error: OnceLock::new(),
            start: Instant::now(),
            start_wall_us: wall.as_micros() as u64,
            post_ns: AtomicU64::new(0),
        }
    }

    pub(super) fn finish(&self, r: ferry::Result<()>) {
        let mut slot = lock(&self.result);
        *slot = Some((r, Instant::now()));
        self.done.store(true, Ordering::Release);
        drop(slot);
        // A waiter counted after this load takes the lock after the result
        // was set, and sees it.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.ended.notify_all();
        }
    }

    /// Ends it with a refusal raised before the copy began.
    pub(super) fn fail(&self, py: Python<'_>, e: PyErr) {
        let _ = self.error.set(e.into_value(py).into_any());
        self.finish(Ok(()));
        self.posted();
    }

    /// The posting call returns now.
    pub(super) fn posted(&self) {
        let ns = self.start.elapsed().as_nanos() as u64;
        self.post_ns.store(ns.max(1), Ordering::Relaxed);
    }

    pub(super) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(super) fn error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if !self.is_done() {
            return None;
        }
        if let Some(e) = self.error.get() {
            return Some(e.clone_ref(py));
        }
        let err = match lock(&self.result).as_ref() {
            Some((Err(e), _)) => e.clone(),
            _ => return None,
        };
        let value = error_to_py(py, err).into_value(py).into_any();
        Some(self.error.get_or_init(|| value).clone_ref(py))
    }

    pub(super) fn finished_ns(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let ago = match lock(&self.result).as_ref() {
            Some((_, at)) => at.elapsed(),
            None => return Ok(None),
        };
        let now: u64 = py
            .import(intern!(py, "time"))?
            .call_method0(intern!(py, "monotonic_ns"))?
            .extract()?;
        Ok(Some(now.saturating_sub(ago.as_nanos() as u64)))
    }

    pub(super) fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let limit = seconds_arg("timeout", timeout)?;
        if self.is_done() {
            return Ok(true);
        }
        Ok(py.detach(|| {
            let deadline = Instant::now() + limit.min(Duration::from_secs(1 << 30));
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let mut slot = lock(&self.result);
            let ended = loop {
                if slot.is_some() {
                    break true;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break false;
                }
                slot = match self.ended.wait_timeout(slot, left) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            };
            drop(slot);
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            ended
        }))
    }

    pub(super) fn times(&self) -> (u64, u64, Option<u64>) {
        let end = lock(&self.result)
            .as_ref()
            .map(|(_, at)| at.saturating_duration_since(self.start).as_nanos() as u64);
        (
            self.start_wall_us,
            self.post_ns.load(Ordering::Relaxed),
            end,
        )
    }
}

/// A post started by `PreparedRanges.start`. It cannot be cut short: a
/// copy in progress finishes before its memory can be handed back.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct Pending {
    shared: Arc<Shared>,
}

#[pymethods]
impl Pending {
    /// Whether the post has ended (moved its bytes, or failed).
    fn done(&self) -> bool {
        self.shared.is_done()
    }

    /// Why it failed, once `done()`; `None` if it succeeded or is still
    /// in progress.
    fn error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.shared.error(py)
    }

    /// When it ended, as `time.monotonic_ns()` counts, once `done()`.
    fn finished_ns(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.shared.finished_ns(py)
    }

    /// Nothing: a post in progress is never cut short (see the class).
    fn cancel(&self) {}

    /// Waits at most `timeout` seconds, without the GIL, for the post to
    /// end; whether it has.
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        self.shared.wait(py, timeout)
    }
}
