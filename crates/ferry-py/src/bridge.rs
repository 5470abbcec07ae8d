//! The runtime, and the way results get back to asyncio.

use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::errors::error_to_py;
use crate::lock;

/// What the extension keeps per process.
pub(crate) struct Core {
    rt: tokio::runtime::Runtime,
    /// The process that started `rt`: a child forked afterwards has none of
    /// its threads.
    pid: u32,
}

impl Core {
    /// The runtime (to block on, off the GIL).
    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }
}

static CORE: OnceLock<Core> = OnceLock::new();

/// The runtime, started on first use.
pub(crate) fn core() -> PyResult<&'static Core> {
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

/// A value that a Rust future completes its asyncio future with: `None`
/// for a wait, an operation for a `begin_read`/`begin_write`.
pub(crate) trait ToPython: Send + 'static {
    /// The Python object, made on the loop's thread, with the GIL.
    fn to_python(self, py: Python<'_>) -> PyResult<Py<PyAny>>;
}

impl ToPython for () {
    fn to_python(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(py.None())
    }
}

/// A finished future's result, made Python objects only on the loop's
/// thread (see [`Mailbox`]).
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// The value of `result`, or the exception that Ferry's error maps to.
fn result_to_py<T: ToPython>(py: Python<'_>, result: ferry::Result<T>) -> PyResult<Py<PyAny>> {
    result
        .map_err(|e| error_to_py(py, e))
        .and_then(|v| v.to_python(py))
}

/// Completes `future` with what `outcome` makes, unless it is already done
/// (cancelled): then `outcome` is dropped unmade, and an operation that
/// nobody receives is dropped, which cancels it.
fn resolve(
    future: &Bound<'_, PyAny>,
    outcome: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
) -> PyResult<()> {
    let py = future.py();
    if future.call_method0(intern!(py, "done"))?.is_truthy()? {
        return Ok(());
    }
    match outcome(py) {
        Ok(value) => future.call_method1(intern!(py, "set_result"), (value,))?,
        Err(e) => {
            future.call_method1(intern!(py, "set_exception"), (e.into_value(py).into_any(),))?
        }
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
pub(crate) struct Bridge(Arc<Mailbox>);

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
pub(crate) fn run_future<'py, F, T>(py: Python<'py>, work: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = ferry::Result<T>> + Send + 'static,
    T: ToPython,
{
    run_future_with(py, work, false)
}

/// [`run_future`], whose first poll runs without the GIL: for work that
/// may do something before it first waits (a grant's copy in place, a
/// notification ring with no room), which other Python threads need not
/// wait for.
pub(crate) fn run_future_detached<'py, F, T>(
    py: Python<'py>,
    work: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = ferry::Result<T>> + Send + 'static,
    T: ToPython,
{
    run_future_with(py, work, true)
}

fn run_future_with<'py, F, T>(py: Python<'py>, work: F, detach: bool) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = ferry::Result<T>> + Send + 'static,
    T: ToPython,
{
    let core = core()?;
    let event_loop = GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()?;
    let future = event_loop.call_method0(intern!(py, "create_future"))?;
    let mut work = Box::pin(work);
    let first = if detach {
        py.detach(|| poll_once(core, work.as_mut()))
    } else {
        poll_once(core, work.as_mut())
    };
    match first {
        Poll::Ready(result) => resolve(&future, |py| result_to_py(py, result))?,
        Poll::Pending => {
            let bridge = BRIDGE_FOR
                .import(py, "ferry._bridge", "_bridge_for")?
                .call1((&event_loop,))?;
            let mailbox = bridge.cast::<Bridge>()?.get().0.clone();
            let f = future.clone().unbind();
            let task = core.rt.spawn(async move {
                let result = work.await;
                mailbox.post(f, Box::new(move |py| result_to_py(py, result)));
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
pub(crate) fn block_on<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
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

/// Runs `fut` to completion on the calling thread without the GIL, also
/// its first poll (see [`run_future_detached`]).
pub(crate) fn block_on_detached<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let core = core()?;
    Ok(py.detach(|| core.rt.block_on(fut)))
}

/// Runs `fut` on Ferry's runtime, detached: its end is its own business
/// (it reports through what it captured).
pub(crate) fn spawn<F>(fut: F) -> PyResult<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    drop(core()?.rt.spawn(fut));
    Ok(())
}
