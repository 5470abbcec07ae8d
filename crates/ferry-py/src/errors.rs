//! Errors: the Python exception for each of Ferry's.

use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyType};

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
pub(crate) fn error_to_py(py: Python<'_>, e: ferry::Error) -> PyErr {
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
