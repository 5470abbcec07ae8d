//! What a transport implements ([`Transport`], [`ActiveLink`]) and what it
//! may use of its connector ([`Host`], [`Config`]). Every transport imports
//! these from here; nothing here imports a transport.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::{OperationKind, RdmaMetadata};
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::auth::Secret;
use crate::exposure::Exposures;
use crate::kind::TransportKind;
use crate::metrics::Metrics;
use crate::outcome::OpShared;
use crate::region::Region;
use crate::transport::pull::lanes::Lanes;
use crate::transport::ucx::Worker;
use crate::Result;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One active operation handed to a transport.
pub(crate) struct ActiveJob {
    pub(crate) kind: OperationKind,
    pub(crate) remote: RdmaMetadata,
    pub(crate) region: Arc<Region>,
    pub(crate) shared: Arc<OpShared>,
    pub(crate) sizes: Vec<u64>,
}

/// A started active operation, as its handle sees it.
pub(crate) trait ActiveLink: Send + Sync {
    /// The handle cancelled or dropped the operation (its region is closed).
    /// `changed`: whether the cancel ended it (else it had ended already).
    fn cancel(&self, changed: bool);
}

pub(crate) trait Transport: Send + Sync {
    fn kind(&self) -> TransportKind;
    /// Whether this transport can carry an operation to this remote.
    fn reaches(&self, remote: &RdmaMetadata) -> bool;
    /// Starts moving the bytes; the end is reported through `job.shared`.
    fn start(&self, job: ActiveJob) -> BoxFuture<'_, Result<Arc<dyn ActiveLink>>>;
}

/// How the transports of one connector are configured (from the builder
/// and the environment).
pub(crate) struct Config {
    /// The lanes this connector offers (built once, from the settings
    /// below).
    pub(crate) lanes: Lanes,
    pub(crate) worker_id: String,
    pub(crate) host_id: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) secret: Option<Secret>,
    pub(crate) cma: bool,
    /// This connector's UCX worker: UCX is set up on every connection
    /// where both sides have one (it was named, or UCX has an RDMA or CUDA
    /// transport here: see `ucx::start_for`).
    pub(crate) ucx: Option<Arc<Worker>>,
    /// UCX may be set up on this connector's connections: they
    /// authenticate with a secret, or the network is trusted (UCX does not
    /// defend against crafted addresses and keys).
    pub(crate) ucx_trusted: bool,
    /// UCX may carry operations over endpoints without an RMA lane.
    pub(crate) ucx_emulated_rma: bool,
    pub(crate) cma_threshold: u64,
    /// The end-to-end integrity check is on (`ConnectorBuilder::digest`).
    pub(crate) digest: bool,
    /// Streams per large transfer; `None`: by host (see `ConnectorBuilder::tcp_streams`).
    pub(crate) tcp_streams: Option<usize>,
    /// Streams per large transfer to another host when `tcp_streams` is
    /// `None`.
    pub(crate) streams_to_other_hosts: usize,
    pub(crate) stripe_threshold: u64,
    /// Connections with no operation in progress for this long are closed.
    pub(crate) idle_timeout: Duration,
    /// The liveness bound (`session::liveness`); zero: off.
    pub(crate) liveness: Duration,
    /// Accepted connections kept at most (see `admission.rs`).
    pub(crate) max_connections: usize,
    /// How the listener groups addresses for its bounds (see `admission.rs`).
    pub(crate) admission: crate::transport::admission::Grouping,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) handle: Handle,
    /// The connector's metrics (connections opened and closed).
    pub(crate) metrics: Arc<Metrics>,
}

/// What a transport may ask of the connector it serves: who it is, the
/// secret, the table of exposed memory, the runtime, and whether it shut
/// down. Nothing else of the connector is reachable from a transport.
pub(crate) struct Host {
    pub(crate) worker_id: String,
    pub(crate) secret: Option<Secret>,
    /// The end-to-end integrity check is on (`ConnectorBuilder::digest`).
    pub(crate) digest: bool,
    pub(crate) exposures: Arc<Exposures>,
    /// This connector's grants, for holders over TCP.
    pub(crate) grants: Arc<crate::grant::GrantTable>,
    /// This connector's offers, for claims over TCP.
    pub(crate) offers: Arc<crate::grant::OfferTable>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) handle: Handle,
}

impl Host {
    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}
