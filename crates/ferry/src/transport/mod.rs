//! Transports: the ways bytes move between two connectors.
//!
//! A transport carries the active side of an operation ([`Transport::start`]).
//! The connector picks, per operation, the first enabled transport that
//! [reaches](Transport::reaches) the remote; TCP reaches every remote and is
//! the fallback that always works. Faster transports (same process, cross
//! memory attach, RDMA) plug in behind the same trait.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

use ferry_proto::{OperationKind, RdmaMetadata};

use crate::op::OpShared;
use crate::region::Region;
use crate::{Error, Result};

pub(crate) mod admission;
pub(crate) mod cma;
mod conn_io;
pub(crate) mod local;
pub(crate) mod probe;
mod secure;
pub(crate) mod stall;
pub(crate) mod tcp;

/// A way of moving bytes between two workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// A plain copy between two connectors of the same process.
    Local,
    /// Same host, other process: one copy by cross-memory attach
    /// (`process_vm_readv`), set up and fenced over the TCP connection. Used
    /// when the kernel permits it (probed per connection) and for transfers
    /// of at least [`ConnectorBuilder::cma_threshold`](crate::ConnectorBuilder::cma_threshold)
    /// bytes; otherwise the bytes go over TCP.
    Cma,
    /// A TCP connection between the two connectors: works between any two
    /// workers that can reach each other.
    Tcp,
}

impl TransportKind {
    /// Every transport this build has, best first.
    pub const ALL: &'static [TransportKind] =
        &[TransportKind::Local, TransportKind::Cma, TransportKind::Tcp];

    /// The name used in `FERRY_TRANSPORTS` and reports.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Local => "local",
            TransportKind::Cma => "cma",
            TransportKind::Tcp => "tcp",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TransportKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        TransportKind::ALL
            .iter()
            .copied()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<_> = TransportKind::ALL.iter().map(|t| t.name()).collect();
                Error::Config(format!(
                    "unknown transport {s:?}; this build has: {}",
                    names.join(", ")
                ))
            })
    }
}

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
