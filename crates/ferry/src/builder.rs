//! [`ConnectorBuilder`]: a connector's configuration and its defaults
//! (the environment variables that set them, and their resolution, are in
//! [`config`](crate::config); [`Connector`](crate::Connector)'s `build`
//! lives beside the connector).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::auth::Secret;
use crate::kind::TransportKind;

/// Connections with no operation in progress for this long are closed, by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub use crate::transport::admission::{
    per_group_cap, unproven_cap, DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, DEFAULT_MAX_CONNECTIONS,
};
/// The liveness bound by default (see [`ConnectorBuilder::liveness`]).
pub const DEFAULT_LIVENESS: Duration = ferry_proto::session::liveness::DEFAULT_BOUND;
/// The shortest shared secret accepted, in bytes.
pub const MIN_SECRET: usize = 16;

/// Configures a [`Connector`](crate::Connector).
///
/// ```no_run
/// # async fn f() -> ferry::Result<()> {
/// let c = ferry::Connector::builder()
///     .worker_id("prefill-0")
///     .listen("127.0.0.1:0".parse().unwrap())
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConnectorBuilder {
    pub(crate) worker_id: Option<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) advertise: Option<Vec<SocketAddr>>,
    pub(crate) transports: Option<Vec<TransportKind>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) secret: Option<Secret>,
    pub(crate) cma_threshold: Option<u64>,
    pub(crate) tcp_streams: Option<usize>,
    pub(crate) stripe_threshold: Option<u64>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) admission_prefixes: Option<(u8, u8)>,
    pub(crate) metrics_addr: Option<SocketAddr>,
    pub(crate) ucx_trusted_network: Option<bool>,
    pub(crate) digest: Option<bool>,
    pub(crate) ucx_emulated_rma: Option<bool>,
    pub(crate) ucx_strict_registration: Option<bool>,
    pub(crate) liveness: Option<Duration>,
}

/// TCP streams per transfer to another host, by default.
pub const DEFAULT_TCP_STREAMS: usize = 4;
/// TCP transfers of at least this many bytes are striped, by default.
pub const DEFAULT_STRIPE_THRESHOLD: u64 = 8 << 20;

/// Transfers of at least this many bytes use cross-memory attach by default.
pub const DEFAULT_CMA_THRESHOLD: u64 = 64 * 1024;

impl Default for ConnectorBuilder {
    fn default() -> Self {
        ConnectorBuilder {
            worker_id: None,
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            advertise: None,
            transports: None,
            connect_timeout: Duration::from_secs(5),
            secret: None,
            cma_threshold: None,
            tcp_streams: None,
            stripe_threshold: None,
            idle_timeout: None,
            max_connections: None,
            admission_prefixes: None,
            metrics_addr: None,
            ucx_trusted_network: None,
            digest: None,
            ucx_emulated_rma: None,
            ucx_strict_registration: None,
            liveness: None,
        }
    }
}

impl ConnectorBuilder {
    /// This worker's id (default: 32 random hexadecimal digits).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Where to listen (default `0.0.0.0:0`: all interfaces, an ephemeral port).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// The addresses written into metadata (default: the listen address, or
    /// when listening on all interfaces, this host's name's addresses and
    /// loopback).
    pub fn advertise(mut self, addrs: Vec<SocketAddr>) -> Self {
        self.advertise = Some(addrs);
        self
    }

    /// Restricts the transports (default: `FERRY_TRANSPORTS` if set, else all).
    pub fn transports(mut self, t: &[TransportKind]) -> Self {
        self.transports = Some(t.to_vec());
        self
    }

    /// A secret shared by the deployment's workers (default: `FERRY_SECRET`
    /// if set, else none). With one, every TCP connection starts with a
    /// Noise handshake keyed by the secret (`Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`)
    /// that proves in both directions that the peer knows it, before any
    /// operation is served; afterwards every frame and payload byte is
    /// encrypted and authenticated under keys bound to that handshake, so
    /// that nobody on the path can read, alter or inject any of it. Workers
    /// without the secret, or with another, are refused with
    /// [`Error::Unauthenticated`](crate::Error::Unauthenticated). Use at least [`MIN_SECRET`] (16) random
    /// bytes; shorter ones are refused.
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.secret = Some(Secret::new(secret.as_ref()));
        self
    }

    /// The smallest transfer (all descriptors together) that goes by
    /// cross-memory attach when that is possible (default
    /// [`DEFAULT_CMA_THRESHOLD`]). Smaller ones travel inside the control
    /// connection's frames, which is faster for them: a READ by attach needs
    /// one more round trip. 0 sends everything by attach. Without this
    /// call, `FERRY_CMA_THRESHOLD` is read.
    pub fn cma_threshold(mut self, bytes: u64) -> Self {
        self.cma_threshold = Some(bytes);
        self
    }

    /// Into how many TCP streams (connections) a large transfer is split
    /// (at most [`MAX_PARTS`](ferry_proto::wire::MAX_PARTS); 1 never
    /// splits). One TCP stream rarely fills a fast link between two hosts:
    /// its window and the single core that feeds it limit it. Transfers of
    /// at least [`stripe_threshold`](Self::stripe_threshold) bytes that go
    /// over TCP are cut into this many contiguous parts, each sent on a
    /// connection of its own, and complete when every part has landed.
    ///
    /// Without this call, `FERRY_TCP_STREAMS` is read; without either,
    /// transfers to another host use [`DEFAULT_TCP_STREAMS`] and transfers on
    /// one host (loopback, where striping only adds work) use one. A value
    /// set here or in the environment applies to every remote.
    pub fn tcp_streams(mut self, n: usize) -> Self {
        self.tcp_streams = Some(n);
        self
    }

    /// The smallest TCP transfer (all descriptors together) that is split
    /// over several streams (default [`DEFAULT_STRIPE_THRESHOLD`]; see
    /// [`tcp_streams`](Self::tcp_streams)). Without this call,
    /// `FERRY_STRIPE_THRESHOLD` is read.
    pub fn stripe_threshold(mut self, bytes: u64) -> Self {
        self.stripe_threshold = Some(bytes);
        self
    }

    /// Closes a connection (either direction) that has carried no live
    /// operation for this long (default [`DEFAULT_IDLE_TIMEOUT`]; without
    /// this call, `FERRY_IDLE_TIMEOUT` in seconds is read). Frames that
    /// belong to no live operation do not count: a connection kept busy
    /// with them is closed all the same. The next operation to that remote
    /// reconnects. A pooled connection idle for half of it is replaced
    /// rather than used, so give both sides the same value.
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = Some(d);
        self
    }

    /// The liveness bound: on a connection that carries an operation in
    /// progress (either direction), a peer from which nothing at all has
    /// arrived for this long — not a byte, not a heartbeat — is taken for
    /// stopped or unreachable (a `SIGSTOP`, a long GC pause, a wedged
    /// driver, a cut link): every operation of the connection ends, on
    /// this side with [`Error::PeerUnresponsive`](crate::Error::PeerUnresponsive),
    /// on the peer's (where it can still hear) with
    /// [`AbortReason::PeerUnresponsive`](crate::AbortReason::PeerUnresponsive),
    /// and the connection closes. Default [`DEFAULT_LIVENESS`] (1.5 s);
    /// zero turns it off; without this call, `FERRY_LIVENESS_MS` (in
    /// milliseconds, `0`: off) is read.
    ///
    /// While an operation is in progress each side sends a heartbeat (an
    /// empty frame, answered at once by the peer's runtime, never by a
    /// thread that copies) when it has sent nothing for a quarter of the
    /// bound. A connection with no operation in progress has no timer at
    /// all: idle connections cost nothing. Give both sides the same
    /// value; a bound much below 100 ms mistakes scheduling delays on a
    /// loaded host for a dead peer (the smallest taken is 20 ms, the
    /// largest a day).
    pub fn liveness(mut self, bound: Duration) -> Self {
        self.liveness = Some(bound);
        self
    }

    /// How many accepted connections this connector keeps at most (default
    /// [`DEFAULT_MAX_CONNECTIONS`]; without this call,
    /// `FERRY_MAX_CONNECTIONS` is read). Of them, at most an eighth
    /// ([`unproven_cap`], at least 16) may be connections that never
    /// presented a valid capability, and at most half of those
    /// ([`per_group_cap`]) from one network (see
    /// [`admission_prefixes`](Self::admission_prefixes)). Beyond a bound a
    /// connection that carries no live operation is closed to make room:
    /// first one that did not authenticate with the [`secret`](Self::secret),
    /// then one of the most crowded network, then the oldest. A connection
    /// that carries a live operation is never closed to make room; when
    /// every one does, a new connection is refused.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = Some(n);
        self
    }

    /// The prefix lengths of the networks by which the listener groups
    /// peers' addresses for its bounds on new connections (default
    /// [`DEFAULT_IPV4_PREFIX`] = 24 and [`DEFAULT_IPV6_PREFIX`] = 64;
    /// without this call, `FERRY_ADMISSION_PREFIXES=V4,V6` is read). A
    /// flood of connections from one network then only evicts connections
    /// of that network (see [`max_connections`](Self::max_connections)).
    /// Shorter prefixes group more widely (an attacker that holds a whole
    /// IPv6 `/48` is contained by 48); 32 and 128 group by single address.
    /// At most 32 and 128.
    pub fn admission_prefixes(mut self, v4: u8, v6: u8) -> Self {
        self.admission_prefixes = Some((v4, v6));
        self
    }

    /// Whether UCX may be set up on a connection that did not authenticate
    /// with a [`secret`](Self::secret) (default: `FERRY_UCX_TRUSTED_NETWORK=1`,
    /// else no).
    ///
    /// UCX parses the worker address and the remote keys a peer sends
    /// without defending against crafted bytes: a peer that can reach this
    /// worker's port could crash its process with one bad address. So by
    /// default UCX is only set up between workers that proved they hold the
    /// deployment's secret; elsewhere the bytes go by cross-memory attach
    /// or TCP. Say `true` only where every host that can reach the port is
    /// trusted (an isolated cluster network).
    pub fn ucx_trusted_network(mut self, trusted: bool) -> Self {
        self.ucx_trusted_network = Some(trusted);
        self
    }

    /// Whether every byte of each operation is digested on both sides and
    /// compared before the operation completes (default: `FERRY_DIGEST=1`,
    /// else no).
    ///
    /// On, this side sends a CRC-32 of the bytes it sent (in band) or of
    /// what landed (a copy from lent memory), and requires one from the
    /// peer before it completes: a difference ends the operation on both
    /// sides with [`Error::DigestMismatch`](crate::Error::DigestMismatch),
    /// and the destination's memory is never reported complete. It costs
    /// one pass of the CPU over the bytes on each side (see
    /// `docs/security.md`, "Integrity"); device memory that the CPU never
    /// touches (CUDA IPC, UCX into GPU memory) is not checked. Turn it on
    /// on both sides: a side with it on refuses a peer that sends no
    /// digest (the connection closes with
    /// [`Violation::MissingDigest`](crate::Violation::MissingDigest)).
    pub fn digest(mut self, on: bool) -> Self {
        self.digest = Some(on);
        self
    }

    /// Whether UCX may carry operations over an endpoint that has no RMA
    /// transport (default: `FERRY_UCX_EMULATED_RMA=1`, else no).
    ///
    /// Without one (UCX over TCP, or over shared memory, as UCX 1.13 picks
    /// it), UCX emulates each get with messages that the **source's**
    /// process answers by copying from its own memory, at whatever address
    /// the request names. That is slower than Ferry's own paths, lets a
    /// peer read any address of the source process, and a get still queued
    /// when the source's memory is released (a cancel) makes the source
    /// copy from freed memory. So by default such an endpoint is declined
    /// and the bytes go by cross-memory attach or TCP; the tests say `true`
    /// to run the UCX backend on machines without RDMA.
    pub fn ucx_emulated_rma(mut self, allowed: bool) -> Self {
        self.ucx_emulated_rma = Some(allowed);
        self
    }

    /// Whether memory lent over UCX is registered per operation even where
    /// it belongs to a [`Pool`](crate::Pool) (default:
    /// `FERRY_UCX_STRICT_REGISTRATION=1`, else no).
    ///
    /// By default the blocks of a pool are lent under one registration of
    /// the whole pool, made the first time the pool is lent and kept until
    /// the pool is dropped: no registration cost per operation, but a peer
    /// that received a lease of the pool holds a remote key that grants
    /// the **whole pool**, for as long as it lives (on transports that
    /// check keys: RDMA). Strict registration registers exactly the blocks
    /// of each operation and unregisters them when the operation's last
    /// lease ends, so a key grants those bytes only until then; plain
    /// descriptors are always registered that way. For the NIC to forget
    /// a key at once too, UCX's InfiniBand registration cache must be off:
    /// the environment variable does that when it is set before UCX starts
    /// in the process (or set `UCX_IB_REG_METHODS=direct` yourself). See
    /// `docs/transports.md`, "Registration".
    pub fn ucx_strict_registration(mut self, strict: bool) -> Self {
        self.ucx_strict_registration = Some(strict);
        self
    }

    /// Serves this connector's metrics for Prometheus at
    /// `http://ADDR/metrics` (OpenMetrics text; see `docs/metrics.md`).
    /// Without this call `FERRY_METRICS_ADDR` is read; without either, no
    /// endpoint runs ([`Connector::metrics`](crate::Connector::metrics)
    /// works all the same). Connectors of one process that name the same
    /// address share one endpoint, told apart by their `worker` label; a
    /// port of 0 picks a free one
    /// ([`Connector::metrics_addr`](crate::Connector::metrics_addr) tells
    /// which). An address that cannot be bound fails `build` when set here,
    /// and is only logged when it comes from the environment.
    pub fn metrics_addr(mut self, addr: SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// How long to try each address of a remote (default 5 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
}
