//! Metrics of a connector: what [`Connector::metrics`](crate::Connector::metrics)
//! returns, and what the Prometheus endpoint serves (`FERRY_METRICS_ADDR`
//! or [`ConnectorBuilder::metrics_addr`](crate::ConnectorBuilder::metrics_addr)).
//! Every metric, its labels and buckets, and when its clock starts and
//! stops: `docs/metrics.md`.
//!
//! Counters are relaxed atomics in fixed arrays, updated once when an
//! operation ends (never per byte); nothing is allocated per operation;
//! reading them costs nothing until someone asks.
//!
//! ```
//! use ferry::metrics::{OpKind, Outcome};
//! use ferry::{Connector, Descriptor};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> ferry::Result<()> {
//! let a = Connector::new().await?;
//! let b = Connector::new().await?;
//! let readable = a.create_readable(vec![Descriptor::from_vec(vec![1u8; 4096])]).await?;
//! let read = b.begin_read(readable.metadata(), vec![Descriptor::from_vec(vec![0u8; 4096])]).await?;
//! read.wait_for_completion().await?;
//! readable.wait_for_completion().await?;
//!
//! let m = b.metrics();
//! assert_eq!(m.count(OpKind::Read, Outcome::Complete), 1);
//! assert_eq!(m.rx_bytes(), 4096);
//! assert_eq!(a.metrics().tx_bytes(), 4096);
//! assert_eq!(a.metrics().exposed_bytes, 0); // the readable has ended
//! # Ok(()) }
//! ```

mod encode;
mod endpoint;
mod meter;
mod store;

pub(crate) use endpoint::{parse_addr, serve, Listing};
pub(crate) use meter::OpMeter;
pub(crate) use store::{ConnMeter, Metrics};
pub use store::{ERROR_CAUSES, XFER_TIME_BUCKETS_US};

use crate::kind::TransportKind;
use ferry_proto::OperationKind;

/// The kind of an operation, as metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// A [`ReadOperation`](crate::ReadOperation) (active; receives).
    Read,
    /// A [`WriteOperation`](crate::WriteOperation) (active; sends).
    Write,
    /// A [`ReadableOperation`](crate::ReadableOperation) (passive; sends).
    Readable,
    /// A [`WritableOperation`](crate::WritableOperation) (passive; receives).
    Writable,
}

impl OpKind {
    /// Every kind, in label order.
    pub const ALL: [OpKind; 4] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::Readable,
        OpKind::Writable,
    ];

    /// The label value: `read`, `write`, `readable`, `writable`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Readable => "readable",
            OpKind::Writable => "writable",
        }
    }

    /// Whether this side started the transfer (active) or exposed memory (passive).
    pub fn side(self) -> Side {
        match self {
            OpKind::Read | OpKind::Write => Side::Active,
            OpKind::Readable | OpKind::Writable => Side::Passive,
        }
    }

    /// Whether this side is the source of the bytes (counted in `tx`).
    pub fn sends(self) -> bool {
        matches!(self, OpKind::Write | OpKind::Readable)
    }

    pub(crate) fn of(kind: OperationKind, side: Side) -> OpKind {
        match (kind, side) {
            (OperationKind::Read, Side::Active) => OpKind::Read,
            (OperationKind::Write, Side::Active) => OpKind::Write,
            (OperationKind::Read, Side::Passive) => OpKind::Readable,
            (OperationKind::Write, Side::Passive) => OpKind::Writable,
        }
    }
}

/// The two sides of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// Started the transfer (a read or a write).
    Active,
    /// Exposed memory (a readable or a writable).
    Passive,
}

impl Side {
    /// The label value: `active` or `passive`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Active => "active",
            Side::Passive => "passive",
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// `COMPLETE`.
    Complete,
    /// `CANCELLED`, by either side.
    Cancelled,
    /// `ERRORED`.
    Errored,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 3] = [Outcome::Complete, Outcome::Cancelled, Outcome::Errored];

    /// The label value: `complete`, `cancelled`, `errored`.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::Cancelled => "cancelled",
            Outcome::Errored => "errored",
        }
    }
}

/// Operations of one kind that ended one way over one transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationCount {
    /// The kind.
    pub kind: OpKind,
    /// The transport that carried them; `None`: ended before any did.
    pub transport: Option<TransportKind>,
    /// How they ended.
    pub outcome: Outcome,
    /// How many.
    pub count: u64,
    /// Their total size in bytes (every descriptor).
    pub bytes: u64,
}

/// The durations of completed operations of one side over one transport,
/// from creation to completion, in microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationHistogram {
    /// The side.
    pub side: Side,
    /// The transport.
    pub transport: Option<TransportKind>,
    /// How many were observed.
    pub count: u64,
    /// The sum of their durations.
    pub sum_us: u64,
    /// Cumulative: `(upper bound in µs, how many took at most that)`,
    /// bounds from [`XFER_TIME_BUCKETS_US`], then `u64::MAX` for `+Inf`.
    pub buckets: Vec<(u64, u64)>,
}

/// Errors of one cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCount {
    /// One of [`ERROR_CAUSES`].
    pub cause: &'static str,
    /// How many.
    pub count: u64,
}

/// Connections to (outbound) and from (inbound) remote workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Connections {
    /// Accepted connections that passed the handshake, since the start.
    pub inbound_opened: u64,
    /// Of those, how many have closed.
    pub inbound_closed: u64,
    /// Connections this connector opened, since the start.
    pub outbound_opened: u64,
    /// Of those, how many have closed.
    pub outbound_closed: u64,
    /// Heartbeats (`Ping` frames) sent, both directions: only connections
    /// that carry an operation in progress send them
    /// ([`ConnectorBuilder::liveness`](crate::ConnectorBuilder::liveness)).
    pub heartbeats: u64,
    /// Times a connection's liveness timer woke its reader: zero while no
    /// connection carries an operation in progress.
    pub liveness_wakeups: u64,
    /// Connections closed because their peer sent nothing for the
    /// liveness bound while an operation was in progress.
    pub unresponsive: u64,
}

impl Connections {
    /// Connections open now, both directions.
    pub fn open(&self) -> u64 {
        (self.inbound_opened + self.outbound_opened)
            .saturating_sub(self.inbound_closed + self.outbound_closed)
    }
}

/// A copy of one connector's metrics at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// The connector's worker id (the `worker` label).
    pub worker_id: String,
    /// Ended operations by kind, transport and outcome (only those seen).
    pub operations: Vec<OperationCount>,
    /// Durations of completed operations by side and transport (only
    /// those seen).
    pub durations: Vec<DurationHistogram>,
    /// Errors by cause (only those seen): every error an operation ended
    /// with, every error `begin_*` / `create_*` returned, every deadline
    /// a wait ran into.
    pub errors: Vec<ErrorCount>,
    /// Operations created and not ended yet, by kind.
    pub in_flight: [(OpKind, u64); 4],
    /// Bytes exposed now by passive operations (readables and writables
    /// that have not ended).
    pub exposed_bytes: u64,
    /// Connections opened and closed.
    pub connections: Connections,
    /// Operations whose GPU memory was to be lent by CUDA IPC (both
    /// processes offered it) and that moved staged through host memory
    /// instead, because the driver would not export the memory. Counted by
    /// the side that lends.
    pub cuda_ipc_fallbacks: u64,
}

impl MetricsSnapshot {
    fn sum(&self, f: impl Fn(&OperationCount) -> bool, bytes: bool) -> u64 {
        self.operations
            .iter()
            .filter(|c| f(c))
            .map(|c| if bytes { c.bytes } else { c.count })
            .sum()
    }

    /// Operations of `kind` that ended with `outcome`, over every transport.
    pub fn count(&self, kind: OpKind, outcome: Outcome) -> u64 {
        self.sum(|c| c.kind == kind && c.outcome == outcome, false)
    }

    /// Their bytes.
    pub fn bytes(&self, kind: OpKind, outcome: Outcome) -> u64 {
        self.sum(|c| c.kind == kind && c.outcome == outcome, true)
    }

    /// Bytes this connector sent in completed operations (readables and writes).
    pub fn tx_bytes(&self) -> u64 {
        self.sum(|c| c.kind.sends() && c.outcome == Outcome::Complete, true)
    }

    /// Bytes this connector received in completed operations (reads and writables).
    pub fn rx_bytes(&self) -> u64 {
        self.sum(|c| !c.kind.sends() && c.outcome == Outcome::Complete, true)
    }

    /// Errors of `cause` (one of [`ERROR_CAUSES`]).
    pub fn errors(&self, cause: &str) -> u64 {
        self.errors
            .iter()
            .filter(|e| e.cause == cause)
            .map(|e| e.count)
            .sum()
    }

    /// Operations of `kind` in flight.
    pub fn in_flight(&self, kind: OpKind) -> u64 {
        self.in_flight[kind as usize].1
    }
}
