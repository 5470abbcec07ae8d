//! Why a lane could not lend or pull: typed, so that the caller decides
//! from the value (and the lane's declared failure scope), never from a
//! string or from which lane failed.

use ferry_proto::lane::LaneId;

/// Why a lane failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LaneError {
    /// The source went away: its process exited or runs another program,
    /// its endpoint failed (`detail`).
    #[error("the source went away: {detail}")]
    SourceGone { detail: String },
    /// The destination is device memory, which this lane does not write.
    #[error(
        "the destination is device memory, which this backend does not write: GPU memory \
         is lent only by CUDA IPC between processes of one host, or through a UCX that moves \
         CUDA memory on both sides"
    )]
    NotHostMemory,
    /// The destination is memory this lane does not pull into (`detail`).
    #[error("the destination is memory this lane does not write: {detail}")]
    Destination { detail: String },
    /// The lease names memory the source did not lend (`detail`).
    #[error("the source lent no such memory: {detail}")]
    NotLent { detail: String },
    /// The lease is longer than the destination, or does not match its
    /// descriptors one for one.
    #[error("lease larger than the destination")]
    LeaseTooLarge,
    /// The lease does not match the destination's descriptors.
    #[error("the lease does not match the descriptors")]
    LeaseMismatch,
    /// The lease cannot be read (`detail`): bad keys, handles, addresses.
    #[error("bad lease: {detail}")]
    BadLease { detail: String },
    /// Registering (pinning, exporting) the memory failed (`detail`).
    #[error("{0}")]
    Registration(String),
    /// The copy itself failed (`detail`): a system call, a get, a driver
    /// copy.
    #[error("{detail}")]
    Copy { detail: String },
    /// A cancel met copies that the source did not finish in time, and
    /// the lane recalled them by tearing down its link to the peer (UCX:
    /// the endpoint, force-closed): the lane is gone on that connection,
    /// which must end (`detail` says why).
    #[error("{detail}")]
    Recalled { detail: String },
    /// The peer lent by a lane this side did not set up with it
    /// (`detail` says which and why).
    #[error("{detail}")]
    NotOffered { lane: LaneId, detail: String },
}
