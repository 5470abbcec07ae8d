//! What an operation carries for metrics and traces: its labels, its birth,
//! and its `tracing` span. Held by the operation's `OpShared`, which calls
//! it at the few moments that matter (open, first byte, seal, end).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_proto::OperationStatus;
use tracing::field::Empty;

use super::store::{cause_name, transport_name, Metrics};
use super::OpKind;
use crate::error::Error;
use crate::kind::TransportKind;

/// The target of the operation spans and their events.
pub(crate) const TARGET: &str = "ferry::op";

pub(crate) struct OpMeter {
    metrics: Arc<Metrics>,
    kind: OpKind,
    bytes: u64,
    created: Instant,
    /// The operation's span, until it ends (dropping it closes it, so
    /// that its duration is the operation's). `None` when no subscriber
    /// wants it.
    span: Mutex<Option<tracing::Span>>,
    first_byte: AtomicBool,
    /// Whether `Metrics::ended` was called.
    done: AtomicBool,
}

impl OpMeter {
    /// Starts counting one operation. `peer` is the remote worker, when
    /// known (an active operation's); never pass the token or metadata.
    pub(crate) fn new(
        metrics: &Arc<Metrics>,
        kind: OpKind,
        sizes: &[u64],
        op_id: u64,
        peer: Option<&str>,
    ) -> OpMeter {
        let bytes = sizes.iter().sum();
        metrics.begun(kind, bytes);
        let span = tracing::info_span!(
            target: TARGET,
            "ferry.op",
            kind = kind.name(),
            side = kind.side().name(),
            op_id,
            bytes,
            descriptors = sizes.len(),
            peer = peer,
            transport = Empty,
            outcome = Empty,
            cause = Empty,
        );
        let span = (!span.is_disabled()).then(|| {
            tracing::info!(target: TARGET, parent: &span, "created");
            span
        });
        OpMeter {
            metrics: metrics.clone(),
            kind,
            bytes,
            created: Instant::now(),
            span: Mutex::new(span),
            first_byte: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }

    fn with_span(&self, f: impl FnOnce(&tracing::Span)) {
        let span = self.span.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = span.as_ref() {
            f(s);
        }
    }

    /// The request was opened: sent (active) or granted to `peer` (passive).
    pub(crate) fn opened(&self, peer: Option<&str>) {
        self.with_span(|s| {
            if let Some(p) = peer {
                s.record("peer", p);
            }
            tracing::info!(target: TARGET, parent: s, "open");
        });
    }

    /// The first byte moves (the source starts sending, or the
    /// destination starts copying): recorded once.
    pub(crate) fn first_byte(&self) {
        if !self.first_byte.swap(true, Ordering::Relaxed) {
            self.with_span(|s| tracing::info!(target: TARGET, parent: s, "first byte"));
        }
    }

    /// Its GPU memory moves staged instead of by CUDA IPC, for `why`.
    pub(crate) fn ipc_fell_back(&self, why: &str) {
        self.metrics.ipc_fell_back();
        self.with_span(
            |s| tracing::info!(target: TARGET, parent: s, why, "staged instead of CUDA IPC"),
        );
    }

    pub(crate) fn sealed(&self) {
        self.with_span(|s| tracing::info!(target: TARGET, parent: s, "sealed"));
    }

    /// The operation reached `status`: counts it (once).
    pub(crate) fn count_end(
        &self,
        status: OperationStatus,
        error: Option<&Error>,
        transport: Option<TransportKind>,
    ) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        let took = self.created.elapsed();
        self.metrics.ended(
            self.kind,
            self.bytes,
            Some((status, error, transport, took)),
        );
    }

    /// The operation reached `status`: ends its span.
    pub(crate) fn trace_end(
        &self,
        status: OperationStatus,
        error: Option<&Error>,
        transport: Option<TransportKind>,
    ) {
        let span = self.span.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = span {
            let outcome = match status {
                OperationStatus::Complete => "complete",
                OperationStatus::Cancelled => "cancelled",
                _ => "errored",
            };
            s.record("transport", transport_name(transport));
            s.record("outcome", outcome);
            if let Some(e) = error {
                s.record("cause", cause_name(e));
            }
            let took_us = u64::try_from(self.created.elapsed().as_micros()).unwrap_or(u64::MAX);
            tracing::info!(target: TARGET, parent: &s, took_us, "end");
        }
    }

    /// A waiter gave up at its deadline.
    pub(crate) fn timed_out(&self, e: &Error) {
        self.metrics.error(e);
    }
}

impl Drop for OpMeter {
    fn drop(&mut self) {
        // An operation abandoned before it ended (its start was dropped
        // half-way): it leaves the gauges without being counted.
        if !self.done.swap(true, Ordering::AcqRel) {
            self.metrics.ended(self.kind, self.bytes, None);
        }
    }
}
