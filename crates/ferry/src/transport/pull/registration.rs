//! What a lane keeps for memory it lends, kept by the region until its
//! last lease ends: typed, one variant per lane that keeps anything (a
//! lane that keeps nothing uses [`Nothing`]). The region holds a
//! [`Registration`]; a lane finds its own with [`Kept::find`], by its
//! type, with no downcast.
//!
//! Nothing here reads a region (the region imports this file).

use std::sync::Arc;

use crate::transport::ucx::MemReg;

/// What a region keeps while it is lent, for the lane that lent it.
pub(crate) enum Registration {
    /// UCX: the keys its leases carry, and the registrations made for this
    /// region alone (those of pools are kept by the pool, see
    /// `regcache.rs`).
    Ucx(UcxKeys),
    /// CUDA IPC: the exported handles, encoded as its leases carry them.
    CudaIpc(IpcExport),
}

/// A lane's registration, as a region keeps it.
pub(crate) trait Kept: Sized + Send + Sync + 'static {
    /// Into what the region keeps.
    fn keep(self) -> Registration;

    /// This lane's registration, if `kept` is one.
    fn find(kept: &Registration) -> Option<&Self>;
}

/// The registration of a lane that keeps nothing (cross-memory attach): no
/// value of it exists.
pub(crate) enum Nothing {}

impl Kept for Nothing {
    fn keep(self) -> Registration {
        match self {}
    }

    fn find(_: &Registration) -> Option<&Self> {
        None
    }
}

/// What UCX keeps of a lent region.
pub(crate) struct UcxKeys {
    /// The packed remote keys its leases carry.
    pub(crate) keys: Vec<u8>,
    /// The registrations made for this region alone, unregistered when
    /// dropped.
    pub(crate) _own: Vec<Arc<MemReg>>,
}

impl Kept for UcxKeys {
    fn keep(self) -> Registration {
        Registration::Ucx(self)
    }

    fn find(kept: &Registration) -> Option<&Self> {
        match kept {
            Registration::Ucx(k) => Some(k),
            _ => None,
        }
    }
}

/// What CUDA IPC keeps of lent device memory: the lease's opaque bytes
/// (handles and offsets), made once by `register`.
pub(crate) struct IpcExport(pub(crate) Vec<u8>);

impl Kept for IpcExport {
    fn keep(self) -> Registration {
        Registration::CudaIpc(self)
    }

    fn find(kept: &Registration) -> Option<&Self> {
        match kept {
            Registration::CudaIpc(e) => Some(e),
            _ => None,
        }
    }
}
