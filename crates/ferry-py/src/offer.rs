//! Offers: `OfferMetadata` (what the owner publishes), `Offer` (the
//! owner's side, over [`ferry::Offer`]) and the connector's `offer` and
//! `claim`; `ferry/_offer.py` wraps them.

use std::sync::Arc;

use ferry::OfferOptions;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::bridge::{block_on_detached, run_future_detached};
use crate::errors::error_to_py;
use crate::grant::{note_to_py, rights_arg, seconds_arg, Note};

/// What an offer's owner publishes (a capability for every reader).
#[pyclass(frozen, module = "ferry._ferry")]
#[derive(Clone)]
pub(crate) struct OfferMetadata(pub(crate) ferry::OfferMetadata);

#[pymethods]
impl OfferMetadata {
    /// Parses and validates offer metadata JSON (`str`, `bytes` or
    /// `bytearray`).
    #[staticmethod]
    fn from_json(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let text = if let Ok(b) = data.cast::<PyBytes>() {
            String::from_utf8(b.as_bytes().to_vec())
        } else if let Ok(b) = data.cast::<PyByteArray>() {
            String::from_utf8(b.to_vec())
        } else if let Ok(s) = data.extract::<String>() {
            Ok(s)
        } else {
            return Err(PyTypeError::new_err(format!(
                "offer metadata JSON must be str, bytes or bytearray, not {}",
                data.get_type().name()?
            )));
        };
        let text = text.map_err(|_| {
            PyValueError::new_err("malformed offer metadata: the JSON is not UTF-8")
        })?;
        ferry::OfferMetadata::from_json(&text)
            .map(OfferMetadata)
            .map_err(|e| error_to_py(py, e.into()))
    }

    /// The JSON to publish (at most 1 KiB).
    fn to_json(&self, py: Python<'_>) -> PyResult<String> {
        self.0.to_json().map_err(|e| error_to_py(py, e.into()))
    }

    /// The owner's worker id.
    #[getter]
    fn owner(&self) -> &str {
        &self.0.owner
    }

    /// The offer's number in its owner's process.
    #[getter]
    fn offer_id(&self) -> u64 {
        self.0.offer.0
    }

    /// 1 READ, 2 WRITE, 3 both.
    #[getter]
    fn rights(&self) -> u8 {
        self.0.rights.bits()
    }

    /// When the offer ends by itself (unix milliseconds), if ever.
    #[getter]
    fn expires_at_ms(&self) -> Option<u64> {
        self.0.expires_at_ms
    }

    /// Bytes per block.
    #[getter]
    fn block_size(&self) -> u64 {
        self.0.block_size
    }

    /// How many blocks.
    #[getter]
    fn block_count(&self) -> u32 {
        self.0.block_count
    }

    /// Where the offered memory lives ("cpu").
    #[getter]
    fn device(&self) -> String {
        self.0.device.to_string()
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

/// The options of `Connector.offer`, from its arguments.
pub(crate) fn offer_options(
    rights: u8,
    expires_after: Option<f64>,
    spin_us: Option<f64>,
    revoke_deadline: Option<f64>,
    max_holders: Option<u32>,
) -> PyResult<OfferOptions> {
    let mut opts = OfferOptions::new(rights_arg(rights)?);
    if let Some(n) = max_holders {
        if n == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "max_holders must be at least 1",
            ));
        }
        opts = opts.max_holders(n);
    }
    if let Some(s) = expires_after {
        opts = opts.expires_after(seconds_arg("expires_after", s)?);
    }
    if let Some(us) = spin_us {
        opts = opts.spin(seconds_arg("spin_us", us)? / 1_000_000);
    }
    if let Some(s) = revoke_deadline {
        opts = opts.revoke_deadline(seconds_arg("revoke_deadline", s)?);
    }
    Ok(opts)
}

/// The owner's side of an offer over a pool.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct Offer {
    inner: Arc<ferry::Offer>,
}

impl Offer {
    pub(crate) fn new(o: ferry::Offer) -> Self {
        Offer { inner: Arc::new(o) }
    }
}

#[pymethods]
impl Offer {
    /// What to publish.
    fn metadata(&self) -> OfferMetadata {
        OfferMetadata(self.inner.metadata().clone())
    }

    /// Whether the offer was revoked.
    #[getter]
    fn revoked(&self) -> bool {
        self.inner.is_revoked()
    }

    /// The workers that hold a grant of the offer now, sorted.
    fn holders(&self) -> Vec<String> {
        self.inner.holders()
    }

    /// Revokes the offer and every grant made from it; an asyncio future.
    fn revoke<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let o = self.inner.clone();
        run_future_detached(py, async move { o.revoke().await })
    }

    /// `revoke`, blocking without the GIL.
    fn revoke_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let o = self.inner.clone();
        block_on_detached(py, async move { o.revoke().await })?.map_err(|e| error_to_py(py, e))
    }

    /// Revokes worker `holder`'s grant and refuses its later claims; an
    /// asyncio future.
    fn revoke_holder<'py>(&self, py: Python<'py>, holder: String) -> PyResult<Bound<'py, PyAny>> {
        let o = self.inner.clone();
        run_future_detached(py, async move { o.revoke_holder(&holder).await })
    }

    /// `revoke_holder`, blocking without the GIL.
    fn revoke_holder_blocking(&self, py: Python<'_>, holder: String) -> PyResult<()> {
        let o = self.inner.clone();
        block_on_detached(py, async move { o.revoke_holder(&holder).await })?
            .map_err(|e| error_to_py(py, e))
    }

    /// Retires blocks `indices` in every grant of the offer; an asyncio
    /// future.
    fn retire<'py>(&self, py: Python<'py>, indices: Vec<u32>) -> PyResult<Bound<'py, PyAny>> {
        let o = self.inner.clone();
        run_future_detached(py, async move { o.retire(&indices).await })
    }

    /// The next notification of any holder (see `grant::Note`, with its
    /// holder); an asyncio future.
    fn next_notification<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let o = self.inner.clone();
        run_future_detached(py, async move {
            Ok::<_, ferry::Error>(Note(o.next_notification().await))
        })
    }

    /// A notification already queued, or `None`, without waiting.
    fn poll_notification(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        note_to_py(py, self.inner.poll_notification())
    }
}
