//! The Prometheus (OpenMetrics text) form of the connectors' metrics:
//! one family per metric, one series per connector (`worker` label) and
//! label values. Runs only when someone scrapes.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::store::{transport_name, TRANSPORTS};
use super::{MetricsSnapshot, OpKind, Outcome};

/// Encodes the snapshots of every connector an endpoint serves.
#[derive(Debug)]
pub(crate) struct Snapshots(pub(crate) Vec<MetricsSnapshot>);

fn counter(m: &mut MetricEncoder<'_>, labels: &impl EncodeLabelSet, v: u64) -> fmt::Result {
    m.encode_family(labels)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(m: &mut MetricEncoder<'_>, labels: &impl EncodeLabelSet, v: u64) -> fmt::Result {
    m.encode_family(labels)?.encode_gauge(&v)
}

impl Snapshots {
    fn family<'a>(
        &self,
        enc: &'a mut DescriptorEncoder<'_>,
        name: &'a str,
        help: &str,
        ty: MetricType,
        each: impl Fn(&mut MetricEncoder<'_>, &MetricsSnapshot) -> fmt::Result,
    ) -> fmt::Result {
        let mut m = enc.encode_descriptor(name, help, None, ty)?;
        for s in &self.0 {
            each(&mut m, s)?;
        }
        Ok(())
    }

    /// `ferry_tx_*` / `ferry_rx_*`: completed operations in which this
    /// connector sent (or received), per transport, always present.
    fn direction(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        sends: bool,
        bytes: bool,
    ) -> fmt::Result {
        self.family(enc, name, help, MetricType::Counter, |m, s| {
            for t in &TRANSPORTS[..TRANSPORTS.len() - 1] {
                let v: u64 = s
                    .operations
                    .iter()
                    .filter(|c| {
                        c.kind.sends() == sends
                            && c.outcome == Outcome::Complete
                            && c.transport == *t
                    })
                    .map(|c| if bytes { c.bytes } else { c.count })
                    .sum();
                let labels = [
                    ("worker", s.worker_id.as_str()),
                    ("transport", transport_name(*t)),
                ];
                counter(m, &labels, v)?;
            }
            Ok(())
        })
    }
}

impl Collector for Snapshots {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let e = &mut enc;
        self.direction(
            e,
            "ferry_tx_bytes",
            "Bytes this worker sent in completed operations (readables, writes)",
            true,
            true,
        )?;
        self.direction(
            e,
            "ferry_rx_bytes",
            "Bytes this worker received in completed operations (reads, writables)",
            false,
            true,
        )?;
        self.direction(
            e,
            "ferry_tx_requests",
            "Completed operations in which this worker sent",
            true,
            false,
        )?;
        self.direction(
            e,
            "ferry_rx_requests",
            "Completed operations in which this worker received",
            false,
            false,
        )?;
        for (name, help, bytes) in [
            (
                "ferry_operations",
                "Ended operations by kind, transport and outcome",
                false,
            ),
            (
                "ferry_operation_bytes",
                "Total size of ended operations by kind, transport and outcome",
                true,
            ),
        ] {
            self.family(e, name, help, MetricType::Counter, |m, s| {
                for c in &s.operations {
                    let labels = [
                        ("worker", s.worker_id.as_str()),
                        ("kind", c.kind.name()),
                        ("transport", transport_name(c.transport)),
                        ("outcome", c.outcome.name()),
                    ];
                    counter(m, &labels, if bytes { c.bytes } else { c.count })?;
                }
                Ok(())
            })?;
        }
        self.family(
            e,
            "ferry_xfer_time_us",
            "Time from an operation's creation to its completion, in microseconds (completed operations)",
            MetricType::Histogram,
            |m, s| {
                for h in &s.durations {
                    let labels = [
                        ("worker", s.worker_id.as_str()),
                        ("side", h.side.name()),
                        ("transport", transport_name(h.transport)),
                    ];
                    // The encoder makes them cumulative itself.
                    let mut below = 0;
                    let buckets: Vec<(f64, u64)> = h
                        .buckets
                        .iter()
                        .map(|&(b, n)| {
                            let here = n.saturating_sub(below);
                            below = n;
                            (if b == u64::MAX { f64::INFINITY } else { b as f64 }, here)
                        })
                        .collect();
                    m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                        h.sum_us as f64,
                        h.count,
                        &buckets,
                        None,
                    )?;
                }
                Ok(())
            },
        )?;
        self.family(
            e,
            "ferry_errors",
            "Errors by cause",
            MetricType::Counter,
            |m, s| {
                for c in &s.errors {
                    counter(
                        m,
                        &[("worker", s.worker_id.as_str()), ("cause", c.cause)],
                        c.count,
                    )?;
                }
                Ok(())
            },
        )?;
        self.family(
            e,
            "ferry_operations_in_flight",
            "Operations created and not ended",
            MetricType::Gauge,
            |m, s| {
                for k in OpKind::ALL {
                    gauge(
                        m,
                        &[("worker", s.worker_id.as_str()), ("kind", k.name())],
                        s.in_flight(k),
                    )?;
                }
                Ok(())
            },
        )?;
        self.family(
            e,
            "ferry_exposed_bytes",
            "Bytes exposed now by passive operations",
            MetricType::Gauge,
            |m, s| gauge(m, &[("worker", s.worker_id.as_str())], s.exposed_bytes),
        )?;
        self.family(
            e,
            "ferry_cuda_ipc_fallbacks",
            "Operations whose GPU memory was to be lent by CUDA IPC and moved staged instead",
            MetricType::Counter,
            |m, s| counter(m, &[("worker", s.worker_id.as_str())], s.cuda_ipc_fallbacks),
        )?;
        let c = |s: &MetricsSnapshot| s.connections;
        self.family(
            e,
            "ferry_connections",
            "Connections open now",
            MetricType::Gauge,
            |m, s| {
                let w = s.worker_id.as_str();
                gauge(
                    m,
                    &[("worker", w), ("direction", "inbound")],
                    c(s).inbound_opened.saturating_sub(c(s).inbound_closed),
                )?;
                gauge(
                    m,
                    &[("worker", w), ("direction", "outbound")],
                    c(s).outbound_opened.saturating_sub(c(s).outbound_closed),
                )
            },
        )?;
        self.family(
            e,
            "ferry_connections_opened",
            "Connections opened (inbound: accepted and past the handshake)",
            MetricType::Counter,
            |m, s| {
                let w = s.worker_id.as_str();
                counter(
                    m,
                    &[("worker", w), ("direction", "inbound")],
                    c(s).inbound_opened,
                )?;
                counter(
                    m,
                    &[("worker", w), ("direction", "outbound")],
                    c(s).outbound_opened,
                )
            },
        )?;
        self.family(
            e,
            "ferry_connections_closed",
            "Connections closed",
            MetricType::Counter,
            |m, s| {
                let w = s.worker_id.as_str();
                counter(
                    m,
                    &[("worker", w), ("direction", "inbound")],
                    c(s).inbound_closed,
                )?;
                counter(
                    m,
                    &[("worker", w), ("direction", "outbound")],
                    c(s).outbound_closed,
                )
            },
        )?;
        self.family(
            e,
            "ferry_heartbeats",
            "Heartbeats sent on connections with an operation in progress",
            MetricType::Counter,
            |m, s| counter(m, &[("worker", s.worker_id.as_str())], c(s).heartbeats),
        )?;
        self.family(
            e,
            "ferry_peers_unresponsive",
            "Connections closed because the peer sent nothing for the liveness bound",
            MetricType::Counter,
            |m, s| counter(m, &[("worker", s.worker_id.as_str())], c(s).unresponsive),
        )
    }
}

/// The whole exposition of `snaps`, OpenMetrics text ending in `# EOF`.
pub(crate) fn render(snaps: Vec<MetricsSnapshot>) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Snapshots(snaps)));
    let mut out = String::new();
    // Writing into a String cannot fail, and every value is well formed.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}
