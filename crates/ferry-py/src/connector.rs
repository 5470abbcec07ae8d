//! Connector: one worker's connector, and the operations it starts.

use std::future::Future;
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bridge::{block_on, run_future, ToPython};
use crate::errors::error_to_py;
use crate::grant::{grant_options, seconds_arg, Grant, GrantMetadata};
use crate::memory::{descriptors, KeepAlive, RawItem};
use crate::metadata::Metadata;
use crate::offer::{offer_options, Offer, OfferMetadata};
use crate::ops::{boxed, Operation};
use crate::pool::Pool;

/// One worker's connector.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct Connector {
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

    /// Whether this connector moves CUDA memory: True where the CUDA driver
    /// loads and sees a device (by CUDA IPC between processes of one host,
    /// staged through host memory everywhere else);
    /// where False, an operation over CUDA memory raises
    /// `CudaUnavailableError`.
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

    /// This connector's metrics now, as a dict (see docs/metrics.md).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        metrics_dict(py, &self.inner.metrics())
    }

    /// Exposes memory for one remote worker to read, until
    /// `expires_after` seconds if given.
    #[pyo3(signature = (descriptors, expires_after=None))]
    fn create_readable(
        &self,
        py: Python<'_>,
        descriptors: Vec<RawItem>,
        expires_after: Option<f64>,
    ) -> PyResult<Operation> {
        self.expose(py, descriptors, false, expires_after)
    }

    /// Exposes memory for one remote worker to write, until
    /// `expires_after` seconds if given.
    #[pyo3(signature = (descriptors, expires_after=None))]
    fn create_writable(
        &self,
        py: Python<'_>,
        descriptors: Vec<RawItem>,
        expires_after: Option<f64>,
    ) -> PyResult<Operation> {
        self.expose(py, descriptors, true, expires_after)
    }

    /// Grants a remote worker `rights` (1 READ, 2 WRITE, 3 both) over the
    /// blocks of `pool` (see `grant::grant_options` for the rest).
    #[pyo3(signature = (pool, rights, holder=None, bearer=false, expires_after=None, spin_us=None, revoke_deadline=None))]
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &self,
        py: Python<'_>,
        pool: &Bound<'_, Pool>,
        rights: u8,
        holder: Option<String>,
        bearer: bool,
        expires_after: Option<f64>,
        spin_us: Option<f64>,
        revoke_deadline: Option<f64>,
    ) -> PyResult<Grant> {
        let opts = grant_options(
            rights,
            holder,
            bearer,
            expires_after,
            spin_us,
            revoke_deadline,
        )?;
        let pool = pool.get().rust();
        // Ready at once: making a grant waits for nothing.
        let g = block_on(py, self.inner.grant(pool, opts))?.map_err(|e| error_to_py(py, e))?;
        Ok(Grant::new(g))
    }

    /// Opens a grant made for this worker; an asyncio future of the
    /// `RemoteGrant`.
    fn open_grant<'py>(
        &self,
        py: Python<'py>,
        metadata: &GrantMetadata,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let meta = metadata.0.clone();
        run_future(py, async move { inner.open_grant(&meta).await })
    }

    /// `open_grant`, blocking without the GIL.
    fn open_grant_blocking(&self, py: Python<'_>, metadata: &GrantMetadata) -> PyResult<Py<PyAny>> {
        let inner = self.inner.clone();
        let meta = metadata.0.clone();
        let g = block_on(py, async move { inner.open_grant(&meta).await })?
            .map_err(|e| error_to_py(py, e))?;
        g.to_python(py)
    }

    /// Offers the blocks of `pool` to any worker that claims a grant of
    /// its own (see `offer::offer_options` for the rest).
    #[pyo3(signature = (
        pool, rights, expires_after=None, spin_us=None, revoke_deadline=None, max_holders=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn offer(
        &self,
        py: Python<'_>,
        pool: &Bound<'_, Pool>,
        rights: u8,
        expires_after: Option<f64>,
        spin_us: Option<f64>,
        revoke_deadline: Option<f64>,
        max_holders: Option<u32>,
    ) -> PyResult<Offer> {
        let opts = offer_options(rights, expires_after, spin_us, revoke_deadline, max_holders)?;
        let o = self
            .inner
            .offer(pool.get().rust(), opts)
            .map_err(|e| error_to_py(py, e))?;
        Ok(Offer::new(o))
    }

    /// Claims a grant of the offer `metadata` for this worker and opens
    /// it; an asyncio future of the `RemoteGrant`.
    fn claim<'py>(&self, py: Python<'py>, metadata: &OfferMetadata) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let meta = metadata.0.clone();
        run_future(py, async move { inner.claim(&meta).await })
    }

    /// `claim`, blocking without the GIL.
    fn claim_blocking(&self, py: Python<'_>, metadata: &OfferMetadata) -> PyResult<Py<PyAny>> {
        let inner = self.inner.clone();
        let meta = metadata.0.clone();
        let g = block_on(py, async move { inner.claim(&meta).await })?
            .map_err(|e| error_to_py(py, e))?;
        g.to_python(py)
    }

    /// Starts reading the remote readable `metadata` describes; returns an
    /// asyncio future of the operation.
    fn begin_read<'py>(
        &self,
        py: Python<'py>,
        metadata: &Metadata,
        descriptors: Vec<RawItem>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let work = self.begin(py, metadata, descriptors, false)?;
        run_future(py, work)
    }

    /// Starts writing into the remote writable `metadata` describes; returns
    /// an asyncio future of the operation.
    fn begin_write<'py>(
        &self,
        py: Python<'py>,
        descriptors: Vec<RawItem>,
        metadata: &Metadata,
    ) -> PyResult<Bound<'py, PyAny>> {
        let work = self.begin(py, metadata, descriptors, true)?;
        run_future(py, work)
    }

    /// `begin_read`, blocking (without the GIL) until the operation has started.
    fn begin_read_blocking(
        &self,
        py: Python<'_>,
        metadata: &Metadata,
        descriptors: Vec<RawItem>,
    ) -> PyResult<Operation> {
        let work = self.begin(py, metadata, descriptors, false)?;
        block_on(py, work)?
            .map(|op| *op)
            .map_err(|e| error_to_py(py, e))
    }

    /// `begin_write`, blocking (without the GIL) until the operation has started.
    fn begin_write_blocking(
        &self,
        py: Python<'_>,
        descriptors: Vec<RawItem>,
        metadata: &Metadata,
    ) -> PyResult<Operation> {
        let work = self.begin(py, metadata, descriptors, true)?;
        block_on(py, work)?
            .map(|op| *op)
            .map_err(|e| error_to_py(py, e))
    }
}

impl Connector {
    fn expose(
        &self,
        py: Python<'_>,
        raw: Vec<RawItem>,
        writable: bool,
        expires_after: Option<f64>,
    ) -> PyResult<Operation> {
        let expiry = expires_after
            .map(|s| seconds_arg("expires_after", s))
            .transpose()?;
        let (descs, owners) = descriptors(py, raw, writable)?;
        let inner = &self.inner;
        // Ready at once: exposing memory waits for nothing.
        let op = block_on(py, async {
            if writable {
                inner.create_writable(descs).await.map(|op| match expiry {
                    Some(d) => boxed(op.expires_after(d)),
                    None => boxed(op),
                })
            } else {
                inner.create_readable(descs).await.map(|op| match expiry {
                    Some(d) => boxed(op.expires_after(d)),
                    None => boxed(op),
                })
            }
        })?;
        // On failure the descriptors are gone by now, and `owners` go after them.
        Ok(Operation::new(op.map_err(|e| error_to_py(py, e))?, owners))
    }

    /// The future that starts a read or write, owning everything it needs.
    fn begin(
        &self,
        py: Python<'_>,
        metadata: &Metadata,
        raw: Vec<RawItem>,
        write: bool,
    ) -> PyResult<impl Future<Output = ferry::Result<Box<Operation>>> + Send + 'static> {
        // A read writes into its descriptors; a write only reads them.
        let (descs, owners) = descriptors(py, raw, !write)?;
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

fn transport_name(t: Option<ferry::TransportKind>) -> &'static str {
    t.map_or("none", ferry::TransportKind::name)
}

/// A metrics snapshot as plain Python values.
fn metrics_dict<'py>(
    py: Python<'py>,
    m: &ferry::metrics::MetricsSnapshot,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("worker_id", &m.worker_id)?;
    let mut ops = Vec::with_capacity(m.operations.len());
    for c in &m.operations {
        let o = PyDict::new(py);
        o.set_item("kind", c.kind.name())?;
        o.set_item("transport", transport_name(c.transport))?;
        o.set_item("outcome", c.outcome.name())?;
        o.set_item("count", c.count)?;
        o.set_item("bytes", c.bytes)?;
        ops.push(o);
    }
    d.set_item("operations", ops)?;
    let mut durations = Vec::with_capacity(m.durations.len());
    for h in &m.durations {
        let o = PyDict::new(py);
        o.set_item("side", h.side.name())?;
        o.set_item("transport", transport_name(h.transport))?;
        o.set_item("count", h.count)?;
        o.set_item("sum_us", h.sum_us)?;
        let buckets: Vec<(Option<u64>, u64)> = h
            .buckets
            .iter()
            .map(|&(b, n)| ((b != u64::MAX).then_some(b), n))
            .collect();
        o.set_item("buckets", buckets)?;
        durations.push(o);
    }
    d.set_item("durations", durations)?;
    let errors = PyDict::new(py);
    for e in &m.errors {
        errors.set_item(e.cause, e.count)?;
    }
    d.set_item("errors", errors)?;
    let in_flight = PyDict::new(py);
    for (k, n) in m.in_flight {
        in_flight.set_item(k.name(), n)?;
    }
    d.set_item("in_flight", in_flight)?;
    d.set_item("exposed_bytes", m.exposed_bytes)?;
    d.set_item("tx_bytes", m.tx_bytes())?;
    d.set_item("rx_bytes", m.rx_bytes())?;
    let c = m.connections;
    let conns = PyDict::new(py);
    conns.set_item("inbound_opened", c.inbound_opened)?;
    conns.set_item("inbound_closed", c.inbound_closed)?;
    conns.set_item("outbound_opened", c.outbound_opened)?;
    conns.set_item("outbound_closed", c.outbound_closed)?;
    conns.set_item("open", c.open())?;
    d.set_item("connections", conns)?;
    d.set_item("cuda_ipc_fallbacks", m.cuda_ipc_fallbacks)?;
    Ok(d)
}
