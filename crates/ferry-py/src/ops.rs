//! Operations: any of the four, with the Python objects that own its memory.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ferry::{OperationKind, OperationStatus};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::bridge::{block_on, run_future, ToPython};
use crate::claims::Claimant;
use crate::errors::error_to_py;
use crate::lock;
use crate::memory::Owners;
use crate::metadata::Metadata;

/// `op` as any of the four operations.
pub(crate) fn boxed<O: ferry::Operation<'static> + 'static>(
    op: O,
) -> Box<dyn ferry::Operation<'static>> {
    Box::new(op)
}

/// How long `close` waits for an operation whose cancel came too late.
const SEALED_WAIT: Duration = Duration::from_secs(2);

/// An operation and the Python objects that own the memory it moves.
pub(crate) struct Holder {
    // Field order is drop order: the operation first (its drop closes the
    // region: no transport touches the memory afterwards), then the owners.
    pub(crate) op: Box<dyn ferry::Operation<'static>>,
    owners: Owners,
}

impl Holder {
    async fn wait(&self, timeout: Option<Duration>) -> ferry::Result<()> {
        match timeout {
            None => self.op.wait_for_completion().await,
            Some(t) => self.op.wait_for_completion_timeout(t).await,
        }
    }

    /// The status and outcome of an operation that was just cancelled:
    /// its own once it has ended. A cancel that came too late (the outcome
    /// was decided, and its confirmation is on its way) leaves it running
    /// for as long as that takes: this waits for it at most
    /// [`SEALED_WAIT`], then calls it cancelled (this side gave up on it).
    fn ended(&self, rt: Option<&tokio::runtime::Runtime>) -> (OperationStatus, ferry::Result<()>) {
        if let (false, Some(rt)) = (self.op.status().is_terminal(), rt) {
            let _ = rt.block_on(self.wait(Some(SEALED_WAIT)));
        }
        let status = self.op.status();
        if !status.is_terminal() {
            return (OperationStatus::Cancelled, Err(ferry::Error::Cancelled));
        }
        // Waiting on an ended operation is ready at once.
        match pin!(self.wait(None)).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(r) => (status, r),
            Poll::Pending => (status, Err(ferry::Error::Cancelled)),
        }
    }
}

impl Claimant for Holder {
    fn is_released(&self) -> bool {
        self.op.is_released()
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
pub(crate) struct Operation {
    kind: &'static str,
    metadata: Option<ferry::RdmaMetadata>,
    state: Mutex<State>,
}

impl Operation {
    pub(crate) fn new(op: Box<dyn ferry::Operation<'static>>, owners: Owners) -> Self {
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

/// A started operation completes the asyncio future of its `begin_*`.
impl ToPython for Box<Operation> {
    fn to_python(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, *self)?.into_any())
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
    /// this returns, Ferry starts no further access to the memory (see
    /// `ReadOperation::cancel` for a copy still in flight, and for a READ
    /// the remote decides).
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
        // (No runtime in a child forked after it started: nothing to wait
        // with, and nothing of the operation runs there.)
        let rt = crate::bridge::core().ok().map(|c| c.runtime());
        let (status, outcome) = py.detach(|| {
            h.op.cancel();
            h.ended(rt)
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
            match holder {
                Ok(h) => h.wait(timeout).await,
                Err(outcome) => outcome,
            }
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
