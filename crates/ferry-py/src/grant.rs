//! Standing grants: `GrantMetadata` (what the owner hands to the holder),
//! `Grant` (the owner's side) and `RemoteGrant` (the holder's), over
//! [`ferry::Grant`] and [`ferry::RemoteGrant`]; `ferry/_grant.py` wraps
//! them.
//!
//! A one-sided transfer takes its local blocks from the Python pool's
//! block table for as long as it runs, as an operation takes them
//! (`Pool::hold_blocks`), so that it never races an operation of this
//! process on the same bytes. Transfers and waits run with the GIL
//! released.

use std::sync::Arc;
use std::time::Duration;

use ferry::{BlockRef, GrantOptions, Rights};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyTuple};

use crate::bridge::{block_on_detached, run_future_detached, ToPython};
use crate::claims::Claim;
use crate::errors::{error_to_py, named_error};
use crate::pool::{read_ids, Pool};

mod group;
mod prepared;
mod ranges;

pub(crate) use group::PreparedGroup;

pub(crate) use prepared::{Gate, Pending, PreparedRanges};

/// What a grant's owner hands to its holder (a capability: treat its JSON
/// like a password).
#[pyclass(frozen, module = "ferry._ferry")]
#[derive(Clone)]
pub(crate) struct GrantMetadata(pub(crate) ferry::GrantMetadata);

#[pymethods]
impl GrantMetadata {
    /// Parses and validates grant metadata JSON (`str`, `bytes` or
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
                "grant metadata JSON must be str, bytes or bytearray, not {}",
                data.get_type().name()?
            )));
        };
        let text = text.map_err(|_| {
            PyValueError::new_err("malformed grant metadata: the JSON is not UTF-8")
        })?;
        ferry::GrantMetadata::from_json(&text)
            .map(GrantMetadata)
            .map_err(|e| error_to_py(py, e.into()))
    }

    /// The JSON to hand to the holder (at most 1 KiB).
    fn to_json(&self, py: Python<'_>) -> PyResult<String> {
        self.0.to_json().map_err(|e| error_to_py(py, e.into()))
    }

    /// The owner's worker id.
    #[getter]
    fn owner(&self) -> &str {
        &self.0.owner
    }

    /// The worker the grant is bound to; `None` for a bearer grant.
    #[getter]
    fn holder(&self) -> Option<&str> {
        self.0.holder.as_deref()
    }

    /// The grant's number in its owner's process.
    #[getter]
    fn grant_id(&self) -> u64 {
        self.0.grant.0
    }

    /// 1 READ, 2 WRITE, 3 both.
    #[getter]
    fn rights(&self) -> u8 {
        self.0.rights.bits()
    }

    /// When the grant ends by itself (unix milliseconds), if ever.
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

    /// Where the granted memory lives ("cpu").
    #[getter]
    fn device(&self) -> String {
        self.0.device.to_string()
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

/// `rights` as Ferry's (1 READ, 2 WRITE, 3 both).
pub(crate) fn rights_arg(bits: u8) -> PyResult<Rights> {
    match Rights::from_bits(bits) {
        Some(r) if !r.is_empty() => Ok(r),
        _ => Err(PyValueError::new_err(format!(
            "rights must be 1 (READ), 2 (WRITE) or 3 (both), not {bits}"
        ))),
    }
}

/// Seconds as a duration, for argument `what`.
pub(crate) fn seconds_arg(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| PyValueError::new_err(format!("{what} must be a finite number >= 0, not {s}")))
}

/// The options of `Connector.grant`, from its arguments.
pub(crate) fn grant_options(
    rights: u8,
    holder: Option<String>,
    bearer: bool,
    expires_after: Option<f64>,
    spin_us: Option<f64>,
    revoke_deadline: Option<f64>,
) -> PyResult<GrantOptions> {
    let mut opts = GrantOptions::new(rights_arg(rights)?);
    match (holder, bearer) {
        (Some(_), true) => {
            return Err(PyValueError::new_err(
                "a grant is bound to its holder or a bearer grant, not both: \
                 give holder=... or bearer=True",
            ))
        }
        (Some(h), false) => opts = opts.holder(h),
        (None, true) => opts = opts.bearer(),
        // Refused by the core, with its message (GrantError::Unbound).
        (None, false) => {}
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

/// The owner's side of a standing grant over a pool.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct Grant {
    inner: Arc<ferry::Grant>,
}

impl Grant {
    pub(crate) fn new(g: ferry::Grant) -> Self {
        Grant { inner: Arc::new(g) }
    }
}

/// Block references as `(index, generation)` pairs.
struct Refs(Vec<BlockRef>);

impl ToPython for Refs {
    fn to_python(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let pairs: Vec<(u32, u32)> = self.0.iter().map(|r| (r.index, r.generation)).collect();
        Ok(pairs.into_pyobject(py)?.into_any().unbind())
    }
}

/// A notification as `(seq, kind, first_block, block_count, payload,
/// holder)`, kind 1 READ, 2 WRITE or 3 a bare message; `None` when no more
/// can come.
pub(crate) struct Note(pub(crate) Option<ferry::Notification>);

impl ToPython for Note {
    fn to_python(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        note_to_py(py, self.0)
    }
}

pub(crate) fn note_to_py(py: Python<'_>, n: Option<ferry::Notification>) -> PyResult<Py<PyAny>> {
    let Some(n) = n else {
        return Ok(py.None());
    };
    let kind: u8 = match n.kind {
        ferry::NotificationKind::Read => 1,
        ferry::NotificationKind::Write => 2,
        ferry::NotificationKind::Message => 3,
    };
    let t = PyTuple::new(
        py,
        [
            n.seq.into_pyobject(py)?.into_any(),
            kind.into_pyobject(py)?.into_any(),
            n.first_block.into_pyobject(py)?.into_any(),
            n.block_count.into_pyobject(py)?.into_any(),
            PyBytes::new(py, &n.payload).into_any(),
            n.holder.into_pyobject(py)?.into_any(),
        ],
    )?;
    Ok(t.into_any().unbind())
}

fn indices_arg(py: Python<'_>, indices: Vec<i64>, count: u32) -> PyResult<Vec<u32>> {
    indices
        .into_iter()
        .map(|i| u32::try_from(i).map_err(|_| range_error(py, i, count)))
        .collect()
}

/// A block index that no `u32` holds (negative), as the core's
/// `GrantError::OutOfRange` says it.
fn range_error(py: Python<'_>, index: i64, count: u32) -> PyErr {
    named_error(
        py,
        "GrantBlockRangeError",
        format!("block {index} is out of range: the grant has blocks 0 to {count} (exclusive)"),
    )
}

#[pymethods]
impl Grant {
    /// What to hand to the holder.
    fn metadata(&self) -> GrantMetadata {
        GrantMetadata(self.inner.metadata().clone())
    }

    /// Whether the grant was revoked (or expired).
    #[getter]
    fn revoked(&self) -> bool {
        self.inner.is_revoked()
    }

    /// Revokes the grant; an asyncio future that completes once no byte
    /// moves through it any more.
    fn revoke<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let g = self.inner.clone();
        run_future_detached(py, async move { g.revoke().await })
    }

    /// `revoke`, blocking without the GIL.
    fn revoke_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let g = self.inner.clone();
        block_on_detached(py, async move { g.revoke().await })?.map_err(|e| error_to_py(py, e))
    }

    /// Retires blocks `indices`; an asyncio future of their new
    /// `(index, generation)` pairs.
    fn retire<'py>(&self, py: Python<'py>, indices: Vec<i64>) -> PyResult<Bound<'py, PyAny>> {
        let indices = indices_arg(py, indices, self.inner.metadata().block_count)?;
        let g = self.inner.clone();
        run_future_detached(py, async move { g.retire(&indices).await.map(Refs) })
    }

    /// Block `index`'s generation now.
    fn generation(&self, py: Python<'_>, index: i64) -> PyResult<u32> {
        let count = self.inner.metadata().block_count;
        let i = u32::try_from(index).map_err(|_| range_error(py, index, count))?;
        self.inner.generation(i).map_err(|e| error_to_py(py, e))
    }

    /// The next notification (see `Note`); an asyncio future.
    fn next_notification<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let g = self.inner.clone();
        run_future_detached(py, async move {
            Ok::<_, ferry::Error>(Note(g.next_notification().await))
        })
    }

    /// A notification already handed over, or `None`, without waiting.
    fn try_next_notification(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        note_to_py(py, self.inner.try_next_notification())
    }
}

/// The holder's side of a grant.
#[pyclass(frozen, module = "ferry._ferry")]
#[derive(Clone)]
pub(crate) struct RemoteGrant {
    inner: ferry::RemoteGrant,
}

impl ToPython for ferry::RemoteGrant {
    fn to_python(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, RemoteGrant { inner: self })?.into_any())
    }
}

/// What a one-sided transfer needs, made with the GIL: the owner's blocks
/// named, the local pool and blocks, and the claim that holds them.
struct Transfer {
    remote: Vec<BlockRef>,
    pool: ferry::Pool,
    ids: Vec<u32>,
    claim: Claim,
}

impl RemoteGrant {
    /// The owner's blocks `items` name: an int is a block at its current
    /// generation, a pair `(index, generation)` (a `BlockRef`) names one.
    fn remote_refs(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<Vec<BlockRef>> {
        let count = self.inner.metadata().block_count;
        let mut out = Vec::new();
        for item in items.try_iter()? {
            let item = item?;
            if let Ok(i) = item.extract::<i64>() {
                let i = u32::try_from(i).map_err(|_| range_error(py, i, count))?;
                let g = self.inner.generation(i).map_err(|e| error_to_py(py, e))?;
                out.push(BlockRef::new(i, g));
            } else if let Ok((i, g)) = item.extract::<(i64, i64)>() {
                let i = u32::try_from(i).map_err(|_| range_error(py, i, count))?;
                let g = u32::try_from(g).map_err(|_| {
                    PyValueError::new_err(format!(
                        "block {i}: generation {g} is not a 32-bit unsigned int"
                    ))
                })?;
                out.push(BlockRef::new(i, g));
            } else {
                return Err(PyTypeError::new_err(format!(
                    "a remote block is an int (its index) or an (index, generation) pair \
                     (a BlockRef), not {}",
                    item.get_type().name()?
                )));
            }
        }
        Ok(out)
    }

    fn transfer(
        &self,
        py: Python<'_>,
        remote: &Bound<'_, PyAny>,
        pool: &Bound<'_, Pool>,
        local_blocks: &Bound<'_, PyAny>,
        writes_local: bool,
    ) -> PyResult<Transfer> {
        let remote = self.remote_refs(py, remote)?;
        let p = pool.get();
        let ids = read_ids(local_blocks, p.rust().block_count())?;
        let claim = p.hold_blocks(py, &ids, writes_local)?;
        Ok(Transfer {
            remote,
            pool: p.rust().clone(),
            ids,
            claim,
        })
    }
}

#[pymethods]
impl RemoteGrant {
    /// The grant's metadata.
    fn metadata(&self) -> GrantMetadata {
        GrantMetadata(self.inner.metadata().clone())
    }

    /// Whether the owner revoked the grant (or it expired).
    #[getter]
    fn revoked(&self) -> bool {
        self.inner.is_revoked()
    }

    /// Block `index`'s generation now.
    fn generation(&self, py: Python<'_>, index: i64) -> PyResult<u32> {
        let count = self.inner.metadata().block_count;
        let i = u32::try_from(index).map_err(|_| range_error(py, index, count))?;
        self.inner.generation(i).map_err(|e| error_to_py(py, e))
    }

    /// Reads the owner's blocks `remote` into blocks `local_blocks` of
    /// `pool`; an asyncio future.
    fn read_blocks<'py>(
        &self,
        py: Python<'py>,
        remote: &Bound<'py, PyAny>,
        pool: &Bound<'py, Pool>,
        local_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.transfer(py, remote, pool, local_blocks, true)?;
        run_future_detached(py, read(self.inner.clone(), t))
    }

    /// `read_blocks`, blocking without the GIL.
    fn read_blocks_blocking(
        &self,
        py: Python<'_>,
        remote: &Bound<'_, PyAny>,
        pool: &Bound<'_, Pool>,
        local_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let t = self.transfer(py, remote, pool, local_blocks, true)?;
        block_on_detached(py, read(self.inner.clone(), t))?.map_err(|e| error_to_py(py, e))
    }

    /// Writes blocks `local_blocks` of `pool` into the owner's blocks
    /// `remote`, with notification payload `notify`; an asyncio future.
    #[pyo3(signature = (pool, local_blocks, remote, notify=None))]
    fn write_blocks<'py>(
        &self,
        py: Python<'py>,
        pool: &Bound<'py, Pool>,
        local_blocks: &Bound<'py, PyAny>,
        remote: &Bound<'py, PyAny>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.transfer(py, remote, pool, local_blocks, false)?;
        run_future_detached(py, write(self.inner.clone(), t, notify))
    }

    /// `write_blocks`, blocking without the GIL.
    #[pyo3(signature = (pool, local_blocks, remote, notify=None))]
    fn write_blocks_blocking(
        &self,
        py: Python<'_>,
        pool: &Bound<'_, Pool>,
        local_blocks: &Bound<'_, PyAny>,
        remote: &Bound<'_, PyAny>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<()> {
        let t = self.transfer(py, remote, pool, local_blocks, false)?;
        block_on_detached(py, write(self.inner.clone(), t, notify))?.map_err(|e| error_to_py(py, e))
    }

    /// Reads the owner's byte ranges `remote` (`(block, offset, len)`)
    /// into `pool` at `local` (`(block, offset)`), then notifies with
    /// `notify`; an asyncio future.
    #[pyo3(signature = (remote, pool, local, notify=None))]
    fn read_ranges<'py>(
        &self,
        py: Python<'py>,
        remote: &Bound<'py, PyAny>,
        pool: &Bound<'py, Pool>,
        local: Vec<(i64, i64)>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.ranges(py, remote, pool, local, true)?;
        run_future_detached(py, ranges::read(self.inner.clone(), t, notify))
    }

    /// A range transfer checked once, then posted any number of times by
    /// the `PreparedRanges` returned: `write` moves `pool` at `local`
    /// (`(block, offset)`) into the owner's byte ranges `remote`
    /// (`(block, offset, len)`), else the owner's ranges into `pool` at
    /// `local`.
    ///
    /// `PreparedRanges.post` posts nothing once one of `gates` has closed.
    #[pyo3(signature = (write, remote, pool, local, gates=Vec::new()))]
    fn prepare_ranges(
        &self,
        py: Python<'_>,
        write: bool,
        remote: &Bound<'_, PyAny>,
        pool: &Bound<'_, Pool>,
        local: Vec<(i64, i64)>,
        gates: Vec<Py<Gate>>,
    ) -> PyResult<PreparedRanges> {
        self.prepared(py, write, remote, pool, local, gates)
    }

    /// `read_ranges`, blocking without the GIL.
    #[pyo3(signature = (remote, pool, local, notify=None))]
    fn read_ranges_blocking(
        &self,
        py: Python<'_>,
        remote: &Bound<'_, PyAny>,
        pool: &Bound<'_, Pool>,
        local: Vec<(i64, i64)>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<()> {
        let t = self.ranges(py, remote, pool, local, true)?;
        block_on_detached(py, ranges::read(self.inner.clone(), t, notify))?
            .map_err(|e| error_to_py(py, e))
    }

    /// Writes `pool` at `local` into the owner's byte ranges `remote`,
    /// then notifies with `notify`; an asyncio future.
    #[pyo3(signature = (pool, local, remote, notify=None))]
    fn write_ranges<'py>(
        &self,
        py: Python<'py>,
        pool: &Bound<'py, Pool>,
        local: Vec<(i64, i64)>,
        remote: &Bound<'py, PyAny>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.ranges(py, remote, pool, local, false)?;
        run_future_detached(py, ranges::write(self.inner.clone(), t, notify))
    }

    /// `write_ranges`, blocking without the GIL.
    #[pyo3(signature = (pool, local, remote, notify=None))]
    fn write_ranges_blocking(
        &self,
        py: Python<'_>,
        pool: &Bound<'_, Pool>,
        local: Vec<(i64, i64)>,
        remote: &Bound<'_, PyAny>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<()> {
        let t = self.ranges(py, remote, pool, local, false)?;
        block_on_detached(py, ranges::write(self.inner.clone(), t, notify))?
            .map_err(|e| error_to_py(py, e))
    }

    /// Sends the owner a notification that moves no byte; an asyncio
    /// future.
    fn notify<'py>(&self, py: Python<'py>, payload: Vec<u8>) -> PyResult<Bound<'py, PyAny>> {
        run_future_detached(py, ranges::notify(self.inner.clone(), payload))
    }

    /// `notify`, blocking without the GIL.
    fn notify_blocking(&self, py: Python<'_>, payload: Vec<u8>) -> PyResult<()> {
        block_on_detached(py, ranges::notify(self.inner.clone(), payload))?
            .map_err(|e| error_to_py(py, e))
    }
}

impl Transfer {
    /// Whether the core copies it on a blocking thread (see `finish`).
    fn is_large(&self) -> bool {
        (self.pool.block_size() as u64).saturating_mul(self.ids.len() as u64)
            >= ferry::grant::INLINE_MAX as u64
    }
}

async fn read(g: ferry::RemoteGrant, t: Transfer) -> ferry::Result<()> {
    let large = t.is_large();
    finish(large, async move {
        let r = g.read_blocks(&t.remote, &t.pool, &t.ids).await;
        // The local blocks are free again once the copy is over.
        drop(t.claim);
        r
    })
    .await
}

async fn write(g: ferry::RemoteGrant, t: Transfer, notify: Option<Vec<u8>>) -> ferry::Result<()> {
    let large = t.is_large();
    finish(large, async move {
        let r = g
            .write_blocks(&t.pool, &t.ids, &t.remote, notify.as_deref())
            .await;
        drop(t.claim);
        r
    })
    .await
}

/// Runs a transfer. A small one completes in the poll that starts it (the
/// core copies in place), so nothing can drop it half done. A large one is
/// copied on a blocking thread that no cancellation stops: it runs as a
/// task of its own, which keeps the local blocks taken until the copy is
/// over even when the awaiting asyncio future is cancelled.
async fn finish<F>(large: bool, work: F) -> ferry::Result<()>
where
    F: std::future::Future<Output = ferry::Result<()>> + Send + 'static,
{
    if !large {
        return work.await;
    }
    tokio::spawn(work)
        .await
        .map_err(|e| ferry::Error::Config(format!("a grant's copy failed: {e}")))?
}
