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
/// misuse and bad metadata (a `DeviceMemoryError` subclass for memory
/// outside the host), `TimeoutError` for deadlines, a `FerryError` subclass
/// for everything that made a transfer fail: a `GrantError` subclass for a
/// refused grant or one-sided transfer, an `ExpiredError` for an expired
/// passive operation on both sides.
pub(crate) fn error_to_py(py: Python<'_>, e: ferry::Error) -> PyErr {
    use ferry::Error as E;
    let message = e.to_string();
    let class = match e {
        E::Timeout(_) => return PyTimeoutError::new_err(message),
        E::InvalidMetadata(_) => return PyValueError::new_err(message),
        E::CudaUnavailable { .. } => "CudaUnavailableError",
        E::NoDeviceTransport { .. } => "NoDeviceTransportError",
        E::NotDeviceMemory { .. } => "NotDeviceMemoryError",
        E::UnsupportedDevice { .. } => "DeviceMemoryError",
        E::Grant(ref g) => match grant_error_class(g) {
            Some(class) => class,
            None => return PyValueError::new_err(message),
        },
        E::Pool(p) => return pool_error_to_py(py, p),
        E::Expired { .. } => "ExpiredError",
        E::Rejected {
            reason: ferry::AbortReason::Expired,
            ..
        } => "RemoteExpiredError",
        ref e if e.is_misuse() => return PyValueError::new_err(message),
        E::WrongWorker { .. } => "StaleMetadataError",
        E::Unreachable { .. } => "UnreachableError",
        E::Rejected { .. } => "RejectedError",
        E::RemoteCancelled => "RemoteCancelledError",
        E::ConnectionLost { .. } => "ConnectionLostError",
        E::PeerUnresponsive { .. } => "PeerUnresponsiveError",
        E::DigestMismatch { .. } => "DigestMismatchError",
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

/// An instance of the exception class `name` of `ferry._errors`.
pub(crate) fn named_error(py: Python<'_>, name: &str, message: String) -> PyErr {
    match error_class(py, name) {
        Ok(t) => PyErr::from_type(t, message),
        Err(err) => err,
    }
}

/// The Python exception for a refused pool or block list: a `PoolError`
/// (a `ValueError`), whose subclass says what was wrong.
pub(crate) fn pool_error_to_py(py: Python<'_>, e: ferry::PoolError) -> PyErr {
    use ferry::PoolError as E;
    let class = match e {
        E::OutOfRange { .. } => "BlockRangeError",
        E::BadSlice { .. } => "BlockSliceError",
        E::Busy { id } => {
            // Python's operations hold blocks while in progress, not for as
            // long as a descriptor lives.
            let message = format!(
                "block {id} is used by an operation in progress in a way that conflicts \
                 (or named twice by an operation that writes into it): the two would race \
                 on its bytes; wait for the other operation to end, or cancel it"
            );
            return named_error(py, "BlockBusyError", message);
        }
        _ => "PoolError",
    };
    named_error(py, class, e.to_string())
}

/// The exception class (of `ferry._errors`) for a grant's error `e`, or
/// `None` for misuse (a `ValueError`).
fn grant_error_class(e: &ferry::GrantError) -> Option<&'static str> {
    use ferry::GrantError as G;
    Some(match e {
        G::Malformed(_)
        | G::TooLarge { .. }
        | G::Unbound
        | G::LengthMismatch { .. }
        | G::NotificationTooLarge { .. } => return None,
        G::Revoked => "GrantRevokedError",
        G::Expired { .. } => "GrantExpiredError",
        G::NotYours { .. } => "GrantNotYoursError",
        G::Claimed { .. } => "GrantClaimedError",
        G::OutOfRange { .. } => "GrantBlockRangeError",
        G::StaleGeneration { .. } => "StaleGenerationError",
        G::RightsMissing { .. } => "GrantRightsError",
        G::NoLane(_) => "NoGrantLaneError",
        G::Forged { .. } => "GrantForgedError",
        G::NotificationsFull { .. } => "NotificationsFullError",
        G::OwnerGone(_) | G::HolderGone => "GrantPeerGoneError",
        G::Stalled { .. } => "GrantStalledError",
        G::TooManyHolders { .. } => "OfferFullError",
        _ => "GrantError",
    })
}
