//! The outcome of one operation, shared by its handle and the transport
//! that moves its bytes: it reaches a terminal state once, and once sealed
//! a cancel no longer changes it (the remote decides).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_proto::OperationStatus;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::kind::TransportKind;
use crate::metrics::OpMeter;
use crate::sync::lock;

#[derive(Clone)]
pub(crate) struct OpState {
    pub(crate) status: OperationStatus,
    pub(crate) error: Option<Error>,
}

/// The status of one operation, shared by its handle and the transport that
/// moves its bytes. Every change wakes exactly the waiters of this operation.
pub(crate) struct OpShared {
    tx: watch::Sender<OpState>,
    /// The transport that carries it: set once, except that a pull that
    /// finds a CUDA IPC lease names it, and a lend that failed leaves it
    /// to the in-band path ([`moved_by`](Self::moved_by)).
    transport: Mutex<Option<TransportKind>>,
    /// Every byte and the final `Finish` are on their way (the outcome is
    /// now the remote's to decide), or a destination has every byte and
    /// committed (its confirmation decides): a cancel no longer changes it.
    sealed: AtomicBool,
    /// Metrics and the trace span (`None` in unit tests of transports).
    meter: Option<OpMeter>,
}

impl OpShared {
    #[cfg(test)]
    pub(crate) fn new(status: OperationStatus) -> Arc<Self> {
        Self::with_meter(status, None)
    }

    /// An operation counted in its connector's metrics and traced.
    pub(crate) fn metered(meter: OpMeter) -> Arc<Self> {
        Self::with_meter(OperationStatus::Initialized, Some(meter))
    }

    fn with_meter(status: OperationStatus, meter: Option<OpMeter>) -> Arc<Self> {
        Arc::new(OpShared {
            tx: watch::Sender::new(OpState {
                status,
                error: None,
            }),
            transport: Mutex::new(None),
            sealed: AtomicBool::new(false),
            meter,
        })
    }

    pub(crate) fn status(&self) -> OperationStatus {
        self.tx.borrow().status
    }

    pub(crate) fn seal(&self) {
        self.sealed.store(true, Ordering::Release);
        if let Some(m) = &self.meter {
            m.sealed();
        }
    }

    /// The request was opened: sent (active) or granted to `peer` (passive).
    pub(crate) fn opened(&self, peer: Option<&str>) {
        if let Some(m) = &self.meter {
            m.opened(peer);
        }
    }

    /// The first byte moves (traced once).
    pub(crate) fn first_byte(&self) {
        if let Some(m) = &self.meter {
            m.first_byte();
        }
    }

    /// Undoes a `seal` whose frame did not leave after all (only under the
    /// region's lock, in the same critical section as the `seal`).
    pub(crate) fn unseal(&self) {
        self.sealed.store(false, Ordering::Release);
    }

    pub(crate) fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    pub(crate) fn set_transport(&self, t: TransportKind) {
        lock(&self.transport).get_or_insert(t);
    }

    /// Its bytes move over `t`, whatever was said before: the lease being
    /// copied says which backend lent it (a host destination learns that
    /// its source lent GPU memory only then), and memory that was to be
    /// lent and could not be moves in band instead.
    pub(crate) fn moved_by(&self, t: TransportKind) {
        *lock(&self.transport) = Some(t);
    }

    /// Its GPU memory was to be lent by CUDA IPC and moves staged instead
    /// (the export failed, `why`): counted and traced.
    pub(crate) fn ipc_fell_back(&self, why: &str) {
        if let Some(m) = &self.meter {
            m.ipc_fell_back(why);
        }
    }

    pub(crate) fn transport(&self) -> Option<TransportKind> {
        *lock(&self.transport)
    }

    /// INITIALIZED -> IN_PROGRESS; false if the operation is not INITIALIZED.
    pub(crate) fn start(&self) -> bool {
        self.tx.send_if_modified(|s| {
            if s.status == OperationStatus::Initialized {
                s.status = OperationStatus::InProgress;
                true
            } else {
                false
            }
        })
    }

    /// Moves to a terminal state unless already in one; true if this call did.
    pub(crate) fn end(&self, status: OperationStatus, error: Option<Error>) -> bool {
        debug_assert!(status.is_terminal());
        let won = self.tx.send_if_modified(|s| {
            if s.status.is_terminal() {
                false
            } else {
                // Counted before anyone wakes: a waiter reads them at once.
                if let Some(m) = &self.meter {
                    m.count_end(status, error.as_ref(), self.transport());
                }
                s.status = status;
                s.error = error;
                true
            }
        });
        if let (true, Some(m)) = (won, &self.meter) {
            // Terminal: nobody changes the state any more.
            let state = self.tx.borrow();
            m.trace_end(status, state.error.as_ref(), self.transport());
        }
        won
    }

    pub(crate) fn fail(&self, error: Error) -> bool {
        let status = match error {
            Error::Cancelled | Error::RemoteCancelled => OperationStatus::Cancelled,
            _ => OperationStatus::Errored,
        };
        self.end(status, Some(error))
    }

    /// The state now, with its error.
    pub(crate) fn state(&self) -> (OperationStatus, Option<Error>) {
        let s = self.tx.borrow();
        (s.status, s.error.clone())
    }

    /// Waits for a terminal state and returns it.
    pub(crate) async fn ended(&self) -> (OperationStatus, Option<Error>) {
        let mut rx = self.tx.subscribe();
        let r = match rx.wait_for(|s| s.status.is_terminal()).await {
            Ok(s) => (s.status, s.error.clone()),
            // Not reached: the sender lives in `self`.
            Err(_) => (OperationStatus::Errored, Some(Error::Shutdown)),
        };
        r
    }

    pub(crate) async fn wait(&self) -> Result<()> {
        match self.ended().await {
            (OperationStatus::Complete, _) => Ok(()),
            (_, error) => Err(error.unwrap_or(Error::Cancelled)),
        }
    }

    pub(crate) async fn wait_until(&self, deadline: Instant, budget: Duration) -> Result<()> {
        match tokio::time::timeout_at(deadline, self.wait()).await {
            Ok(r) => r,
            Err(_) => {
                let e = Error::Timeout(budget);
                if let Some(m) = &self.meter {
                    m.timed_out(&e);
                }
                Err(e)
            }
        }
    }
}
