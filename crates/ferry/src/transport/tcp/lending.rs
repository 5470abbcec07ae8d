//! Which backend lends and pulls on a connection: cross-memory attach
//! (same host, probed), or UCX (set up by the `Rdma` exchange). A
//! connection sets up at most one of them; the session decides *whether*
//! bytes move by lending, this decides *how*.

use std::io;
use std::sync::atomic::Ordering;

use crate::kind::TransportKind;
use crate::region::Region;
use crate::transport::pull::{cma::CmaPuller, ucx::UcxPuller, LeaseBlob, Puller};

use super::conn::Conn;

impl Conn {
    /// Whether this connection lends and pulls through UCX.
    pub(super) fn by_ucx(&self) -> bool {
        self.via_ucx.load(Ordering::Acquire)
    }

    /// The transport that lent bytes travel by on this connection.
    pub(super) fn lending_kind(&self) -> TransportKind {
        if self.by_ucx() {
            UcxPuller.kind()
        } else {
            CmaPuller.kind()
        }
    }

    /// Prepares `region` to be lent (UCX: registers it, see
    /// [`UcxPuller::register_source`]).
    pub(super) fn register_lent(&self, region: &Region) -> io::Result<()> {
        if self.by_ucx() {
            let strict = self
                .ucx_ep
                .get()
                .map_or(true, |ep| ep.worker.strict_registration);
            UcxPuller.register_source(region, strict)
        } else {
            CmaPuller.register(region)
        }
    }

    /// What the peer needs to copy `region`.
    pub(super) fn lease_of(&self, region: &Region) -> LeaseBlob {
        if self.by_ucx() {
            UcxPuller.lend(region)
        } else {
            CmaPuller.lend(region)
        }
    }
}
