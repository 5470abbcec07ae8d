//! Ferry moves memory between the workers of a distributed inference graph.
//!
//! A worker creates a [`Connector`]. To let a remote worker read local
//! memory it creates a [`ReadableOperation`] over [`Descriptor`]s and hands
//! the operation's [`RdmaMetadata`] (JSON) to the remote through any side
//! channel; the remote starts a [`ReadOperation`] with it. Writing works the
//! same way with a [`WritableOperation`] and a [`WriteOperation`]. Both sides
//! learn of completion, failure and cancellation.
//!
//! For many small transfers between the same two workers, a standing
//! [`Grant`] over a [`Pool`] lets the remote read and write blocks by index,
//! one-sidedly, with no handshake per transfer, until it is revoked (see
//! [`grant`] and `docs/grants.md`).
//!
//! ```
//! use ferry::{Connector, Descriptor, OperationStatus};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> ferry::Result<()> {
//! let prefill = Connector::builder().listen("127.0.0.1:0".parse().unwrap()).build().await?;
//! let decode = Connector::builder().listen("127.0.0.1:0".parse().unwrap()).build().await?;
//!
//! // Prefill exposes a buffer...
//! let readable = prefill.create_readable(vec![Descriptor::from_vec(vec![7u8; 4096])]).await?;
//! let json = readable.metadata().to_json(); // send this to the decode worker
//!
//! // ...and decode reads it.
//! let remote = ferry::RdmaMetadata::from_json(&json)?;
//! let read = decode.begin_read(&remote, vec![Descriptor::from_vec(vec![0u8; 4096])]).await?;
//! read.wait_for_completion().await?;
//! readable.wait_for_completion().await?;
//! assert_eq!(readable.status(), OperationStatus::Complete);
//! let bufs = read.into_descriptors();
//! assert!(bufs[0].as_slice().unwrap().iter().all(|&b| b == 7));
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod auth;
mod builder;
pub mod config;
mod connector;
pub mod cuda;
mod descriptor;
mod error;
mod exposure;
pub mod grant;
mod host;
mod hugemem;
mod kind;
pub mod metrics;
mod op;
mod operation;
mod outcome;
mod pool;
mod regcache;
mod region;
mod sync;
mod transport;

pub use builder::DEFAULT_LIVENESS;
pub use builder::{
    per_group_cap, unproven_cap, ConnectorBuilder, DEFAULT_CMA_THRESHOLD, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, DEFAULT_MAX_CONNECTIONS, DEFAULT_STRIPE_THRESHOLD,
    DEFAULT_TCP_STREAMS, MIN_SECRET,
};
pub use config::LIVENESS_ENV;
pub use config::{
    ADMISSION_PREFIXES_ENV, CMA_THREADS_ENV, CMA_THRESHOLD_ENV, DIGEST_ENV, IDLE_TIMEOUT_ENV,
    MAX_CONNECTIONS_ENV, METRICS_ADDR_ENV, SECRET_ENV, STRIPE_THRESHOLD_ENV, TCP_STREAMS_ENV,
    TRANSPORTS_ENV, UCX_EMULATED_RMA_ENV, UCX_STRICT_REGISTRATION_ENV, UCX_TRUSTED_NETWORK_ENV,
};
pub use connector::{Connector, Scope};
pub use descriptor::Descriptor;
pub use error::{Error, PeerMisbehaved, Result};
pub use ferry_proto::session::Violation;
pub use ferry_proto::wire::{AbortReason, WireError};
pub use ferry_proto::{
    Device, DeviceKind, MetadataError, OperationKind, OperationStatus, ParseDeviceError,
    RdmaMetadata,
};
pub use grant::{
    BlockRange, BlockRef, Grant, GrantError, GrantLane, GrantMetadata, GrantOptions, Notification,
    NotificationKind, Offer, OfferMetadata, OfferOptions, RemoteGrant, Rights,
};
pub use kind::TransportKind;
pub use op::{ReadOperation, ReadableOperation, WritableOperation, WriteOperation};
pub use operation::Operation;
pub use pool::{BlockView, Pool, PoolError};

/// Cross-memory attach, the primitive under [`TransportKind::Cma`].
pub mod cross_memory {
    pub use crate::transport::cma::{copy_from_process, copy_ranges_from_process, CHUNK};
}

/// UCX, the backend under [`TransportKind::Ucx`], loaded at run time.
pub mod ucx {
    /// The environment variable that lets this process move CUDA memory
    /// through UCX (`1`; see [`moves_cuda`]).
    pub use crate::config::UCX_CUDA_ENV as CUDA_ENV;

    /// The UCX this process loaded (library, version, the transports it
    /// found), or why there is none (no `libucp`, too old, failed to start).
    /// Finds the library as `docs/transports.md` says (`FERRY_UCX_LIB`,
    /// the system's, the PyPI `libucx-cu12`/`-cu13` packages).
    ///
    /// ```
    /// match ferry::ucx::status() {
    ///     Ok(found) => println!("{found}"),
    ///     Err(why) => println!("no UCX: {why}"),
    /// }
    /// ```
    pub fn status() -> Result<String, String> {
        crate::transport::ucx::ucx()
            .map(|u| u.describe())
            .map_err(str::to_string)
    }

    /// How many memory ranges this process has registered with UCX and not
    /// yet unregistered (a remote key works only while its range is
    /// registered). For tests and diagnostics.
    pub fn registrations() -> usize {
        crate::transport::ucx::mem::live()
    }

    /// How many memory ranges this process has registered with UCX in all.
    pub fn registrations_made() -> usize {
        crate::transport::ucx::mem::made()
    }

    /// Whether this process lends and pulls CUDA device memory through
    /// UCX: [`CUDA_ENV`] is `1`, its UCX lists CUDA memory among the
    /// memory types it moves (a UCX built with CUDA, such as PyPI's
    /// `libucx-cu12`), and a CUDA driver that sees a device is here. An
    /// operation's device memory goes through UCX only where both
    /// processes say so in their handshake; elsewhere it is staged through
    /// host memory. On one H100 (2026-11-24) this moved device memory
    /// correctly (`tests/gpu_ucx.rs`) but about 500 times slower than CUDA
    /// IPC between two processes of one host, for a reason not yet found
    /// (`docs/gpu.md`).
    ///
    /// ```
    /// if !ferry::ucx::moves_cuda() {
    ///     println!("GPU memory moves by CUDA IPC or staged, not through UCX");
    /// }
    /// ```
    pub fn moves_cuda() -> bool {
        crate::transport::ucx::moves_cuda()
    }

    /// The environment variable that names the `libucp` to load.
    pub const LIB_ENV: &str = crate::config::UCX_LIB_ENV;

    /// Raw UCX, for `ferry bench`'s in-run baseline: a buffer registered and
    /// lent ([`Lent`](baseline::Lent)), its offer (worker address and packed
    /// key) sent to another process by the caller, which times
    /// `ucp_get_nbx` of it ([`Getter`](baseline::Getter)), with the same
    /// UCX context, workers and endpoints as the backend and no Ferry
    /// protocol. Not a stable API.
    #[doc(hidden)]
    pub mod baseline {
        pub use crate::transport::ucx::raw::{Getter, Lent, Node};
    }
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
