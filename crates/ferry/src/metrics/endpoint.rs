//! The scrape endpoint: `GET /metrics` over HTTP/1.1 on an address of the
//! process's choosing, serving every live connector that asked for that
//! address. It runs on a thread of its own (a small Tokio runtime), so that
//! it outlives the runtime of the connector that started it and costs the
//! connectors nothing between scrapes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::sync::lock;
use ferry_proto::slots::{Admission, SlotId, Slots};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::task::AbortHandle;

use super::store::Metrics;

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen for metrics scrapes on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The endpoint's thread or runtime could not start.
    #[error("cannot start the metrics endpoint: {0}")]
    Start(std::io::Error),
}

/// A connector's place at an endpoint: it is served while the connector
/// holds this (its operations may hold the metrics a little longer).
pub(crate) struct Listing(Arc<Metrics>);

type Served = Arc<Mutex<Vec<Weak<Listing>>>>;

struct Endpoint {
    requested: SocketAddr,
    bound: SocketAddr,
    served: Served,
}

static ENDPOINTS: Mutex<Vec<Endpoint>> = Mutex::new(Vec::new());

/// At most this many connections at once. When all are taken, a new one
/// takes the place of the oldest that has not sent its request yet; only
/// when every one is being served is a new one closed at once.
const MAX_SCRAPES: usize = 16;
/// A scrape that has not sent the first byte of its request by then is
/// dropped.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(1);
/// A scrape that has not sent its request head by then is dropped.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Nor may a connection live longer than this.
const CONN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the endpoint listens, from `FERRY_METRICS_ADDR`: `IP:PORT`, or a
/// port alone (`9464` or `:9464`), which means loopback (`127.0.0.1`):
/// other hosts reach the endpoint only when an address says so.
pub(crate) fn parse_addr(value: &str) -> Option<SocketAddr> {
    let v = value.trim();
    if let Ok(a) = v.parse() {
        return Some(a);
    }
    let port: u16 = v.strip_prefix(':').unwrap_or(v).parse().ok()?;
    Some(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)))
}

/// Serves `metrics` at `addr` (a port of 0 picks one), starting the
/// endpoint unless this process already serves that address. Returns the
/// bound address.
pub(crate) fn serve(
    metrics: &Arc<Metrics>,
    addr: SocketAddr,
) -> Result<(SocketAddr, Arc<Listing>), ServeError> {
    let listing = Arc::new(Listing(metrics.clone()));
    let mut endpoints = lock(&ENDPOINTS);
    if addr.port() != 0 {
        if let Some(e) = endpoints
            .iter()
            .find(|e| e.requested == addr || e.bound == addr)
        {
            lock(&e.served).push(Arc::downgrade(&listing));
            return Ok((e.bound, listing));
        }
    }
    let bind = |source| ServeError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let bound = listener.local_addr().map_err(bind)?;
    let served: Served = Arc::new(Mutex::new(vec![Arc::downgrade(&listing)]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(ServeError::Start)?;
    let s = served.clone();
    std::thread::Builder::new()
        .name("ferry-metrics".into())
        .spawn(move || rt.block_on(run(listener, s)))
        .map_err(ServeError::Start)?;
    tracing::debug!(addr = %bound, "metrics endpoint started");
    endpoints.push(Endpoint {
        requested: addr,
        bound,
        served,
    });
    Ok((bound, listing))
}

type Places = Arc<Mutex<Slots<AbortHandle>>>;

async fn run(listener: std::net::TcpListener, served: Served) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("metrics endpoint stopped: {e}");
            return;
        }
    };
    // Accept first, then find a place: silent connections give theirs to
    // newer ones, so they cannot keep a scrape waiting.
    let places: Places = Arc::new(Mutex::new(Slots::new(MAX_SCRAPES)));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors, say: wait, then go on.
                tracing::debug!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut table = lock(&places);
        let Admission::Admitted { id, evicted } = table.admit() else {
            continue; // Every place is serving a scrape: drop this one.
        };
        let task = tokio::spawn(scrape(stream, id, places.clone(), served.clone()));
        table.attach(id, task.abort_handle());
        drop(table);
        if let Some(silent) = evicted {
            silent.abort();
        }
    }
}

/// Frees a connection's place when its task ends, however it ends.
struct Leave(Places, SlotId);

impl Drop for Leave {
    fn drop(&mut self) {
        lock(&self.0).remove(self.1);
    }
}

async fn scrape(stream: tokio::net::TcpStream, id: SlotId, places: Places, served: Served) {
    let _leave = Leave(places.clone(), id);
    let mut first = [0u8; 1];
    match tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return, // Silent, closed or broken.
    }
    let service = hyper::service::service_fn(move |req| {
        lock(&places).serving(id);
        let served = served.clone();
        async move { Ok::<_, Infallible>(respond(&req, &served)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(CONN_TIMEOUT, conn).await;
}

fn respond(req: &Request<Incoming>, served: &Served) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ty: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(ty),
        );
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "text/plain", "try /metrics\n".into());
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    let snaps = {
        let mut served = lock(served);
        served.retain(|w| w.strong_count() > 0);
        served
            .iter()
            .filter_map(Weak::upgrade)
            .map(|l| l.0.snapshot())
            .collect()
    };
    reply(
        StatusCode::OK,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        super::encode::render(snaps),
    )
}
