//! The hand-over over HTTP/1.1: a small server on the exposing side, a
//! client on the other.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_proto::{RdmaMetadata, MAX_METADATA_JSON};
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::catalog::{Catalog, Publication};
use crate::retry::until_deadline;
use crate::{validate_key, Error, Result};

/// The path under which the server answers: `GET {HTTP_PATH}{key}`.
pub const HTTP_PATH: &str = "/ferry/v1/metadata/";

/// Connections a server keeps at once; more are closed at once.
const MAX_CONNECTIONS: usize = 256;
/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may stay open, however busy.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// An HTTP server that answers `GET /ferry/v1/metadata/{key}` with the
/// metadata published under `key` (`200`, JSON), or `404`. It stops when
/// dropped.
pub struct HttpServer {
    addr: SocketAddr,
    catalog: Catalog,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Listens on `addr` (`"127.0.0.1:0"` picks a free port) and serves on
    /// the current Tokio runtime.
    pub async fn bind(addr: &str) -> Result<HttpServer> {
        let bind_err = |source| Error::Bind {
            addr: addr.into(),
            source,
        };
        let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let catalog = Catalog::default();
        let task = tokio::spawn(serve(listener, catalog.clone()));
        tracing::debug!(%local, "control plane: HTTP server listening");
        Ok(HttpServer {
            addr: local,
            catalog,
            task,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Publishes `metadata` under `key` until the returned guard is dropped.
    pub fn publish(&self, key: &str, metadata: &RdmaMetadata) -> Result<Publication> {
        validate_key(key)?;
        self.catalog.insert(key, metadata.to_json())?;
        let catalog = self.catalog.clone();
        let owned = key.to_owned();
        Ok(Publication::new(key, move || catalog.remove(&owned)))
    }

    /// How many keys are published now.
    pub fn published(&self) -> usize {
        self.catalog.len()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        // Ends the accept loop; its JoinSet ends every connection with it.
        self.task.abort();
    }
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("addr", &self.addr)
            .field("published", &self.catalog.len())
            .finish()
    }
}

async fn serve(listener: TcpListener, catalog: Catalog) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut conns = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(error = %e, "control plane: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue; // Too many connections: drop this one.
        };
        let catalog = catalog.clone();
        conns.spawn(async move {
            let _slot = slot;
            let _ = stream.set_nodelay(true);
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let answer = answer(&catalog, &req);
                async move { Ok::<_, Infallible>(answer) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
        });
    }
}

fn answer(catalog: &Catalog, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    if req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    let Some(key) = req.uri().path().strip_prefix(HTTP_PATH) else {
        return reply(
            StatusCode::NOT_FOUND,
            format!("use GET {HTTP_PATH}{{key}}\n"),
        );
    };
    if let Err(e) = validate_key(key) {
        return reply(StatusCode::BAD_REQUEST, format!("{e}\n"));
    }
    match catalog.get(key) {
        Some(json) => {
            let mut r = reply(StatusCode::OK, json.to_string());
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, "application/json".parse().expect("valid"));
            h.insert(CACHE_CONTROL, "no-store".parse().expect("valid"));
            r
        }
        None => reply(StatusCode::NOT_FOUND, "no metadata under this key\n".into()),
    }
}

/// Fetches metadata from an [`HttpServer`].
#[derive(Clone, Debug)]
pub struct HttpClient {
    /// `host:port`.
    authority: String,
}

impl HttpClient {
    /// A client of the server at `endpoint`: `host:port`, or
    /// `http://host:port` (a trailing `/` is ignored).
    pub fn new(endpoint: impl Into<String>) -> HttpClient {
        let endpoint: String = endpoint.into();
        let authority = endpoint
            .strip_prefix("http://")
            .unwrap_or(&endpoint)
            .trim_end_matches('/')
            .to_owned();
        HttpClient { authority }
    }

    /// The metadata published under `key`, asking again (server not up yet,
    /// key not published yet, connection lost) until `deadline` has passed.
    pub async fn fetch(&self, key: &str, deadline: Duration) -> Result<RdmaMetadata> {
        validate_key(key)?;
        until_deadline(deadline, "fetching metadata over HTTP", |_| {
            self.fetch_once(key)
        })
        .await
    }

    /// One request, no retry (but still bounded by `deadline`).
    pub async fn fetch_once_within(&self, key: &str, deadline: Duration) -> Result<RdmaMetadata> {
        validate_key(key)?;
        match tokio::time::timeout(deadline, self.fetch_once(key)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                waited: deadline,
                during: "fetching metadata over HTTP",
            }),
        }
    }

    async fn fetch_once(&self, key: &str) -> Result<RdmaMetadata> {
        let endpoint = || self.authority.clone();
        let gone = |detail: String| Error::ServerGone {
            endpoint: endpoint(),
            detail,
        };
        if self.authority.contains("://") {
            return Err(Error::NoServer {
                endpoint: endpoint(),
                detail: "only http:// endpoints are supported".into(),
            });
        }
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| Error::NoServer {
                endpoint: endpoint(),
                detail: e.to_string(),
            })?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| gone(e.to_string()))?;
        let conn = AbortOnDrop(tokio::spawn(conn));
        let req = Request::get(format!("{HTTP_PATH}{key}"))
            .header(HOST, &self.authority)
            .body(Empty::<Bytes>::new())
            .map_err(|e| Error::NoServer {
                endpoint: endpoint(),
                detail: format!("not a valid host:port ({e})"),
            })?;
        let resp = sender.send_request(req).await.map_err(|e| {
            if e.is_parse() || e.is_parse_status() {
                Error::BadReply {
                    endpoint: endpoint(),
                    detail: e.to_string(),
                }
            } else {
                gone(e.to_string())
            }
        })?;
        let status = resp.status();
        let announced = hyper::body::Body::size_hint(resp.body()).lower();
        if announced > MAX_METADATA_JSON as u64 {
            return Err(Error::BadReply {
                endpoint: endpoint(),
                detail: format!("a body of {announced} bytes, more than {MAX_METADATA_JSON}"),
            });
        }
        let body = Limited::new(resp.into_body(), MAX_METADATA_JSON)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    Error::BadReply {
                        endpoint: endpoint(),
                        detail: format!("a body larger than {MAX_METADATA_JSON} bytes"),
                    }
                } else {
                    gone(e.to_string())
                }
            })?
            .to_bytes();
        drop(conn);
        match status {
            StatusCode::OK => Ok(RdmaMetadata::from_json_bytes(&body)?),
            StatusCode::NOT_FOUND => Err(Error::NotFound {
                key: key.into(),
                waited: Duration::ZERO,
            }),
            s => Err(Error::Refused {
                endpoint: endpoint(),
                status: s.as_u16(),
                reason: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            }),
        }
    }
}

struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
