//! Small things every part of the TCP driver uses.

use std::sync::OnceLock;
use std::time::Duration;

pub(super) use crate::sync::lock;
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Operations up to this size go out in one write: header, payload and end.
pub(super) const SMALL: u64 = 64 * 1024;
/// Larger ones are sent in chunks of this size, so that concurrent operations
/// on one connection take turns.
pub(super) const CHUNK: u32 = 2 * 1024 * 1024;
/// How long a new connection may take to say hello.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most control frames a connection may have waiting to be sent.
pub(super) const MAX_QUEUED: usize = 4096;

/// Tunes a new socket: no Nagle delay, keep-alive probes.
pub(super) fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
    let sock = socket2::SockRef::from(s);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(1))
        .with_retries(5);
    let _ = sock.set_tcp_keepalive(&ka);
}

/// The instant [`now_ms`] counts from.
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// Milliseconds since the first call, on a monotonic clock.
pub(super) fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The instant that [`now_ms`] gave as `ms`.
pub(super) fn at_ms(ms: u64) -> std::time::Instant {
    epoch() + Duration::from_millis(ms)
}

/// Waits until the watched value satisfies `f` (or its sender is gone).
pub(super) async fn until<T>(rx: &mut watch::Receiver<T>, f: impl FnMut(&T) -> bool) {
    let _ = rx.wait_for(f).await;
}
