//! The names of the environment variables that configure Ferry, and the
//! builder setting each one stands in for: the one list of every knob.

/// The environment variable that restricts transports, e.g. `FERRY_TRANSPORTS=tcp`.
pub const TRANSPORTS_ENV: &str = "FERRY_TRANSPORTS";
/// The environment variable that holds the deployment's shared secret.
pub const SECRET_ENV: &str = "FERRY_SECRET";
/// The environment variable that sets [`ConnectorBuilder::cma_threshold`](crate::ConnectorBuilder::cma_threshold) (bytes).
pub const CMA_THRESHOLD_ENV: &str = "FERRY_CMA_THRESHOLD";
/// The environment variable that sets how many threads of a process may copy
/// one cross-memory pull of 8 MiB or more at once (its own and helpers
/// shared by every pull of the process; `1`: no helpers). Read once per
/// process; default: the host's cores, up to 4.
pub const CMA_THREADS_ENV: &str = "FERRY_CMA_THREADS";
/// The environment variable that sets [`ConnectorBuilder::tcp_streams`](crate::ConnectorBuilder::tcp_streams).
pub const TCP_STREAMS_ENV: &str = "FERRY_TCP_STREAMS";
/// The environment variable that sets [`ConnectorBuilder::stripe_threshold`](crate::ConnectorBuilder::stripe_threshold) (bytes).
pub const STRIPE_THRESHOLD_ENV: &str = "FERRY_STRIPE_THRESHOLD";
/// The environment variable that sets [`ConnectorBuilder::idle_timeout`](crate::ConnectorBuilder::idle_timeout) (seconds).
pub const IDLE_TIMEOUT_ENV: &str = "FERRY_IDLE_TIMEOUT";
/// The environment variable that sets [`ConnectorBuilder::liveness`](crate::ConnectorBuilder::liveness)
/// (milliseconds; `0`: off).
pub const LIVENESS_ENV: &str = "FERRY_LIVENESS_MS";
/// The environment variable that sets [`ConnectorBuilder::max_connections`](crate::ConnectorBuilder::max_connections).
pub const MAX_CONNECTIONS_ENV: &str = "FERRY_MAX_CONNECTIONS";
/// The environment variable that sets [`ConnectorBuilder::admission_prefixes`](crate::ConnectorBuilder::admission_prefixes):
/// the IPv4 and the IPv6 prefix length, e.g. `FERRY_ADMISSION_PREFIXES=24,64`.
pub const ADMISSION_PREFIXES_ENV: &str = "FERRY_ADMISSION_PREFIXES";
/// The environment variable that sets [`ConnectorBuilder::metrics_addr`](crate::ConnectorBuilder::metrics_addr):
/// `IP:PORT`, or a port alone for loopback (`FERRY_METRICS_ADDR=9464`
/// serves `127.0.0.1:9464`; name an address, `10.0.0.5:9464`, to be
/// scraped from other hosts).
pub const METRICS_ADDR_ENV: &str = "FERRY_METRICS_ADDR";
/// The environment variable that, set to `1`, lets UCX emulate gets where
/// it has no RMA transport (see [`ConnectorBuilder::ucx_emulated_rma`](crate::ConnectorBuilder::ucx_emulated_rma)).
pub const UCX_EMULATED_RMA_ENV: &str = "FERRY_UCX_EMULATED_RMA";
/// The environment variable that, set to `1`, registers every lent range
/// with UCX per operation, pools included (see
/// [`ConnectorBuilder::ucx_strict_registration`](crate::ConnectorBuilder::ucx_strict_registration));
/// when UCX starts in a process for a connector that registers strictly
/// (by this variable or by the builder), UCX's own InfiniBand registration
/// cache is turned off too.
pub const UCX_STRICT_REGISTRATION_ENV: &str = "FERRY_UCX_STRICT_REGISTRATION";
/// The environment variable that, set to `1`, sets UCX up on connections
/// that are not authenticated (see [`ConnectorBuilder::ucx_trusted_network`](crate::ConnectorBuilder::ucx_trusted_network)).
pub const UCX_TRUSTED_NETWORK_ENV: &str = "FERRY_UCX_TRUSTED_NETWORK";
/// The environment variable that lets this process move CUDA memory
/// through UCX (`1`). Opt-in: on one H100 (2026-11-24) the path moved
/// device memory correctly but about 500 times slower than CUDA IPC
/// between two processes of one host (`docs/gpu.md`).
pub const UCX_CUDA_ENV: &str = "FERRY_UCX_CUDA";
/// The environment variable that names the `libucp` to load (a file, or the
/// directory holding it).
pub const UCX_LIB_ENV: &str = "FERRY_UCX_LIB";
/// The environment variable that names the CUDA driver library to load.
pub const CUDA_LIB_ENV: &str = "FERRY_CUDA_LIB";
/// The environment variable that bounds how long a cross-memory attach
/// probe may take, in milliseconds (default 10,000).
pub const CMA_PROBE_TIMEOUT_ENV: &str = "FERRY_CMA_PROBE_TIMEOUT_MS";
/// The environment variable that bounds how many open files of the claimed
/// process a cross-memory attach probe examines (default 1,024).
pub const CMA_PROBE_FILES_ENV: &str = "FERRY_CMA_PROBE_FILES";
/// The environment variable that turns on lanes that are off by default,
/// by name, comma-separated (default: none).
pub const LANES_ON_ENV: &str = "FERRY_LANES_ON";

/// The environment variable that sets [`ConnectorBuilder::digest`](crate::ConnectorBuilder::digest):
/// `1` (or `crc32`, the one algorithm) digests every byte of each operation
/// on both sides and compares before it completes; `0`: off (the default).
pub const DIGEST_ENV: &str = "FERRY_DIGEST";

/// The builder method that sets the knob `name` (an environment variable
/// above), if one does.
pub(crate) fn builder_method(name: &str) -> Option<&'static str> {
    Some(match name {
        TRANSPORTS_ENV => "transports",
        SECRET_ENV => "secret",
        CMA_THRESHOLD_ENV => "cma_threshold",
        TCP_STREAMS_ENV => "tcp_streams",
        STRIPE_THRESHOLD_ENV => "stripe_threshold",
        IDLE_TIMEOUT_ENV => "idle_timeout",
        MAX_CONNECTIONS_ENV => "max_connections",
        ADMISSION_PREFIXES_ENV => "admission_prefixes",
        METRICS_ADDR_ENV => "metrics_addr",
        UCX_EMULATED_RMA_ENV => "ucx_emulated_rma",
        UCX_STRICT_REGISTRATION_ENV => "ucx_strict_registration",
        UCX_TRUSTED_NETWORK_ENV => "ucx_trusted_network",
        LIVENESS_ENV => "liveness",
        DIGEST_ENV => "digest",
        _ => return None,
    })
}
