//! Transports: the ways bytes move between two connectors.
//!
//! A transport carries the active side of an operation ([`Transport::start`]).
//! The connector picks, per operation, the first enabled transport that
//! [reaches](Transport::reaches) the remote; TCP reaches every remote and is
//! the fallback that always works. Faster transports (same process, cross
//! memory attach, RDMA) plug in behind the same trait.

use std::net::SocketAddr;
use std::sync::Arc;

use ferry_proto::RdmaMetadata;
use tokio::net::TcpListener;

use crate::kind::TransportKind;
pub(crate) use api::{ActiveJob, ActiveLink, Config, Host, Transport};

pub(crate) mod admission;
pub(crate) mod api;
#[cfg(test)]
mod channel;
pub(crate) mod cma;
pub(crate) mod digest;
#[cfg(test)]
mod digest_tests;
pub(crate) mod local;
pub(crate) mod probe;
pub(crate) mod pull;
pub(crate) mod stall;
pub(crate) mod tcp;
pub(crate) mod ucx;

/// The socket a connector accepts its peers' connections on, bound before
/// the transports start (its address goes into the metadata).
pub(crate) struct Listener(TcpListener);

impl Listener {
    pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<Listener> {
        TcpListener::bind(addr).await.map(Listener)
    }

    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
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
        listener: Listener,
        advertised: &[SocketAddr],
    ) -> Transports {
        let tcp = Arc::new(tcp::TcpTransport::new(Arc::new(config)));
        let mut list: Vec<Arc<dyn Transport>> = Vec::new();
        if kinds.contains(&TransportKind::Local) {
            list.push(Arc::new(local::LocalTransport {
                secret: host.secret.clone(),
                digest: host.digest,
            }));
        }
        list.push(tcp.clone());
        local::register(&host.worker_id, advertised, host);
        tcp.serve(host.clone(), listener.0);
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

    /// The TCP transport (grants held over TCP call through it).
    pub(crate) fn tcp(&self) -> &Arc<tcp::TcpTransport> {
        &self.tcp
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
