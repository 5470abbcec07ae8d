//! The counters of one connector: plain relaxed atomics in fixed arrays,
//! indexed by label, updated once when an operation ends (never per byte),
//! and read only by [`Metrics::snapshot`] and the scrape endpoint.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use ferry_proto::OperationStatus;

use super::{
    Connections, DurationHistogram, ErrorCount, MetricsSnapshot, OpKind, OperationCount, Outcome,
    Side,
};
use crate::error::Error;
use crate::kind::TransportKind;

/// Upper bounds (inclusive, microseconds) of the buckets of
/// `ferry_xfer_time_us`; a last bucket, `+Inf`, takes the rest.
pub const XFER_TIME_BUCKETS_US: [u64; 19] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Transport label values, by index: a transport, or `none` for an
/// operation that ended before any transport carried it.
pub(crate) const TRANSPORTS: [Option<TransportKind>; 6] = [
    Some(TransportKind::Local),
    Some(TransportKind::Cma),
    Some(TransportKind::Tcp),
    Some(TransportKind::Ucx),
    Some(TransportKind::CudaIpc),
    None,
];

pub(crate) fn transport_index(t: Option<TransportKind>) -> usize {
    match t {
        Some(TransportKind::Local) => 0,
        Some(TransportKind::Cma) => 1,
        Some(TransportKind::Tcp) => 2,
        Some(TransportKind::Ucx) => 3,
        Some(TransportKind::CudaIpc) => 4,
        None => 5,
    }
}

pub(crate) fn transport_name(t: Option<TransportKind>) -> &'static str {
    t.map_or("none", TransportKind::name)
}

/// The values of the `cause` label of `ferry_errors_total`, one per
/// [`Error`] variant, in snake case.
pub const ERROR_CAUSES: [&str; 30] = [
    "no_descriptors",
    "too_many_descriptors",
    "read_only_descriptor",
    "unsupported_device",
    "invalid_device",
    "wrong_pairing",
    "count_mismatch",
    "size_mismatch",
    "config",
    "invalid_metadata",
    "wrong_worker",
    "unreachable",
    "rejected",
    "remote_cancelled",
    "connection_lost",
    "protocol",
    "unauthenticated",
    "cancelled",
    "shutdown",
    "io",
    "timeout",
    "cuda_unavailable",
    "no_device_transport",
    "device_copy",
    "not_device_memory",
    "peer_unresponsive",
    "expired",
    "digest_mismatch",
    "grant",
    "pool",
];

/// The index of `e`'s cause in [`ERROR_CAUSES`].
pub(crate) fn cause_index(e: &Error) -> usize {
    match e {
        Error::NoDescriptors => 0,
        Error::TooManyDescriptors(_) => 1,
        Error::ReadOnlyDescriptor { .. } => 2,
        Error::UnsupportedDevice { .. } => 3,
        Error::InvalidDevice(_) => 4,
        Error::WrongPairing { .. } => 5,
        Error::CountMismatch { .. } => 6,
        Error::SizeMismatch { .. } => 7,
        Error::Config(_) | Error::InvalidSetting(_) => 8,
        Error::InvalidMetadata(_) => 9,
        Error::WrongWorker { .. } => 10,
        Error::Unreachable { .. } => 11,
        Error::Rejected { .. } => 12,
        Error::RemoteCancelled => 13,
        Error::ConnectionLost { .. } => 14,
        Error::Protocol { .. } => 15,
        Error::Unauthenticated { .. } => 16,
        Error::Cancelled => 17,
        Error::Shutdown => 18,
        Error::Io(_) => 19,
        Error::Timeout(_) => 20,
        Error::CudaUnavailable { .. } => 21,
        Error::NoDeviceTransport { .. } => 22,
        Error::DeviceCopy { .. } => 23,
        Error::NotDeviceMemory { .. } => 24,
        Error::PeerUnresponsive { .. } => 25,
        Error::Expired { .. } => 26,
        Error::DigestMismatch { .. } => 27,
        Error::Grant(_) => 28,
        Error::Pool(_) => 29,
    }
}

/// `cause` of an error, as `ferry_errors_total` labels it.
pub(crate) fn cause_name(e: &Error) -> &'static str {
    ERROR_CAUSES[cause_index(e)]
}

const KINDS: usize = OpKind::ALL.len();
const NT: usize = TRANSPORTS.len();
const OUTCOMES: usize = Outcome::ALL.len();
const BUCKETS: usize = XFER_TIME_BUCKETS_US.len() + 1;

#[derive(Default)]
struct Cell {
    count: AtomicU64,
    bytes: AtomicU64,
}

struct Histogram {
    /// Per bucket, not cumulative; the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    fn observe(&self, us: u64) {
        let i = XFER_TIME_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BUCKETS - 1);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }
}

/// Every counter of one connector.
pub(crate) struct Metrics {
    pub(crate) worker_id: String,
    ops: [[[Cell; OUTCOMES]; NT]; KINDS],
    xfer_time: [[Histogram; NT]; 2],
    errors: [AtomicU64; ERROR_CAUSES.len()],
    in_flight: [AtomicI64; KINDS],
    exposed_bytes: AtomicI64,
    /// Connections opened and closed: `[inbound, outbound]`.
    opened: [AtomicU64; 2],
    closed: [AtomicU64; 2],
    /// Operations staged whose GPU memory was to be lent by CUDA IPC.
    ipc_fallbacks: AtomicU64,
    /// Liveness: heartbeats sent, timer wake-ups, peers declared.
    liveness: [AtomicU64; 3],
}

impl Metrics {
    pub(crate) fn new(worker_id: String) -> Metrics {
        Metrics {
            worker_id,
            ops: Default::default(),
            xfer_time: Default::default(),
            errors: Default::default(),
            in_flight: Default::default(),
            exposed_bytes: AtomicI64::new(0),
            opened: Default::default(),
            closed: Default::default(),
            ipc_fallbacks: AtomicU64::new(0),
            liveness: Default::default(),
        }
    }

    /// An operation's GPU memory moves staged instead of by CUDA IPC.
    pub(crate) fn ipc_fell_back(&self) {
        self.ipc_fallbacks.fetch_add(1, Relaxed);
    }

    /// An operation was created.
    pub(crate) fn begun(&self, kind: OpKind, bytes: u64) {
        self.in_flight[kind as usize].fetch_add(1, Relaxed);
        if kind.side() == Side::Passive {
            self.exposed_bytes.fetch_add(bytes as i64, Relaxed);
        }
    }

    /// An operation left the in-flight gauges; `end` says how it ended
    /// (`None`: it was abandoned before it really started, and is not
    /// counted as an operation).
    pub(crate) fn ended(
        &self,
        kind: OpKind,
        bytes: u64,
        end: Option<(
            OperationStatus,
            Option<&Error>,
            Option<TransportKind>,
            Duration,
        )>,
    ) {
        self.in_flight[kind as usize].fetch_sub(1, Relaxed);
        if kind.side() == Side::Passive {
            self.exposed_bytes.fetch_sub(bytes as i64, Relaxed);
        }
        let Some((status, error, transport, took)) = end else {
            return;
        };
        let outcome = match status {
            OperationStatus::Complete => Outcome::Complete,
            OperationStatus::Cancelled => Outcome::Cancelled,
            _ => Outcome::Errored,
        };
        let t = transport_index(transport);
        let cell = &self.ops[kind as usize][t][outcome as usize];
        cell.count.fetch_add(1, Relaxed);
        cell.bytes.fetch_add(bytes, Relaxed);
        match outcome {
            Outcome::Complete => {
                let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
                self.xfer_time[kind.side() as usize][t].observe(us);
            }
            Outcome::Errored => {
                if let Some(e) = error {
                    self.error(e);
                }
            }
            Outcome::Cancelled => {}
        }
    }

    /// An error returned to the caller outside an operation's end.
    pub(crate) fn error(&self, e: &Error) {
        self.errors[cause_index(e)].fetch_add(1, Relaxed);
    }

    pub(crate) fn connection_opened(&self, inbound: bool) {
        self.opened[usize::from(!inbound)].fetch_add(1, Relaxed);
    }

    pub(crate) fn connection_closed(&self, inbound: bool) {
        self.closed[usize::from(!inbound)].fetch_add(1, Relaxed);
    }

    /// A consistent-enough copy: each value is read once, relaxed.
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let mut operations = Vec::new();
        for kind in OpKind::ALL {
            for (t, transport) in TRANSPORTS.iter().enumerate() {
                for outcome in Outcome::ALL {
                    let c = &self.ops[kind as usize][t][outcome as usize];
                    let count = c.count.load(Relaxed);
                    if count > 0 {
                        operations.push(OperationCount {
                            kind,
                            transport: *transport,
                            outcome,
                            count,
                            bytes: c.bytes.load(Relaxed),
                        });
                    }
                }
            }
        }
        let mut durations = Vec::new();
        for side in [Side::Active, Side::Passive] {
            for (t, transport) in TRANSPORTS.iter().enumerate() {
                let h = &self.xfer_time[side as usize][t];
                let mut cumulative = 0;
                let buckets: Vec<(u64, u64)> = h
                    .buckets
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        cumulative += b.load(Relaxed);
                        (
                            XFER_TIME_BUCKETS_US.get(i).copied().unwrap_or(u64::MAX),
                            cumulative,
                        )
                    })
                    .collect();
                if cumulative > 0 {
                    durations.push(DurationHistogram {
                        side,
                        transport: *transport,
                        count: cumulative,
                        sum_us: h.sum_us.load(Relaxed),
                        buckets,
                    });
                }
            }
        }
        let errors = ERROR_CAUSES
            .iter()
            .zip(&self.errors)
            .map(|(cause, n)| (*cause, n.load(Relaxed)))
            .filter(|(_, n)| *n > 0)
            .map(|(cause, count)| ErrorCount { cause, count })
            .collect();
        let gauge = |a: &AtomicI64| u64::try_from(a.load(Relaxed)).unwrap_or(0);
        MetricsSnapshot {
            worker_id: self.worker_id.clone(),
            operations,
            durations,
            errors,
            in_flight: OpKind::ALL.map(|k| (k, gauge(&self.in_flight[k as usize]))),
            exposed_bytes: gauge(&self.exposed_bytes),
            connections: Connections {
                inbound_opened: self.opened[0].load(Relaxed),
                inbound_closed: self.closed[0].load(Relaxed),
                outbound_opened: self.opened[1].load(Relaxed),
                outbound_closed: self.closed[1].load(Relaxed),
                heartbeats: self.liveness[0].load(Relaxed),
                liveness_wakeups: self.liveness[1].load(Relaxed),
                unresponsive: self.liveness[2].load(Relaxed),
            },
            cuda_ipc_fallbacks: self.ipc_fallbacks.load(Relaxed),
        }
    }
}

/// Counts one connection from its start to its end (drop).
pub(crate) struct ConnMeter {
    metrics: std::sync::Arc<Metrics>,
    inbound: bool,
}

impl ConnMeter {
    pub(crate) fn new(metrics: &std::sync::Arc<Metrics>, inbound: bool) -> ConnMeter {
        metrics.connection_opened(inbound);
        ConnMeter {
            metrics: metrics.clone(),
            inbound,
        }
    }
}

impl ConnMeter {
    /// The liveness timer woke the reader; it sent a heartbeat (`ping`),
    /// or declared the peer unresponsive.
    pub(crate) fn liveness(&self, ping: bool, unresponsive: bool) {
        let l = &self.metrics.liveness;
        l[1].fetch_add(1, Relaxed);
        if ping {
            l[0].fetch_add(1, Relaxed);
        }
        if unresponsive {
            l[2].fetch_add(1, Relaxed);
        }
    }
}

impl Drop for ConnMeter {
    fn drop(&mut self) {
        self.metrics.connection_closed(self.inbound);
    }
}
