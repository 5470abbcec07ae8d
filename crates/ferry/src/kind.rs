//! The ways bytes can move, as callers name them.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

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
    /// UCX (RDMA, or CUDA transports), loaded at run time: the destination's
    /// owner gets what the source lent with `ucp_get_nbx`, set up and fenced
    /// over the TCP connection. By default used only where UCX has an RDMA
    /// or CUDA transport (faster than Ferry's own paths); named explicitly
    /// (`FERRY_TRANSPORTS=ucx,tcp`, or the builder), used wherever both
    /// workers have it, and required: without a loadable `libucp` the
    /// connector does not start. See `docs/transports.md`.
    Ucx,
    /// Same host, other process, GPU memory: the destination's owner copies
    /// what the source lent by CUDA IPC (`cuIpcOpenMemHandle`, then
    /// device-to-device or device-to-host copies), set up and fenced over
    /// the TCP connection on which cross-memory attach was set up (that
    /// probe proves the peer is a process of this host). Operations report
    /// it; it is not named in `FERRY_TRANSPORTS` (not in [`ALL`](Self::ALL)):
    /// it comes with `cma`, wherever CUDA is available. See `docs/gpu.md`.
    CudaIpc,
    /// A TCP connection between the two connectors: works between any two
    /// workers that can reach each other.
    Tcp,
}

impl TransportKind {
    /// Every transport this build has that can be named (in
    /// `FERRY_TRANSPORTS` and the builder), best first. [`CudaIpc`](Self::CudaIpc)
    /// comes with `cma`.
    pub const ALL: &'static [TransportKind] = &[
        TransportKind::Local,
        TransportKind::Cma,
        TransportKind::Ucx,
        TransportKind::Tcp,
    ];

    /// The name used in `FERRY_TRANSPORTS` and reports.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Local => "local",
            TransportKind::Cma => "cma",
            TransportKind::Ucx => "ucx",
            TransportKind::CudaIpc => "cuda-ipc",
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
