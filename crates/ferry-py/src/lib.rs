//! The compiled core of Ferry's Python package, imported as `ferry._ferry`.
//!
//! The public API (`ferry.Connector`, `ferry.Descriptor`, the four operation
//! classes, the enums and the exceptions) is written in Python, in
//! `python/ferry/`, on top of the few classes here:
//!
//! - `Connector` wraps a [`ferry::Connector`]. Creating a readable or a
//!   writable is synchronous (nothing waits); `begin_read`/`begin_write`
//!   return an `asyncio.Future` (or block, releasing the GIL, in their
//!   `_blocking` forms).
//! - `Operation` is any of the four operations, together with the Python
//!   objects that own the memory it moves.
//! - `Metadata` wraps a [`ferry::RdmaMetadata`].
//!
//! One multi-thread Tokio runtime per process runs every connector. A future
//! that is ready at once (most are: creating a readable, starting a read on a
//! pooled connection) completes on the calling thread. The others run on the
//! runtime and post their result to the `Mailbox` of the event loop that
//! awaits them, which wakes that loop through a socket pair it watches. So no
//! thread but the loop's ever takes the GIL, nothing polls, and a Python
//! thread that blocks on Rust releases the GIL first.
#![deny(unsafe_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ferry::{Device, DeviceKind, OperationKind, OperationStatus};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyModule, PyType};

// ---------------------------------------------------------------------------
// The runtime and the way results get back to asyncio
// ---------------------------------------------------------------------------

/// What the extension keeps per process.
struct Core {
    rt: tokio::runtime::Runtime,
    /// The process that started `rt`: a child forked afterwards has none of
    /// its threads.
    pid: u32,
}

static CORE: OnceLock<Core> = OnceLock::new();

/// The runtime, started on first use.
fn core() -> PyResult<&'static Core> {
    let core = match CORE.get() {
        Some(c) => c,
        None => {
            // Callers hold the GIL and nothing here releases it, so two
            // threads cannot both get here; `set` failing is harmless anyway.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("ferry-rt")
                .build()
                .map_err(|e| {
                    PyRuntimeError::new_err(format!("cannot start ferry's runtime: {e}"))
                })?;
            let _ = CORE.set(Core {
                rt,
                pid: std::process::id(),
            });
            CORE.get().expect("set just above")
        }
    };
    if core.pid != std::process::id() {
        return Err(PyRuntimeError::new_err(
            "ferry was started in the parent of this forked process, and its threads \
             do not exist here: use ferry only after fork (or use the 'spawn' start method)",
        ));
    }
    Ok(core)
}

/// What a Rust future hands to the asyncio future awaiting it.
enum Outcome {
    /// A wait ended.
    Done(ferry::Result<()>),
    /// A `begin_read`/`begin_write` ended.
    Started(ferry::Result<Box<Operation>>),
}

/// `(exception, value)` for `resolve`: one of the two is `None`.
fn outcome_to_py(py: Python<'_>, outcome: Outcome) -> (Py<PyAny>, Py<PyAny>) {
    let result: PyResult<Py<PyAny>> = match outcome {
        Outcome::Done(r) => r.map(|()| py.None()).map_err(|e| error_to_py(py, e)),
        Outcome::Started(r) => r
            .map_err(|e| error_to_py(py, e))
            .and_then(|op| Ok(Py::new(py, *op)?.into_any())),
    };
    match result {
        Ok(v) => (py.None(), v),
        Err(e) => (e.into_value(py).into_any(), py.None()),
    }
}

/// Completes `future` with `outcome`, unless it is already done (cancelled).
/// An operation that nobody receives is dropped, which cancels it.
fn resolve(future: &Bound<'_, PyAny>, outcome: Outcome) -> PyResult<()> {
    let py = future.py();
    if future.call_method0(intern!(py, "done"))?.is_truthy()? {
        return Ok(());
    }
    match outcome_to_py(py, outcome) {
        (exception, value) if exception.is_none(py) => {
            future.call_method1(intern!(py, "set_result"), (value,))?
        }
        (exception, _) => future.call_method1(intern!(py, "set_exception"), (exception,))?,
    };
    Ok(())
}

/// Results finished on the runtime, waiting for one event loop to pick them
/// up.
///
/// A Tokio task that finishes posts its result here and, if the mailbox was
/// not signalled yet, writes one byte into a socket pair whose other end the
/// loop watches (`loop.add_reader`): the loop wakes up and `drain`s every
/// result posted so far, on its own thread, with the GIL. No thread but the
/// loop's touches Python objects or waits for the GIL, nothing polls, and
/// many results cost one wake-up.
struct Mailbox {
    posted: Mutex<Vec<(Py<PyAny>, Outcome)>>,
    signalled: AtomicBool,
    wake: UnixStream,
    woken: UnixStream,
}

impl Mailbox {
    fn post(&self, future: Py<PyAny>, outcome: Outcome) {
        lock(&self.posted).push((future, outcome));
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // Non-blocking; it cannot be full: at most one byte is written
            // per signal, and `drain` reads them all.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// The mailbox of one event loop (see [`Mailbox`]); `ferry` makes one per loop.
#[pyclass(frozen, module = "ferry._ferry")]
struct Bridge(Arc<Mailbox>);

#[pymethods]
impl Bridge {
    #[new]
    fn new() -> PyResult<Self> {
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        Ok(Bridge(Arc::new(Mailbox {
            posted: Mutex::new(Vec::new()),
            signalled: AtomicBool::new(false),
            wake,
            woken,
        })))
    }

    /// The descriptor the loop watches for readability.
    fn fileno(&self) -> i32 {
        self.0.woken.as_raw_fd()
    }

    /// Completes the futures of every result posted so far. Called by the
    /// loop when `fileno` is readable.
    fn drain(&self, py: Python<'_>) {
        let mut buf = [0u8; 64];
        while matches!((&self.0.woken).read(&mut buf), Ok(n) if n > 0) {}
        // Cleared before taking the results: a result posted from here on
        // signals again.
        self.0.signalled.store(false, Ordering::Release);
        let posted = std::mem::take(&mut *lock(&self.0.posted));
        for (future, outcome) in posted {
            if let Err(e) = resolve(future.bind(py), outcome) {
                e.write_unraisable(py, Some(future.bind(py)));
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Done-callback of an asyncio future: when the future was cancelled (by
/// `asyncio.wait_for`, a task's cancellation...), aborts the Tokio task
/// that would have completed it, which drops the Rust future.
#[pyclass(frozen, module = "ferry._ferry")]
struct AbortOnCancel(tokio::task::AbortHandle);

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future
            .call_method0(intern!(future.py(), "cancelled"))?
            .is_truthy()?
        {
            self.0.abort();
        }
        Ok(())
    }
}

static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static BRIDGE_FOR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Polls `fut` once on the calling thread, inside the runtime's context.
/// Most of Ferry's futures are ready at once (creating a readable, starting
/// a read on a pooled connection, waiting for an operation that has ended):
/// they then cost no thread hop at all.
fn poll_once<F: Future>(core: &Core, fut: Pin<&mut F>) -> Poll<F::Output> {
    let _context = core.rt.enter();
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// An `asyncio.Future` of the running loop with the outcome of `work`: set
/// at once when `work` is ready at once, else from the runtime through the
/// loop's [`Bridge`]. Cancelling the asyncio future drops `work`.
fn run_future<'py, F>(py: Python<'py>, work: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Outcome> + Send + 'static,
{
    let core = core()?;
    let event_loop = GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()?;
    let future = event_loop.call_method0(intern!(py, "create_future"))?;
    let mut work = Box::pin(work);
    match poll_once(core, work.as_mut()) {
        Poll::Ready(outcome) => resolve(&future, outcome)?,
        Poll::Pending => {
            let bridge = BRIDGE_FOR
                .import(py, "ferry._api", "_bridge_for")?
                .call1((&event_loop,))?;
            let mailbox = bridge.cast::<Bridge>()?.get().0.clone();
            let f = future.clone().unbind();
            let task = core.rt.spawn(async move {
                let outcome = work.await;
                mailbox.post(f, outcome);
            });
            future.call_method1(
                intern!(py, "add_done_callback"),
                (AbortOnCancel(task.abort_handle()),),
            )?;
        }
    }
    Ok(future)
}

/// Runs `fut` to completion on the calling thread: at once if it is ready
/// at once, else blocking without the GIL.
fn block_on<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let core = core()?;
    let mut fut = pin!(fut);
    Ok(match poll_once(core, fut.as_mut()) {
        Poll::Ready(v) => v,
        Poll::Pending => py.detach(|| core.rt.block_on(fut)),
    })
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The exception class `name` of `ferry._errors` (pure Python, so that its
/// classes can also derive from `ConnectionError` and the like).
fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module =
        ERRORS.get_or_try_init(py, || PyResult::Ok(py.import("ferry._errors")?.unbind()))?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// The Python exception for `e`, with the core's message: `ValueError` for
/// misuse and bad metadata, `TimeoutError` for deadlines, a `FerryError`
/// subclass for everything that made a transfer fail.
fn error_to_py(py: Python<'_>, e: ferry::Error) -> PyErr {
    use ferry::Error as E;
    let message = e.to_string();
    let class = match e {
        E::Timeout(_) => return PyTimeoutError::new_err(message),
        E::InvalidMetadata(_) => return PyValueError::new_err(message),
        ref e if e.is_misuse() => return PyValueError::new_err(message),
        E::WrongWorker { .. } => "StaleMetadataError",
        E::Unreachable { .. } => "UnreachableError",
        E::Rejected { .. } => "RejectedError",
        E::RemoteCancelled => "RemoteCancelledError",
        E::ConnectionLost { .. } => "ConnectionLostError",
        E::Protocol { .. } => "ProtocolError",
        E::Cancelled => "OperationCancelledError",
        E::Shutdown => "ShutdownError",
        _ => "FerryError",
    };
    match error_class(py, class) {
        Ok(t) => PyErr::from_type(t, message),
        Err(err) => err,
    }
}

// ---------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------

/// A descriptor as the Python layer hands it over: address, size, device,
/// writable, and the object that keeps the memory alive (and, for buffers,
/// exported, so that it cannot be resized or freed).
type RawDescriptor = (usize, usize, String, bool, Py<PyAny>);

/// What an operation's memory needs until the operation has let go of it:
/// the claim on the address ranges, and the Python objects that own them.
struct Owners {
    _claim: Claim,
    _keep: Vec<Py<PyAny>>,
}

/// Builds the Rust descriptors for an operation that `writes` into them (a
/// read, a writable) or only reads them, claims their memory, and returns
/// them with what must outlive every use of them.
#[allow(unsafe_code)]
fn descriptors(
    raw: Vec<RawDescriptor>,
    writes: bool,
) -> PyResult<(Vec<ferry::Descriptor<'static>>, Owners)> {
    let mut ranges = Vec::with_capacity(raw.len());
    for (index, (ptr, size, device, _, _)) in raw.iter().enumerate() {
        if device == "cpu" && *size > 0 {
            ranges.push((index, *ptr, ptr.saturating_add(*size)));
        }
    }
    let claim = Claim::new(ranges, writes)?;
    // `descs` is declared last so that it is dropped first on an early return.
    let mut keep = Vec::with_capacity(raw.len());
    let mut descs = Vec::with_capacity(raw.len());
    for (index, (ptr, size, device, writable, owner)) in raw.into_iter().enumerate() {
        let device: Device = device
            .parse()
            .map_err(|e: ferry::ParseDeviceError| PyValueError::new_err(e.to_string()))?;
        if ptr == 0 && size > 0 {
            return Err(PyValueError::new_err(format!(
                "descriptor {index} has a null pointer and a size of {size} bytes"
            )));
        }
        if isize::try_from(size).is_err() || ptr.checked_add(size).is_none() {
            return Err(PyValueError::new_err(format!(
                "descriptor {index}: {size} bytes at {ptr:#x} wrap around the address space"
            )));
        }
        // SAFETY: `from_raw_parts` needs the memory valid (and writable if
        // `writable`), not freed, and not accessed by others, for as long as
        // the descriptor or an operation holding it exists.
        // - Validity: the Python layer (`ferry/_types.py`) takes
        //   `ptr`/`size` only from what the interpreter or the framework
        //   guarantees, never from a method an arbitrary object can define:
        //   a buffer export (address, size and the export itself from one
        //   `Py_buffer`), the storage of a `bytes` object (`bytes_address`,
        //   its C length, not `len()`), or torch's own C methods of a tensor
        //   whose type is exactly `torch.Tensor` or `torch.nn.Parameter`. It
        //   marks read-only memory (bytes, read-only buffers) not writable,
        //   and Ferry never writes into a descriptor that is not. The raw
        //   `(ptr, size, device, ref)` form is the caller's promise, exactly
        //   as in the reference API.
        // - Lifetime: `owner` is that object (with the buffer export that
        //   pins the memory: a bytearray cannot be resized while exported).
        //   It is kept next to the descriptor — in `KeepAlive` while an
        //   operation starts, then in `Holder` — and dropped only after the
        //   operation, whose drop closes its memory region so that no
        //   transport touches the memory afterwards (see `Holder`).
        // - Exclusivity: Python code must not use the memory while an
        //   operation is in progress, as with any buffer handed to native
        //   code (NIXL's, DMA engines'); the package documents it.
        // - Device memory (`cuda:N`) is never dereferenced: Ferry refuses it.
        //   The descriptor holds a reference of its own to `owner`, so that
        //   an operation dropped while a copy into its memory is stalled by
        //   a same-host peer keeps the memory alive instead of waiting (with
        //   the GIL held) for the copy to return.
        let mine = Python::attach(|py| owner.clone_ref(py));
        let d = unsafe {
            ferry::Descriptor::from_raw_parts_with_owner(
                ptr as *mut u8,
                size,
                device,
                writable,
                mine,
            )
        };
        descs.push(d);
        keep.push(owner);
    }
    Ok((
        descs,
        Owners {
            _claim: claim,
            _keep: keep,
        },
    ))
}

/// Host memory that operations in progress use. A second operation that
/// would write bytes another one uses, or use bytes another one writes, is
/// refused: the two would race on those bytes. (The reference leaves this to
/// the caller; from Python, passing one buffer to two operations is easy.)
static CLAIMS: Mutex<Vec<Claimed>> = Mutex::new(Vec::new());

struct Claimed {
    start: usize,
    end: usize,
    writes: bool,
    by: Arc<ClaimOwner>,
}

/// The operation behind a claim: unknown while it starts.
#[derive(Default)]
struct ClaimOwner(OnceLock<Weak<Holder>>);

impl ClaimOwner {
    /// Whether the operation may still touch its memory. An operation that
    /// has ended has closed its region, even if its handle lives on. A
    /// handle found here is pushed to `found`, to be dropped only after
    /// `CLAIMS` is unlocked (its drop takes that lock).
    fn in_use(&self, found: &mut Vec<Arc<Holder>>) -> bool {
        match self.0.get() {
            None => true,
            Some(op) => match op.upgrade() {
                None => false,
                Some(h) => {
                    let open = !h.op.status().is_terminal();
                    found.push(h);
                    open
                }
            },
        }
    }
}

/// One operation's claim on its memory, released when dropped.
struct Claim(Arc<ClaimOwner>);

impl Claim {
    /// Claims `(index, start, end)` ranges, or says which one conflicts.
    fn new(mut ranges: Vec<(usize, usize, usize)>, writes: bool) -> PyResult<Claim> {
        let by = Arc::new(ClaimOwner::default());
        if ranges.is_empty() {
            return Ok(Claim(by));
        }
        ranges.sort_unstable_by_key(|&(_, start, _)| start);
        if writes {
            if let Some(w) = ranges.windows(2).find(|w| w[1].1 < w[0].2) {
                return Err(PyValueError::new_err(format!(
                    "descriptors {} and {} overlap, and this operation writes into them",
                    w[0].0.min(w[1].0),
                    w[0].0.max(w[1].0)
                )));
            }
        }
        let low = ranges[0].1;
        let high = ranges.iter().map(|r| r.2).max().unwrap_or(low);
        let mut found = Vec::new();
        let mut claims = lock(&CLAIMS);
        claims.retain(|c| c.by.in_use(&mut found));
        let conflict = claims
            .iter()
            .filter(|c| (writes || c.writes) && c.start < high && low < c.end)
            .find_map(|c| {
                ranges
                    .iter()
                    .find(|&&(_, start, end)| start < c.end && c.start < end)
                    .map(|&(index, _, _)| (index, c.writes))
            });
        if conflict.is_none() {
            claims.extend(ranges.iter().map(|&(_, start, end)| Claimed {
                start,
                end,
                writes,
                by: by.clone(),
            }));
        }
        drop(claims);
        drop(found);
        match conflict {
            None => Ok(Claim(by)),
            Some((index, other_writes)) => Err(PyValueError::new_err(format!(
                "descriptor {index} overlaps memory that an operation in progress {}:                  the two would race on those bytes; wait for the other operation to end                  (or cancel it), or use another buffer",
                if other_writes { "writes into" } else { "reads" }
            ))),
        }
    }

    /// Ties the claim to the operation, so that it lapses when the
    /// operation ends.
    fn attach(&self, holder: &Arc<Holder>) {
        let _ = self.0 .0.set(Arc::downgrade(holder));
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&CLAIMS).retain(|c| !Arc::ptr_eq(&c.by, &self.0));
    }
}

/// A future that owns the Python objects its descriptors point into, and
/// drops them only after the future itself: a `begin_*` future dropped
/// half-way (its asyncio future was cancelled) first fences its region, then
/// the memory is released.
struct KeepAlive<F> {
    // Field order is drop order.
    fut: Pin<Box<F>>,
    owners: Option<Owners>,
}

impl<F: Future> Future for KeepAlive<F> {
    type Output = (F::Output, Owners);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.fut.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready((v, this.owners.take().expect("polled after Ready"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

/// `op` as any of the four operations.
fn boxed<O: ferry::Operation<'static> + 'static>(op: O) -> Box<dyn ferry::Operation<'static>> {
    Box::new(op)
}

/// An operation and the Python objects that own the memory it moves.
struct Holder {
    // Field order is drop order: the operation first (its drop closes the
    // region: no transport touches the memory afterwards), then the owners.
    op: Box<dyn ferry::Operation<'static>>,
    owners: Owners,
}

impl Holder {
    async fn wait(&self, timeout: Option<Duration>) -> ferry::Result<()> {
        match timeout {
            None => self.op.wait_for_completion().await,
            Some(t) => self.op.wait_for_completion_timeout(t).await,
        }
    }

    /// The outcome of an operation that has ended.
    fn ended(&self) -> ferry::Result<()> {
        debug_assert!(self.op.status().is_terminal());
        // Waiting on an ended operation is ready at once.
        match pin!(self.wait(None)).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(ferry::Error::Cancelled),
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Dropping `op` would do this too; done explicitly so that the order
        // does not rest on field order alone. A no-op for an ended operation,
        // whose region is already closed.
        self.op.cancel();
    }
}

enum State {
    Open(Arc<Holder>),
    /// `close` released the operation; this is how it had ended.
    Closed(OperationStatus, ferry::Result<()>),
}

/// One of the four operations (see `kind`).
#[pyclass(frozen, module = "ferry._ferry")]
struct Operation {
    kind: &'static str,
    metadata: Option<ferry::RdmaMetadata>,
    state: Mutex<State>,
}

impl Operation {
    fn new(op: Box<dyn ferry::Operation<'static>>, owners: Owners) -> Self {
        let kind = match (op.kind(), op.is_passive()) {
            (OperationKind::Read, true) => "readable",
            (OperationKind::Write, true) => "writable",
            (OperationKind::Read, false) => "read",
            (OperationKind::Write, false) => "write",
        };
        let metadata = op.metadata().cloned();
        let holder = Arc::new(Holder { op, owners });
        holder.owners._claim.attach(&holder);
        Operation {
            kind,
            metadata,
            state: Mutex::new(State::Open(holder)),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn holder(&self) -> Option<Arc<Holder>> {
        self.snapshot().ok()
    }

    /// The operation, or how it ended if closed. The lock is released on
    /// return: it is never held while Python code runs or the GIL is
    /// released, or two threads could each wait for what the other holds.
    fn snapshot(&self) -> Result<Arc<Holder>, ferry::Result<()>> {
        match &*self.state() {
            State::Open(h) => Ok(h.clone()),
            State::Closed(_, outcome) => Err(outcome.clone()),
        }
    }
}

fn timeout_arg(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout
        .map(|t| {
            Duration::try_from_secs_f64(t).map_err(|_| {
                PyValueError::new_err(format!(
                    "timeout must be a finite number of seconds >= 0, not {t}"
                ))
            })
        })
        .transpose()
}

#[pymethods]
impl Operation {
    /// "readable", "writable", "read" or "write".
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// The status, as the reference's number (0 to 5).
    fn status(&self) -> u8 {
        match &*self.state() {
            State::Open(h) => h.op.status().as_u8(),
            State::Closed(s, _) => s.as_u8(),
        }
    }

    /// Cancels the operation unless it has ended; the remote is told. When
    /// this returns, Ferry no longer touches the memory.
    fn cancel(&self, py: Python<'_>) {
        if let Some(h) = self.holder() {
            py.detach(|| h.op.cancel());
        }
    }

    /// Cancels the operation unless it has ended, and releases it: the
    /// exposure is withdrawn and the memory's owners are let go (once no
    /// pending wait holds them). Status and outcome stay readable.
    fn close(&self, py: Python<'_>) {
        // The lock is never held while detached: a thread waiting for it
        // would hold the GIL that this one needs back.
        let Some(h) = self.holder() else {
            return;
        };
        let (status, outcome) = py.detach(|| {
            h.op.cancel();
            (h.op.status(), h.ended())
        });
        let mut state = self.state();
        if let State::Open(_) = &*state {
            *state = State::Closed(status, outcome);
        }
        drop(state);
        // The operation goes here (or with the last pending wait), after
        // its state was replaced.
        drop(h);
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        matches!(&*self.state(), State::Closed(..))
    }

    /// An asyncio future that completes when the operation ends: with
    /// `None` when it completed, else with the exception saying why.
    #[pyo3(signature = (timeout=None))]
    fn wait<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout_arg(timeout)?;
        let holder = self.snapshot();
        run_future(py, async move {
            Outcome::Done(match holder {
                Ok(h) => h.wait(timeout).await,
                Err(outcome) => outcome,
            })
        })
    }

    /// Blocks (without the GIL) until the operation ends.
    #[pyo3(signature = (timeout=None))]
    fn wait_blocking(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = timeout_arg(timeout)?;
        let holder = match self.snapshot() {
            Ok(h) => h,
            Err(outcome) => return outcome.map_err(|e| error_to_py(py, e)),
        };
        block_on(py, holder.wait(timeout))?.map_err(|e| error_to_py(py, e))
    }

    /// The metadata of a readable or writable, `None` for a read or write.
    fn metadata(&self) -> Option<Metadata> {
        self.metadata.clone().map(Metadata)
    }

    /// The transport that carries the bytes ("tcp"), once known.
    fn transport(&self) -> Option<&'static str> {
        self.holder()?.op.transport().map(|t| t.name())
    }
}

// ---------------------------------------------------------------------------
// Metadata
// ---------------------------------------------------------------------------

/// What a readable or writable hands to its remote (a capability: treat its
/// JSON like a password).
#[pyclass(frozen, module = "ferry._ferry")]
#[derive(Clone)]
struct Metadata(ferry::RdmaMetadata);

#[pymethods]
impl Metadata {
    /// Parses and validates metadata JSON (`str`, `bytes` or `bytearray`).
    #[staticmethod]
    fn from_json(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let parsed = if let Ok(b) = data.cast::<PyBytes>() {
            ferry::RdmaMetadata::from_json_bytes(b.as_bytes())
        } else if let Ok(b) = data.cast::<PyByteArray>() {
            ferry::RdmaMetadata::from_json_bytes(&b.to_vec())
        } else if let Ok(s) = data.extract::<String>() {
            ferry::RdmaMetadata::from_json(&s)
        } else {
            return Err(PyTypeError::new_err(format!(
                "metadata JSON must be str, bytes or bytearray, not {}",
                data.get_type().name()?
            )));
        };
        parsed
            .map(Metadata)
            .map_err(|e| PyValueError::new_err(ferry::Error::from(e).to_string()))
    }

    /// The JSON to hand to the remote worker.
    fn to_json(&self) -> String {
        self.0.to_json()
    }

    /// 1 (READ: metadata of a readable) or 2 (WRITE: of a writable).
    #[getter]
    fn operation_kind(&self) -> u8 {
        self.0.kind().as_u8()
    }

    /// The exposing worker's id.
    #[getter]
    fn worker_id(&self) -> &str {
        self.0.worker_id()
    }

    /// The exposing worker's host name.
    #[getter]
    fn hostname(&self) -> &str {
        self.0.hostname()
    }

    /// `(device, size)` of each exposed descriptor.
    #[getter]
    fn descriptors(&self) -> Vec<(String, u64)> {
        self.0
            .descriptors()
            .iter()
            .map(|d| (d.device.to_string(), d.size))
            .collect()
    }

    /// The sum of the descriptors' sizes.
    #[getter]
    fn total_size(&self) -> u64 {
        self.0.total_size()
    }
}

// ---------------------------------------------------------------------------
// Connector
// ---------------------------------------------------------------------------

/// One worker's connector.
#[pyclass(frozen, module = "ferry._ferry")]
struct Connector {
    inner: Arc<ferry::Connector>,
}

#[pymethods]
impl Connector {
    #[new]
    #[pyo3(signature = (worker_id=None, listen=None))]
    fn new(py: Python<'_>, worker_id: Option<String>, listen: Option<&str>) -> PyResult<Self> {
        let mut builder = ferry::Connector::builder();
        if let Some(id) = worker_id {
            builder = builder.worker_id(id);
        }
        if let Some(addr) = listen {
            let addr = addr.parse().map_err(|_| {
                PyValueError::new_err(format!(
                    "listen address {addr:?} is not of the form ip:port (e.g. \"127.0.0.1:0\")"
                ))
            })?;
            builder = builder.listen(addr);
        }
        let connector = block_on(py, builder.build())?.map_err(|e| error_to_py(py, e))?;
        Ok(Connector {
            inner: Arc::new(connector),
        })
    }

    /// The worker id.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// This host's name.
    #[getter]
    fn hostname(&self) -> &str {
        self.inner.hostname()
    }

    /// Whether CUDA memory can be moved (not in this version).
    #[getter]
    fn is_cuda_available(&self) -> bool {
        self.inner.is_cuda_available()
    }

    /// The address the connector listens on, `ip:port`.
    #[getter]
    fn local_address(&self) -> String {
        self.inner.local_addr().to_string()
    }

    /// How many readables and writables currently expose memory.
    fn exposed_count(&self) -> usize {
        self.inner.exposed_count()
    }

    /// How many pooled connections to remote workers are open.
    fn connection_count(&self) -> usize {
        self.inner.connection_count()
    }

    /// Exposes memory for one remote worker to read.
    fn create_readable(
        &self,
        py: Python<'_>,
        descriptors: Vec<RawDescriptor>,
    ) -> PyResult<Operation> {
        self.expose(py, descriptors, false)
    }

    /// Exposes memory for one remote worker to write.
    fn create_writable(
        &self,
        py: Python<'_>,
        descriptors: Vec<RawDescriptor>,
    ) -> PyResult<Operation> {
        self.expose(py, descriptors, true)
    }

    /// Starts reading the remote readable `metadata` describes; returns an
    /// asyncio future of the operation.
    fn begin_read<'py>(
        &self,
        py: Python<'py>,
        metadata: &Metadata,
        descriptors: Vec<RawDescriptor>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let work = self.begin(metadata, descriptors, false)?;
        run_future(py, async move { Outcome::Started(work.await) })
    }

    /// Starts writing into the remote writable `metadata` describes; returns
    /// an asyncio future of the operation.
    fn begin_write<'py>(
        &self,
        py: Python<'py>,
        descriptors: Vec<RawDescriptor>,
        metadata: &Metadata,
    ) -> PyResult<Bound<'py, PyAny>> {
        let work = self.begin(metadata, descriptors, true)?;
        run_future(py, async move { Outcome::Started(work.await) })
    }

    /// `begin_read`, blocking (without the GIL) until the operation has started.
    fn begin_read_blocking(
        &self,
        py: Python<'_>,
        metadata: &Metadata,
        descriptors: Vec<RawDescriptor>,
    ) -> PyResult<Operation> {
        let work = self.begin(metadata, descriptors, false)?;
        block_on(py, work)?
            .map(|op| *op)
            .map_err(|e| error_to_py(py, e))
    }

    /// `begin_write`, blocking (without the GIL) until the operation has started.
    fn begin_write_blocking(
        &self,
        py: Python<'_>,
        descriptors: Vec<RawDescriptor>,
        metadata: &Metadata,
    ) -> PyResult<Operation> {
        let work = self.begin(metadata, descriptors, true)?;
        block_on(py, work)?
            .map(|op| *op)
            .map_err(|e| error_to_py(py, e))
    }
}

impl Connector {
    fn expose(
        &self,
        py: Python<'_>,
        raw: Vec<RawDescriptor>,
        writable: bool,
    ) -> PyResult<Operation> {
        let (descs, owners) = descriptors(raw, writable)?;
        let inner = &self.inner;
        // Ready at once: exposing memory waits for nothing.
        let op = block_on(py, async {
            if writable {
                inner.create_writable(descs).await.map(boxed)
            } else {
                inner.create_readable(descs).await.map(boxed)
            }
        })?;
        // On failure the descriptors are gone by now, and `owners` go after them.
        Ok(Operation::new(op.map_err(|e| error_to_py(py, e))?, owners))
    }

    /// The future that starts a read or write, owning everything it needs.
    fn begin(
        &self,
        metadata: &Metadata,
        raw: Vec<RawDescriptor>,
        write: bool,
    ) -> PyResult<impl Future<Output = ferry::Result<Box<Operation>>> + Send + 'static> {
        // A read writes into its descriptors; a write only reads them.
        let (descs, owners) = descriptors(raw, !write)?;
        let inner = self.inner.clone();
        let remote = metadata.0.clone();
        let start = KeepAlive {
            fut: Box::pin(async move {
                if write {
                    inner.begin_write(descs, &remote).await.map(boxed)
                } else {
                    inner.begin_read(&remote, descs).await.map(boxed)
                }
            }),
            owners: Some(owners),
        };
        Ok(async move {
            let (op, owners) = start.await;
            op.map(|op| Box::new(Operation::new(op, owners)))
        })
    }
}

// ---------------------------------------------------------------------------
// Functions and the module
// ---------------------------------------------------------------------------

/// Parses "cpu", "cuda" or "cuda:N" into `(kind, id)`, kind 1 for host
/// memory and 2 for CUDA (the reference's `DeviceKind` numbers).
#[pyfunction]
fn parse_device(device: &str) -> PyResult<(u8, u32)> {
    let d: Device = device
        .parse()
        .map_err(|e: ferry::ParseDeviceError| PyValueError::new_err(e.to_string()))?;
    let kind = match d.kind() {
        DeviceKind::Cpu => 1,
        DeviceKind::Cuda => 2,
    };
    Ok((kind, d.id()))
}

/// `(address, length)` of the bytes of a `bytes` object (or of a subclass:
/// the length is the object's own, read in C, whatever its `__len__` says).
/// Immutable, and valid while the object lives.
#[pyfunction]
fn bytes_address(data: &Bound<'_, PyBytes>) -> (usize, usize) {
    let bytes = data.as_bytes();
    (bytes.as_ptr() as usize, bytes.len())
}

/// Ferry's compiled core; use the `ferry` package instead.
#[pymodule]
fn _ferry(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Connector>()?;
    m.add_class::<Operation>()?;
    m.add_class::<Metadata>()?;
    m.add_class::<Bridge>()?;
    m.add_function(wrap_pyfunction!(parse_device, m)?)?;
    m.add_function(wrap_pyfunction!(bytes_address, m)?)?;
    Ok(())
}
