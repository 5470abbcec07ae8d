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
    /// Both processes offered CUDA IPC in the attach exchange (each has a
    /// CUDA driver that sees a device): device memory may be lent. A
    /// passive session learns it in the attach exchange: the peer's offer
    /// from its first `Attach`, this side's from
    /// [`attach_offered`](super::Session::attach_offered).
    pub cuda_ipc: bool,
    /// Both sides' UCX moves CUDA memory, and UCX was set up on this
    /// connection: device memory may be lent through it (GPUDirect RDMA
    /// where a NIC reaches the GPU, UCX's CUDA IPC on one host). A
    /// passive session learns it in the `Rdma` exchange: the peer's from
    /// its offer, this side's from
    /// [`rdma_answered`](super::Session::rdma_answered).
    pub ucx_cuda: bool,
}

impl Caps {
    /// Device memory may be lent on this connection: by CUDA IPC, or
    /// through UCX.
    pub fn lends_device(&self) -> bool {
        self.cuda_ipc || self.ucx_cuda
    }
}
