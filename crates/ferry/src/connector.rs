use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_proto::{DescriptorInfo, OperationKind, OperationStatus, RdmaMetadata, MAX_DESCRIPTORS};
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::builder::{ConnectorBuilder, DEFAULT_TCP_STREAMS};
use crate::config::{self, Origin};
use crate::exposure::Exposures;
use crate::kind::TransportKind;
use crate::metrics::{Listing, Metrics, MetricsSnapshot, OpKind, OpMeter, Side};
use crate::op::{Link, OpCore};
use crate::outcome::OpShared;
use crate::region::Region;
use crate::transport::pull::lanes::Lanes;
use crate::transport::{ActiveJob, Config, Host, Listener, Transports};
use crate::{
    host, Descriptor, Error, ReadOperation, ReadableOperation, Result, WritableOperation,
    WriteOperation,
};

impl ConnectorBuilder {
    /// Binds the listener and starts the connector. Must be called within a
    /// Tokio runtime, which the connector then uses for its tasks.
    pub async fn build(self) -> Result<Connector> {
        config::process().check()?;
        let settings = config::Config::resolve(&self)?;
        let knobs = settings.knobs();
        let worker_id = self
            .worker_id
            .unwrap_or_else(|| host::hex(&host::random_bytes()));
        if worker_id.is_empty() || worker_id.len() > 256 {
            return Err(Error::Config(
                "worker id must be 1 to 256 bytes long".into(),
            ));
        }
        let metrics = Arc::new(Metrics::new(worker_id.clone()));
        let metrics_addr = start_metrics(&metrics, &settings.metrics_addr)?;
        let listener = Listener::bind(self.listen).await?;
        let local_addr = listener.local_addr()?;
        let advertised = match self.advertise {
            Some(a) if !a.is_empty() => a,
            Some(_) => return Err(Error::Config("no address to advertise".into())),
            None => default_advertised(local_addr),
        };
        let hostname = host::hostname();
        let host_id = host::host_id();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let handle = Handle::current();
        let transports = &settings.transports.value;
        let ucx = start_ucx(
            transports,
            settings.transports_named(),
            &handle,
            &shutdown_rx,
            settings.ucx_strict_registration.value,
        )?;
        let secret = settings.secret.value;
        // The lanes this connector offers, built once.
        let lanes = Lanes::new(
            transports.contains(&TransportKind::Cma),
            ucx.as_ref().map(|w| w.strict_registration),
        );
        let config = Config {
            lanes,
            worker_id: worker_id.clone(),
            host_id: host_id.clone(),
            connect_timeout: self.connect_timeout,
            secret: secret.clone(),
            cma: transports.contains(&TransportKind::Cma),
            ucx,
            ucx_trusted: secret.is_some() || settings.ucx_trusted_network.value,
            ucx_emulated_rma: settings.ucx_emulated_rma.value,
            cma_threshold: settings.cma_threshold.value,
            digest: settings.digest.value,
            tcp_streams: settings.tcp_streams.value,
            streams_to_other_hosts: DEFAULT_TCP_STREAMS,
            stripe_threshold: settings.stripe_threshold.value.max(1),
            idle_timeout: settings.idle_timeout.value,
            liveness: settings.liveness.value,
            max_connections: settings.max_connections.value,
            admission: settings.admission.value,
            shutdown: shutdown_rx.clone(),
            handle: handle.clone(),
            metrics: metrics.clone(),
        };
        let host = Arc::new(Host {
            worker_id: worker_id.clone(),
            secret,
            digest: settings.digest.value,
            exposures: Arc::new(Exposures::default()),
            grants: Arc::default(),
            offers: Arc::default(),
            shutdown: shutdown_rx,
            handle,
        });
        let transports = Transports::start(&host, config, transports, listener, &advertised);
        let inner = Arc::new(Inner {
            worker_id,
            hostname,
            host_id,
            local_addr,
            advertised,
            exposures: host.exposures.clone(),
            transports,
            shutdown,
            metrics,
            metrics_addr,
            knobs,
            _host: host,
        });
        tracing::debug!(worker = inner.worker_id, addr = %local_addr, "connector started");
        Ok(Connector { inner })
    }
}

use crate::transport::ucx::start_for as start_ucx;

/// Offers and claims (`Connector::offer`, `Connector::claim`).
#[path = "connector_offer.rs"]
mod offer;

/// Starts (or joins) the scrape endpoint at the configured address (the
/// builder's or `FERRY_METRICS_ADDR`'s); `None` without one. An address
/// that cannot be bound fails when the builder named it, and is only
/// logged when it came from the environment.
fn start_metrics(
    metrics: &Arc<Metrics>,
    addr: &config::Setting<Option<SocketAddr>>,
) -> Result<Option<(SocketAddr, Arc<Listing>)>> {
    let Some(at) = addr.value else {
        return Ok(None);
    };
    match crate::metrics::serve(metrics, at) {
        Ok(served) => Ok(Some(served)),
        Err(e) if addr.origin == Origin::Builder => Err(Error::Config(e.to_string())),
        Err(e) => {
            tracing::warn!("{e}; metrics are not served");
            Ok(None)
        }
    }
}

fn default_advertised(local: SocketAddr) -> Vec<SocketAddr> {
    let port = local.port();
    if !local.ip().is_unspecified() {
        return vec![local];
    }
    let mut out: Vec<SocketAddr> = (host::hostname().as_str(), port)
        .to_socket_addrs()
        .map(|it| {
            it.filter(|a| a.is_ipv4() && !a.ip().is_loopback())
                .collect()
        })
        .unwrap_or_default();
    out.truncate(ferry_proto::MAX_ADDRESSES - 1);
    out.push(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    out
}

struct Inner {
    worker_id: String,
    hostname: String,
    host_id: String,
    local_addr: SocketAddr,
    advertised: Vec<SocketAddr>,
    exposures: Arc<Exposures>,
    transports: Transports,
    shutdown: watch::Sender<bool>,
    metrics: Arc<Metrics>,
    /// Where the metrics are served, and this connector's place there.
    metrics_addr: Option<(SocketAddr, Arc<Listing>)>,
    /// The connector's knobs as resolved (see [`config`]).
    knobs: Vec<config::Knob>,
    /// What the transports see of this connector (they hold it weakly or
    /// through their tasks).
    _host: Arc<Host>,
}

/// One worker's entry point: creates the four operations, owns the listener,
/// the pooled connections to remote workers and the table of exposed memory.
///
/// Dropping the connector shuts it down: pending operations fail with
/// [`Error::Shutdown`] and exposed memory is withdrawn.
pub struct Connector {
    inner: Arc<Inner>,
}

fn check_descriptors(descs: &[Descriptor<'_>], written: Option<&'static str>) -> Result<()> {
    if descs.is_empty() {
        return Err(Error::NoDescriptors);
    }
    let blocks: usize = descs.iter().map(|d| d.block_count()).sum();
    if blocks > MAX_DESCRIPTORS {
        return Err(Error::TooManyDescriptors(blocks));
    }
    for (index, d) in descs.iter().enumerate() {
        if let Some(op) = written {
            if !d.is_writable() {
                return Err(Error::ReadOnlyDescriptor { index, op });
            }
        }
        // Device memory goes further only where CUDA is: the `Region`
        // refuses to dereference it on the host, and only CUDA IPC moves it.
        if !d.device().is_cpu() {
            if let Some(e) = crate::cuda::refusal(index, d.device()) {
                return Err(e);
            }
            // The driver's word on the address (where it is here).
            let at = d.device_ptr().map(|p| (d.device().id(), p));
            if let Some(reason) =
                at.and_then(|(n, p)| crate::cuda::pointer_mismatch(n, p, d.size()))
            {
                return Err(Error::NotDeviceMemory {
                    index,
                    device: d.device(),
                    reason,
                });
            }
        }
    }
    crate::cuda::policy::one_memory(descs)?;
    Ok(())
}

/// What metadata says of one descriptor: one entry, with the block count
/// of a paged one.
fn info(d: &Descriptor<'_>) -> DescriptorInfo {
    let n = d.block_count();
    DescriptorInfo::run(d.device(), (d.size() / n) as u64, n as u32)
}

/// Checks that local descriptors match the remote's block for block (a
/// paged descriptor counts as its blocks), comparing runs of equal sizes.
fn check_pairing(descs: &[Descriptor<'_>], remote: &RdmaMetadata) -> Result<()> {
    let local = descs.iter().map(|d| d.block_count()).sum::<usize>();
    let theirs = remote.descriptor_count();
    if local != theirs {
        return Err(Error::CountMismatch {
            local,
            remote: theirs,
        });
    }
    let mut mine = descs.iter().map(info).peekable();
    let (mut at, mut left) = (0usize, mine.peek().map_or(0, |m| m.count));
    for r in remote.descriptors() {
        let mut need = r.count;
        while need > 0 {
            let Some(m) = mine.peek() else { break };
            if m.size != r.size {
                return Err(Error::SizeMismatch {
                    index: at,
                    local: m.size,
                    remote: r.size,
                });
            }
            let n = need.min(left);
            (at, need, left) = (at + n as usize, need - n, left - n);
            if left == 0 {
                mine.next();
                left = mine.peek().map_or(0, |m| m.count);
            }
        }
    }
    Ok(())
}

/// Closes the region if the future that set it up is dropped half-way.
struct Pending<'a> {
    region: Arc<Region>,
    descs: Vec<Descriptor<'a>>,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.region.close();
        }
    }
}

impl Connector {
    /// A connector with the default configuration (see [`ConnectorBuilder`]).
    pub async fn new() -> Result<Connector> {
        ConnectorBuilder::default().build().await
    }

    /// A builder to configure a connector.
    pub fn builder() -> ConnectorBuilder {
        ConnectorBuilder::default()
    }

    /// This worker's id.
    pub fn worker_id(&self) -> &str {
        &self.inner.worker_id
    }

    /// The reference's name for [`worker_id`](Self::worker_id).
    pub fn name(&self) -> &str {
        &self.inner.worker_id
    }

    /// This host's name.
    pub fn hostname(&self) -> &str {
        &self.inner.hostname
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The addresses written into metadata.
    pub fn advertised_addrs(&self) -> &[SocketAddr] {
        &self.inner.advertised
    }

    /// Whether this connector moves CUDA memory — what callers of the
    /// reference ask before handing over CUDA tensors: true where the CUDA
    /// driver loads and sees a device ([`cuda::available`](crate::cuda::available);
    /// [`cuda::status`](crate::cuda::status) says what was found, or why
    /// not). GPU memory then moves by CUDA IPC between processes of one host
    /// (GPU to GPU, GPU to host) on a connection where cross-memory attach
    /// works, and staged through host memory everywhere else (another host,
    /// no attach, host memory into GPU memory, one process). Where this is
    /// false, an operation over a `cuda:N` descriptor is refused with
    /// [`Error::CudaUnavailable`]; host and GPU memory mixed in one
    /// operation is refused with [`Error::NoDeviceTransport`].
    /// `docs/gpu.md` says what is verified.
    pub fn is_cuda_available(&self) -> bool {
        crate::cuda::available()
    }

    /// How many passive operations currently expose memory. Zero once every
    /// readable and writable has ended.
    pub fn exposed_count(&self) -> usize {
        self.inner.exposures.len()
    }

    /// How many requests are in flight on this connector's connections (as
    /// the active side, and as the passive side). Zero when idle: nothing
    /// accumulates.
    pub fn pending_count(&self) -> usize {
        self.inner.transports.pending()
    }

    /// Closes every connection to and from remote workers, as a network
    /// failure would: operations on them fail with
    /// [`Error::ConnectionLost`], and the next operation reconnects.
    pub fn close_connections(&self) {
        self.inner
            .transports
            .close_all("closed by close_connections()");
    }

    /// How many pooled connections to remote workers are open or being
    /// opened. A connection that ended (the peer exited, the network broke)
    /// leaves the pool, and closes its socket, as soon as it is noticed.
    pub fn connection_count(&self) -> usize {
        self.inner.transports.connection_count()
    }

    /// This connector's metrics now: operations by kind, transport and
    /// outcome, bytes sent and received, durations, errors by cause,
    /// operations in flight, memory exposed, connections (see
    /// [`metrics`](crate::metrics) for an example, and `docs/metrics.md`).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// The configuration this connector runs with: every knob of
    /// [`config`](crate::config) (the connector's and the process's), its
    /// value, and where it came from (default, environment, builder).
    pub fn configuration(&self) -> Vec<config::Knob> {
        let process = config::process().knobs();
        self.inner.knobs.iter().cloned().chain(process).collect()
    }

    /// Where this connector's metrics are served for Prometheus, if they
    /// are ([`ConnectorBuilder::metrics_addr`], `FERRY_METRICS_ADDR`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.inner.metrics_addr.as_ref().map(|(a, _)| *a)
    }

    /// Exposes local memory for one remote worker to read.
    pub async fn create_readable(
        &self,
        descs: Vec<Descriptor<'static>>,
    ) -> Result<ReadableOperation<'static>> {
        let (core, descs, metadata) = self.expose(OperationKind::Read, descs)?;
        Ok(ReadableOperation {
            core,
            descs,
            metadata,
        })
    }

    /// Exposes local memory for one remote worker to write.
    pub async fn create_writable(
        &self,
        descs: Vec<Descriptor<'static>>,
    ) -> Result<WritableOperation<'static>> {
        let (core, descs, metadata) = self.expose(OperationKind::Write, descs)?;
        Ok(WritableOperation {
            core,
            descs,
            metadata,
        })
    }

    /// Starts reading the remote readable that `remote` describes into
    /// `descs`. Counts and sizes must match the remote's.
    pub async fn begin_read(
        &self,
        remote: &RdmaMetadata,
        descs: Vec<Descriptor<'static>>,
    ) -> Result<ReadOperation<'static>> {
        let (core, descs) = self.begin(OperationKind::Read, remote, descs).await?;
        Ok(ReadOperation { core, descs })
    }

    /// Starts writing `descs` into the remote writable that `remote`
    /// describes. Counts and sizes must match the remote's.
    pub async fn begin_write(
        &self,
        descs: Vec<Descriptor<'static>>,
        remote: &RdmaMetadata,
    ) -> Result<WriteOperation<'static>> {
        let (core, descs) = self.begin(OperationKind::Write, remote, descs).await?;
        Ok(WriteOperation { core, descs })
    }

    /// Runs `f` with a [`Scope`] whose operations may use borrowed memory.
    /// Every operation started in the scope is cancelled, and its memory
    /// fenced, before `scope` returns — even if an operation was leaked with
    /// `mem::forget`.
    ///
    /// The scope's end also waits for any copy into borrowed memory that a
    /// same-host peer stalled (its pages never arrive): such a copy cannot be
    /// interrupted and must return before the memory is given back.
    ///
    /// `f` is synchronous; wait for operations inside it with a blocking
    /// executor (e.g. `Handle::block_on` from a thread outside the runtime,
    /// such as one of `tokio::task::spawn_blocking`).
    pub fn scope<'env, F, R>(&self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    {
        let scope = Scope {
            connector: self,
            ops: Mutex::new(Vec::new()),
            _env: PhantomData,
        };
        struct CloseAll<'a>(&'a Mutex<Vec<Arc<OpCore>>>);
        impl Drop for CloseAll<'_> {
            fn drop(&mut self) {
                let ops = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
                for op in ops {
                    if !op.shared.status().is_terminal() {
                        op.cancel();
                    }
                    op.region.close();
                    // A peer may still copy from borrowed source memory by
                    // cross-memory attach until it has seen the cancel
                    // (normally microseconds). Such a peer can read all of
                    // this process anyway (it passed the kernel's ptrace
                    // check), so after the bound we give up rather than hang.
                    if op.region.is_lent() && !op.region.wait_returned(Duration::from_secs(5)) {
                        tracing::warn!(
                            "a peer did not confirm the end of a cross-memory lease within 5 s"
                        );
                    }
                    // A copy *into* borrowed memory that the peer stalled
                    // must return before the borrow ends, however long.
                    op.wait_quiet();
                }
            }
        }
        let _close = CloseAll(&scope.ops);
        f(&scope)
    }

    fn expose<'a>(
        &self,
        kind: OperationKind,
        descs: Vec<Descriptor<'a>>,
    ) -> Result<(Arc<OpCore>, Vec<Descriptor<'a>>, RdmaMetadata)> {
        check_descriptors(
            &descs,
            (kind == OperationKind::Write).then_some("WritableOperation"),
        )
        .inspect_err(|e| self.inner.metrics.error(e))?;
        // SAFETY: the region's memory is `descs`, which the returned operation
        // owns (or borrows for 'a) and keeps untouched; the operation closes
        // the region in `Drop` and before giving the descriptors back, and a
        // `Scope` closes it for borrowed memory even if the operation leaks.
        // Between here and the construction of that operation nothing yields;
        // the one failure (invalid metadata) cancels through `core`, which
        // closes the region before the descriptors are dropped. The exposure
        // table only holds the region, never the memory. Device memory
        // (where `check_descriptors` let it through) is never dereferenced
        // on the host: the region refuses every host access to it.
        let region = Arc::new(unsafe { Region::new(&descs, kind == OperationKind::Write) });
        let sizes: Vec<u64> = region.sizes().collect();
        let (exposure, token) =
            self.inner
                .exposures
                .insert(kind, sizes, region.clone(), |op_id, sizes| {
                    OpShared::metered(OpMeter::new(
                        &self.inner.metrics,
                        OpKind::of(kind, Side::Passive),
                        sizes,
                        op_id,
                        None,
                    ))
                });
        let meta = RdmaMetadata::new(
            kind,
            self.inner.worker_id.clone(),
            self.inner.hostname.clone(),
            self.inner.host_id.clone(),
            self.inner.advertised.clone(),
            exposure.op_id,
            token,
            descs.iter().map(info).collect(),
        )
        .and_then(|m| m.with_process_id(host::process_id().to_string()));
        let core = Arc::new(OpCore {
            shared: exposure.shared.clone(),
            region,
            link: Link::Passive {
                exposures: self.inner.exposures.clone(),
                exposure,
                handle: self.inner._host.handle.clone(),
            },
        });
        match meta {
            Ok(m) => Ok((core, descs, m)),
            Err(e) => {
                core.cancel();
                let e = e.into();
                self.inner.metrics.error(&e);
                Err(e)
            }
        }
    }

    async fn begin<'a>(
        &self,
        kind: OperationKind,
        remote: &RdmaMetadata,
        descs: Vec<Descriptor<'a>>,
    ) -> Result<(Arc<OpCore>, Vec<Descriptor<'a>>)> {
        tracing::debug!(?kind, "operation begins");
        let metrics = &self.inner.metrics;
        let transport = self
            .check_active(kind, remote, &descs)
            .inspect_err(|e| metrics.error(e))?;
        tracing::trace!(transport = %transport.kind(), op = remote.operation_id(), "starting {kind}");
        // SAFETY: as in `expose`. In addition, `Pending` closes the region if
        // this future is dropped before the operation exists, before the
        // descriptors it holds are released. Device memory, as there.
        let region = Arc::new(unsafe { Region::new(&descs, kind == OperationKind::Read) });
        let sizes: Vec<u64> = region.sizes().collect();
        let mut pending = Pending {
            region: region.clone(),
            descs,
            armed: true,
        };
        let shared = OpShared::metered(OpMeter::new(
            metrics,
            OpKind::of(kind, Side::Active),
            &sizes,
            remote.operation_id(),
            Some(remote.worker_id()),
        ));
        let link = transport
            .start(ActiveJob {
                kind,
                remote: remote.clone(),
                region: region.clone(),
                shared: shared.clone(),
                sizes,
            })
            .await
            // Counted once, as the operation's end.
            .inspect_err(|e| {
                shared.end(OperationStatus::Errored, Some(e.clone()));
            })?;
        let descs = std::mem::take(&mut pending.descs);
        pending.armed = false;
        let core = Arc::new(OpCore {
            shared,
            region,
            link: Link::Active(link),
        });
        Ok((core, descs))
    }

    /// Checks an active operation before anything starts; picks its transport.
    fn check_active(
        &self,
        kind: OperationKind,
        remote: &RdmaMetadata,
        descs: &[Descriptor<'_>],
    ) -> Result<&Arc<dyn crate::transport::Transport>> {
        check_descriptors(
            descs,
            (kind == OperationKind::Read).then_some("ReadOperation"),
        )?;
        if remote.kind() != kind {
            return Err(Error::wrong_pairing(kind, remote.kind()));
        }
        check_pairing(descs, remote)?;
        crate::cuda::policy::one_memory(descs)?;
        self.inner
            .transports
            .for_remote(remote)
            .ok_or_else(|| Error::Config("no enabled transport reaches this remote".into()))
    }
}

impl Connector {
    /// Grants a remote worker READ, WRITE or both over the blocks of
    /// `pool`, one-sidedly, until the grant is revoked, dropped or expires
    /// (`docs/grants.md`). Hand its [`metadata`](crate::Grant::metadata)
    /// to the holder, which opens it with [`open_grant`](Self::open_grant).
    pub async fn grant(
        &self,
        pool: &crate::Pool,
        opts: crate::GrantOptions,
    ) -> Result<crate::Grant> {
        let serving = Some((&*self.inner._host.grants, self.inner.advertised.clone()));
        crate::grant::create_grant(
            &self.inner.worker_id,
            &self.inner.host_id,
            pool,
            opts,
            serving,
        )
    }

    /// Opens a grant another worker made for this one: checks that it is
    /// bound to this worker (or a bearer grant), unexpired, live, and that
    /// a lane reaches its owner (same host: its control page opens and
    /// shows the grant's cookie), and claims it (one holder at a time).
    /// Where cross-memory attach does not reach the owner (another host,
    /// permission refused), the grant is opened by TCP, if it offers it.
    pub async fn open_grant(&self, meta: &crate::GrantMetadata) -> Result<crate::RemoteGrant> {
        self.open_grant_via(meta, crate::grant::GrantLane::Any)
            .await
    }

    /// [`open_grant`](Self::open_grant) by the lane `via` only (for
    /// example [`GrantLane::Tcp`](crate::grant::GrantLane::Tcp), to serve
    /// every operation in the owner's runtime).
    pub async fn open_grant_via(
        &self,
        meta: &crate::GrantMetadata,
        via: crate::grant::GrantLane,
    ) -> Result<crate::RemoteGrant> {
        crate::grant::open_grant(
            &self.inner.worker_id,
            &self.inner.host_id,
            meta,
            via,
            Some(self.inner.transports.tcp()),
        )
        .await
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        let _ = self.inner.shutdown.send(true);
        self.inner.exposures.shutdown_all();
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("worker_id", &self.inner.worker_id)
            .field("local_addr", &self.inner.local_addr)
            .finish()
    }
}

/// Operations over borrowed memory; see [`Connector::scope`].
///
/// Memory must outlive the whole `scope` call, so a buffer made inside the
/// closure is refused at compile time:
///
/// ```compile_fail
/// # fn f(c: &ferry::Connector, h: tokio::runtime::Handle) {
/// c.scope(|s| {
///     let inner = vec![0u8; 8];
///     let _ = h.block_on(s.create_readable(vec![ferry::Descriptor::from_slice(&inner)]));
/// });
/// # }
/// ```
///
/// Outside a scope, only memory the descriptor owns is accepted:
///
/// ```compile_fail
/// # async fn f(c: &ferry::Connector) {
/// let buf = vec![0u8; 8];
/// let _ = c.create_readable(vec![ferry::Descriptor::from_slice(&buf)]).await;
/// # }
/// ```
///
/// ```
/// # fn f(c: &ferry::Connector, h: tokio::runtime::Handle) {
/// let outer = vec![0u8; 8];
/// c.scope(|s| {
///     let op = h.block_on(s.create_readable(vec![ferry::Descriptor::from_slice(&outer)])).unwrap();
///     // hand op.metadata() to a remote, wait, ...
///     # drop(op);
/// });
/// # }
/// ```
pub struct Scope<'scope, 'env: 'scope> {
    connector: &'scope Connector,
    ops: Mutex<Vec<Arc<OpCore>>>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope, 'env> Scope<'scope, 'env> {
    fn track(&self, core: &Arc<OpCore>) {
        self.ops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(core.clone());
    }

    /// [`Connector::create_readable`] over borrowed memory.
    pub async fn create_readable(
        &'scope self,
        descs: Vec<Descriptor<'env>>,
    ) -> Result<ReadableOperation<'env>> {
        let (core, descs, metadata) = self.connector.expose(OperationKind::Read, descs)?;
        self.track(&core);
        Ok(ReadableOperation {
            core,
            descs,
            metadata,
        })
    }

    /// [`Connector::create_writable`] over borrowed memory.
    pub async fn create_writable(
        &'scope self,
        descs: Vec<Descriptor<'env>>,
    ) -> Result<WritableOperation<'env>> {
        let (core, descs, metadata) = self.connector.expose(OperationKind::Write, descs)?;
        self.track(&core);
        Ok(WritableOperation {
            core,
            descs,
            metadata,
        })
    }

    /// [`Connector::begin_read`] into borrowed memory.
    pub async fn begin_read(
        &'scope self,
        remote: &RdmaMetadata,
        descs: Vec<Descriptor<'env>>,
    ) -> Result<ReadOperation<'env>> {
        let (core, descs) = self
            .connector
            .begin(OperationKind::Read, remote, descs)
            .await?;
        self.track(&core);
        Ok(ReadOperation { core, descs })
    }

    /// [`Connector::begin_write`] from borrowed memory.
    pub async fn begin_write(
        &'scope self,
        descs: Vec<Descriptor<'env>>,
        remote: &RdmaMetadata,
    ) -> Result<WriteOperation<'env>> {
        let (core, descs) = self
            .connector
            .begin(OperationKind::Write, remote, descs)
            .await?;
        self.track(&core);
        Ok(WriteOperation { core, descs })
    }
}
