//! Transports: the ways bytes move between two connectors.
//!
//! A transport carries the active side of an operation ([`Transport::start`]).
//! The connector picks, per operation, the first enabled transport that
//! [reaches](Transport::reaches) the remote; TCP reaches every remote and is
//! the fallback that always works. Faster transports (same process, cross
//! memory attach, RDMA) plug in behind the same trait.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::{OperationKind, RdmaMetadata};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::auth::Secret;
use crate::exposure::Exposures;
pub(crate) use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::Region;
use crate::Result;

pub(crate) mod admission;
pub(crate) mod cma;
pub(crate) mod local;
pub(crate) mod probe;
pub(crate) mod pull;
pub(crate) mod stall;
pub(crate) mod tcp;

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
    pub(crate) worker_id: String,
    pub(crate) host_id: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) secret: Option<Secret>,
    pub(crate) cma: bool,
    pub(crate) cma_threshold: u64,
    /// Streams per large transfer; `None`: by host (see `ConnectorBuilder::tcp_streams`).
    pub(crate) tcp_streams: Option<usize>,
    /// Streams per large transfer to another host when `tcp_streams` is
    /// `None`.
    pub(crate) streams_to_other_hosts: usize,
    pub(crate) stripe_threshold: u64,
    /// Connections with no operation in progress for this long are closed.
    pub(crate) idle_timeout: Duration,
    /// Accepted connections kept at most (see `admission.rs`).
    pub(crate) max_connections: usize,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) handle: Handle,
}

/// What a transport may ask of the connector it serves: who it is, the
/// secret, the table of exposed memory, the runtime, and whether it shut
/// down. Nothing else of the connector is reachable from a transport.
pub(crate) struct Host {
    pub(crate) worker_id: String,
    pub(crate) secret: Option<Secret>,
    pub(crate) exposures: Arc<Exposures>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) handle: Handle,
}

impl Host {
    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// The transports of one connector, best first, and what the connector
/// asks of them as a whole.
pub(crate) struct Transports {
    list: Vec<Arc<dyn Transport>>,
    tcp: Arc<tcp::TcpTransport>,
}

impl Transports {
    /// Starts the enabled transports (`kinds`; TCP always) for `host`:
    /// the listener accepts on `listener`, and connectors of this process
    /// find this one at `advertised`.
    pub(crate) fn start(
        host: &Arc<Host>,
        config: Config,
        kinds: &[TransportKind],
        listener: TcpListener,
        advertised: &[SocketAddr],
    ) -> Transports {
        let tcp = Arc::new(tcp::TcpTransport::new(Arc::new(config)));
        let mut list: Vec<Arc<dyn Transport>> = Vec::new();
        if kinds.contains(&TransportKind::Local) {
            list.push(Arc::new(local::LocalTransport {
                secret: host.secret.clone(),
            }));
        }
        list.push(tcp.clone());
        local::register(&host.worker_id, advertised, host);
        host.handle
            .spawn(tcp::listen(host.clone(), tcp.clone(), listener));
        Transports { list, tcp }
    }

    /// The first enabled transport that reaches `remote`.
    pub(crate) fn for_remote(&self, remote: &RdmaMetadata) -> Option<&Arc<dyn Transport>> {
        self.list.iter().find(|t| t.reaches(remote))
    }

    /// Requests in flight on this connector's connections, in both roles.
    pub(crate) fn pending(&self) -> usize {
        self.tcp.pending()
    }

    /// Closes every connection to and from remote workers.
    pub(crate) fn close_all(&self, cause: &str) {
        self.tcp.close_all(cause);
    }

    /// Pooled connections to remote workers, open or being opened.
    pub(crate) fn connection_count(&self) -> usize {
        self.tcp.connection_count()
    }
}
