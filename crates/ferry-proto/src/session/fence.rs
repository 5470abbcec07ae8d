//! What the session asks of the memory behind a request ([`Fence`]) and
//! what it knows of the connection ([`Caps`]).

/// What the session asks of the memory behind a request. The driver's
/// fence answers: these change under the region's lock, on other threads.
pub trait Fence: Clone {
    /// Every byte and the final `Finish` are on their way (or copied): a
    /// cancel no longer changes the outcome.
    fn is_sealed(&self) -> bool;
    /// The region is open: nobody began to end the operation here.
    fn is_open(&self) -> bool;
    /// For part 0 of a striped transfer: every other part is done. True
    /// for a transfer that is not striped.
    fn can_commit(&self) -> bool;
    /// The memory may move in band (the default): host memory, or device
    /// (GPU) memory that this side stages through host memory. Memory that
    /// may not (device memory where this side cannot stage it) moves only
    /// by lending: a request over it that would move it in band is refused
    /// ([`device_refusal`](super::device_refusal)), and `Data` for it is a
    /// violation.
    fn moves_in_band(&self) -> bool {
        true
    }
    /// The memory is device (GPU) memory: it is lent only on a connection
    /// that lends device memory ([`Caps::lends_device`]). False by
    /// default.
    fn is_device(&self) -> bool {
        false
    }
}

/// What this side can do on the connection, known from the handshake.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Lending memory is enabled here: cross-memory attach, or an RDMA
    /// backend set up on this connection.
    pub attach: bool,
    /// This side proved it can copy from the peer (its lease may be taken).
    pub can_pull: bool,
    /// The peer proved it can copy from this side (this side may lend).
    pub peer_pulls: bool,
    /// The connection authenticated with a shared secret.
    pub secret: bool,
    /// Both sides move device memory by the lane their exchange set up
    /// (CUDA IPC offered by both with cross-memory attach; UCX that moves
    /// CUDA memory on both sides): device memory may be lent. Each side
    /// learns it when the lane's exchange settles
    /// ([`LaneProof::device`](super::LaneProof::device)).
    pub device: bool,
}

impl Caps {
    /// Device memory may be lent on this connection: by CUDA IPC, or
    /// through UCX.
    pub fn lends_device(&self) -> bool {
        self.device
    }
}
