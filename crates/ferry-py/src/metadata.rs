//! Metadata: what a readable or writable hands to its remote.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

/// What a readable or writable hands to its remote (a capability: treat its
/// JSON like a password).
#[pyclass(frozen, module = "ferry._ferry")]
#[derive(Clone)]
pub(crate) struct Metadata(pub(crate) ferry::RdmaMetadata);

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

    /// `(device, size, count)` runs of the exposed descriptors: what the
    /// metadata lists, with no entry per block (so what this costs follows
    /// the bytes of the metadata; the package describes each block from
    /// these, when asked for it).
    #[getter]
    fn descriptor_runs(&self) -> Vec<(String, u64, u32)> {
        self.0
            .descriptors()
            .iter()
            .map(|d| (d.device.to_string(), d.size, d.count))
            .collect()
    }

    /// How many descriptors (blocks) are exposed.
    #[getter]
    fn descriptor_count(&self) -> usize {
        self.0.descriptor_count()
    }

    /// The sum of the descriptors' sizes.
    #[getter]
    fn total_size(&self) -> u64 {
        self.0.total_size()
    }
}
