//! The control plane (`ferry.control`): hands metadata over NATS, HTTP or
//! etcd.
//!
//! Every call here blocks without the GIL; `ferry/control.py` runs them in
//! the event loop's executor and offers them as coroutines.

use std::sync::Mutex;
use std::time::Duration;

use ferry_control::Error as E;
use pyo3::exceptions::{PyOSError, PyPermissionError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyModule, PyType};

use crate::bridge::block_on;
use crate::lock;
use crate::metadata::Metadata;

/// The Python exception for a control-plane error: `ValueError` for a bad
/// key, prefix, metadata or configuration, `TimeoutError` for the deadline,
/// `OSError` for a server that cannot listen, `PermissionError` for serving
/// without a secret where other hosts can reach, otherwise a `ControlError`
/// subclass of `ferry._errors` (`ControlError` itself for a refused forged
/// answer, a publisher that requires the secret, or refused credentials).
fn to_py(py: Python<'_>, e: E) -> PyErr {
    let message = e.to_string();
    let class = match e {
        E::InvalidKey { .. }
        | E::InvalidPrefix { .. }
        | E::InvalidEtcdPrefix { .. }
        | E::InvalidMetadata(_)
        | E::TooLarge { .. }
        | E::Config(_) => return PyValueError::new_err(message),
        E::Timeout { .. } => return PyTimeoutError::new_err(message),
        E::Bind { .. } => return PyOSError::new_err(message),
        E::UntrustedNetwork { .. } => return PyPermissionError::new_err(message),
        E::AlreadyPublished { .. } => "AlreadyPublishedError",
        E::NotFound { .. } => "MetadataNotFoundError",
        E::NoServer { .. } => "NoServerError",
        E::ServerGone { .. } => "ServerGoneError",
        E::BadReply { .. } => "BadReplyError",
        E::Refused { .. } => "MetadataRefusedError",
        _ => "ControlError",
    };
    let class = py
        .import("ferry._errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| Ok(c.cast_into::<PyType>()?));
    match class {
        Ok(t) => PyErr::from_type(t, message),
        Err(err) => err,
    }
}

/// A control-plane configuration from keyword arguments; what is `None`
/// comes from the environment.
#[allow(clippy::too_many_arguments)]
fn config(
    secret: Option<&[u8]>,
    token: Option<String>,
    trusted_network: Option<bool>,
    nats_user: Option<String>,
    nats_password: Option<String>,
    nats_token: Option<String>,
    nats_nkey: Option<String>,
    nats_credentials: Option<String>,
) -> ferry_control::Config {
    let mut c = ferry_control::Config::new();
    if let Some(s) = secret {
        c = c.secret(s);
    }
    if let Some(t) = token {
        c = c.bearer_token(t);
    }
    if let Some(t) = trusted_network {
        c = c.trusted_network(t);
    }
    if let Some(u) = nats_user {
        c = c.nats_user_and_password(u, nats_password.unwrap_or_default());
    }
    if let Some(t) = nats_token {
        c = c.nats_token(t);
    }
    if let Some(k) = nats_nkey {
        c = c.nats_nkey(k);
    }
    if let Some(f) = nats_credentials {
        c = c.nats_credentials_file(f);
    }
    c
}

fn seconds(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout)
        .map_err(|_| PyValueError::new_err(format!("timeout must be >= 0 seconds, not {timeout}")))
}

/// Metadata published under a key, until `withdraw()` (or garbage
/// collection).
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct Publication {
    key: String,
    inner: Mutex<Option<ferry_control::Publication>>,
}

impl Publication {
    fn new(p: ferry_control::Publication) -> Publication {
        Publication {
            key: p.key().to_owned(),
            inner: Mutex::new(Some(p)),
        }
    }
}

#[pymethods]
impl Publication {
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// Whether it is still published.
    #[getter]
    fn active(&self) -> bool {
        lock(&self.inner).is_some()
    }

    /// Withdraws the metadata (idempotent).
    fn withdraw(&self) {
        let p = lock(&self.inner).take();
        drop(p);
    }
}

impl Publication {
    /// The publication itself, if still published (for a store's withdraw).
    fn take(&self) -> Option<ferry_control::Publication> {
        lock(&self.inner).take()
    }
}

/// The HTTP server of the exposing side.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct HttpServer {
    inner: ferry_control::HttpServer,
}

#[pymethods]
impl HttpServer {
    /// Listens on `addr` (`"127.0.0.1:0"`: a free port).
    #[staticmethod]
    #[pyo3(signature = (addr, secret=None, token=None, trusted_network=None))]
    fn bind(
        py: Python<'_>,
        addr: &str,
        secret: Option<&[u8]>,
        token: Option<String>,
        trusted_network: Option<bool>,
    ) -> PyResult<HttpServer> {
        let c = config(secret, token, trusted_network, None, None, None, None, None);
        let inner = block_on(py, ferry_control::HttpServer::bind_with(addr, &c))?
            .map_err(|e| to_py(py, e))?;
        Ok(HttpServer { inner })
    }

    /// `host:port` it listens on.
    #[getter]
    fn local_addr(&self) -> String {
        self.inner.local_addr().to_string()
    }

    fn published(&self) -> usize {
        self.inner.published()
    }

    fn publish(&self, py: Python<'_>, key: &str, metadata: &Metadata) -> PyResult<Publication> {
        self.inner
            .publish(key, &metadata.0)
            .map(Publication::new)
            .map_err(|e| to_py(py, e))
    }
}

/// Fetches the metadata under `key` from the HTTP server at `endpoint`,
/// waiting up to `timeout` seconds; blocks without the GIL.
#[pyfunction]
#[pyo3(signature = (endpoint, key, timeout, secret=None, token=None))]
fn http_fetch(
    py: Python<'_>,
    endpoint: &str,
    key: &str,
    timeout: f64,
    secret: Option<&[u8]>,
    token: Option<String>,
) -> PyResult<Metadata> {
    let deadline = seconds(timeout)?;
    let c = config(secret, token, None, None, None, None, None, None);
    let client = ferry_control::HttpClient::with_config(endpoint, &c).map_err(|e| to_py(py, e))?;
    block_on(py, client.fetch(key, deadline))?
        .map(Metadata)
        .map_err(|e| to_py(py, e))
}

/// One worker's NATS connection.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct NatsChannel {
    inner: ferry_control::NatsChannel,
}

#[pymethods]
impl NatsChannel {
    /// Connects to `url`, waiting up to `timeout` seconds for the server.
    #[staticmethod]
    #[pyo3(signature = (
        url, timeout, prefix, secret=None, trusted_network=None, user=None, password=None,
        token=None, nkey=None, credentials=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        url: &str,
        timeout: f64,
        prefix: &str,
        secret: Option<&[u8]>,
        trusted_network: Option<bool>,
        user: Option<String>,
        password: Option<String>,
        token: Option<String>,
        nkey: Option<String>,
        credentials: Option<String>,
    ) -> PyResult<NatsChannel> {
        let deadline = seconds(timeout)?;
        ferry_control::validate_prefix(prefix).map_err(|e| to_py(py, e))?;
        let c = config(
            secret,
            None,
            trusted_network,
            user,
            password,
            token,
            nkey,
            credentials,
        );
        let inner = block_on(
            py,
            ferry_control::NatsChannel::connect_with(url, deadline, &c),
        )?
        .and_then(|c| c.with_prefix(prefix))
        .map_err(|e| to_py(py, e))?;
        Ok(NatsChannel { inner })
    }

    fn publish(&self, py: Python<'_>, key: &str, metadata: &Metadata) -> PyResult<Publication> {
        block_on(py, self.inner.publish(key, &metadata.0))?
            .map(Publication::new)
            .map_err(|e| to_py(py, e))
    }

    fn fetch(&self, py: Python<'_>, key: &str, timeout: f64) -> PyResult<Metadata> {
        let deadline = seconds(timeout)?;
        block_on(py, self.inner.fetch(key, deadline))?
            .map(Metadata)
            .map_err(|e| to_py(py, e))
    }
}

/// One worker's client of an etcd cluster.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct EtcdStore {
    inner: ferry_control::EtcdStore,
}

#[pymethods]
impl EtcdStore {
    /// Connects to `endpoints`, waiting up to `timeout` seconds for etcd.
    #[staticmethod]
    #[pyo3(signature = (
        endpoints, timeout, prefix, secret=None, trusted_network=None, user=None, password=None,
        lease_ttl=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        endpoints: &str,
        timeout: f64,
        prefix: &str,
        secret: Option<&[u8]>,
        trusted_network: Option<bool>,
        user: Option<String>,
        password: Option<String>,
        lease_ttl: Option<f64>,
    ) -> PyResult<EtcdStore> {
        let deadline = seconds(timeout)?;
        let ttl = lease_ttl.map(seconds).transpose()?;
        let mut c = config(secret, None, trusted_network, None, None, None, None, None);
        if let Some(u) = user {
            c = c.etcd_user_and_password(u, password.unwrap_or_default());
        }
        let inner = block_on(
            py,
            ferry_control::EtcdStore::connect_with(endpoints, deadline, &c),
        )?
        .and_then(|s| s.with_prefix(prefix))
        .map(|s| match ttl {
            Some(t) => s.with_lease_ttl(t),
            None => s,
        })
        .map_err(|e| to_py(py, e))?;
        Ok(EtcdStore { inner })
    }

    fn publish(&self, py: Python<'_>, key: &str, metadata: &Metadata) -> PyResult<Publication> {
        block_on(py, self.inner.publish(key, &metadata.0))?
            .map(Publication::new)
            .map_err(|e| to_py(py, e))
    }

    /// Withdraws `publication` and waits until etcd has deleted it.
    fn withdraw(&self, py: Python<'_>, publication: &Publication) -> PyResult<()> {
        let Some(p) = publication.take() else {
            return Ok(());
        };
        block_on(py, self.inner.withdraw(p))?.map_err(|e| to_py(py, e))
    }

    fn fetch(&self, py: Python<'_>, key: &str, timeout: f64) -> PyResult<Metadata> {
        let deadline = seconds(timeout)?;
        block_on(py, self.inner.fetch(key, deadline))?
            .map(Metadata)
            .map_err(|e| to_py(py, e))
    }

    /// The etcd key that metadata for `key` is stored at.
    fn etcd_key(&self, key: &str) -> String {
        self.inner.etcd_key(key)
    }

    /// `publish` of any bytes (sealed the same way with a secret).
    fn publish_bytes(&self, py: Python<'_>, key: &str, value: Vec<u8>) -> PyResult<Publication> {
        block_on(py, self.inner.publish_bytes(key, &value))?
            .map(Publication::new)
            .map_err(|e| to_py(py, e))
    }

    /// `fetch` of what `publish_bytes` stored.
    fn fetch_bytes<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let deadline = seconds(timeout)?;
        let value =
            block_on(py, self.inner.fetch_bytes(key, deadline))?.map_err(|e| to_py(py, e))?;
        Ok(PyBytes::new(py, &value))
    }
}

/// Adds the control plane's classes and functions to `_ferry`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Publication>()?;
    m.add_class::<HttpServer>()?;
    m.add_class::<NatsChannel>()?;
    m.add_class::<EtcdStore>()?;
    m.add_function(wrap_pyfunction!(http_fetch, m)?)?;
    m.add("DEFAULT_PREFIX", ferry_control::DEFAULT_PREFIX)?;
    m.add("DEFAULT_ETCD_PREFIX", ferry_control::DEFAULT_ETCD_PREFIX)?;
    Ok(())
}
