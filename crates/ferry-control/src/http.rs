//! The hand-over over HTTP/1.1: a small server on the exposing side (the
//! client is in `http_client.rs`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use ferry_proto::slots::{Admission, SlotId, Slots};
use ferry_proto::RdmaMetadata;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle, JoinSet};

use crate::catalog::{Catalog, Publication};
use crate::config::{token_matches, Auth, Config, TRUSTED_NETWORK_ENV};
use crate::seal::Scope;
use crate::{validate_key, Error, Result};

/// The path under which the server answers: `GET {HTTP_PATH}{key}`.
pub const HTTP_PATH: &str = "/ferry/v1/metadata/";

/// The request header that carries a fetch's proof of the secret (hex).
pub(crate) const PROOF_HEADER: &str = "ferry-proof";
/// The `WWW-Authenticate` scheme of a refusal for want of the secret.
pub(crate) const SECRET_SCHEME: &str = "Ferry-Secret";

/// Connections a server keeps at once. When all are taken, a new one takes
/// the place of the oldest that has not sent a complete request yet; only
/// when every one is being served is a new one closed at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a client may take to send the first byte of its request.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a client may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection (one request: no keep-alive) may stay open.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

type Places = Arc<Mutex<Slots<AbortHandle>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Shared {
    catalog: Catalog,
    auth: Auth,
}

/// An HTTP server that answers `GET /ferry/v1/metadata/{key}` with the
/// metadata published under `key` (`200`), or `404`. With a secret it
/// answers only requests that prove the secret (else `401`), with the
/// metadata sealed for that request; with a bearer token only requests
/// that present it (else `401`). It stops when dropped.
pub struct HttpServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Listens on `addr` (`"127.0.0.1:0"` picks a free port) and serves on
    /// the current Tokio runtime, configured from the environment
    /// ([`Config::new`]).
    pub async fn bind(addr: &str) -> Result<HttpServer> {
        Self::bind_with(addr, &Config::new()).await
    }

    /// Listens on `addr` with `config`. Without a secret, an address that
    /// is not loopback (`0.0.0.0` included) is refused with
    /// [`Error::UntrustedNetwork`] unless the network is declared trusted.
    pub async fn bind_with(addr: &str, config: &Config) -> Result<HttpServer> {
        let auth = config.resolve()?;
        let bind_err = |source| Error::Bind {
            addr: addr.into(),
            source,
        };
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr)
            .await
            .map_err(bind_err)?
            .collect();
        if let Some(open) = addrs.iter().find(|a| !auth.may_serve_on(a.ip())) {
            return Err(Error::UntrustedNetwork {
                addr: open.to_string(),
                env: TRUSTED_NETWORK_ENV,
            });
        }
        let listener = TcpListener::bind(&addrs[..]).await.map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let shared = Arc::new(Shared {
            catalog: Catalog::default(),
            auth,
        });
        let task = tokio::spawn(serve(listener, shared.clone()));
        tracing::debug!(%local, "control plane: HTTP server listening");
        Ok(HttpServer {
            addr: local,
            shared,
            task,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether it answers only fetches that prove the secret.
    pub fn has_secret(&self) -> bool {
        self.shared.auth.keys.is_some()
    }

    /// Publishes `metadata` under `key` until the returned guard is dropped.
    pub fn publish(&self, key: &str, metadata: &RdmaMetadata) -> Result<Publication> {
        validate_key(key)?;
        self.shared.catalog.insert(key, metadata.to_json())?;
        let catalog = self.shared.catalog.clone();
        let owned = key.to_owned();
        Ok(Publication::new(key, move || catalog.remove(&owned)))
    }

    /// How many keys are published now.
    pub fn published(&self) -> usize {
        self.shared.catalog.len()
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
            .field("published", &self.shared.catalog.len())
            .field("secret", &self.has_secret())
            .finish()
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let places: Places = Arc::new(Mutex::new(Slots::new(MAX_CONNECTIONS)));
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
        let mut table = lock(&places);
        let Admission::Admitted { id, evicted } = table.admit() else {
            continue; // Every place is serving a request: drop this one.
        };
        let handle = conns.spawn(connection(stream, id, places.clone(), shared.clone()));
        table.attach(id, handle);
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

async fn connection(stream: TcpStream, id: SlotId, places: Places, shared: Arc<Shared>) {
    let _leave = Leave(places.clone(), id);
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    match tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return, // Silent, closed or broken.
    }
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        lock(&places).serving(id);
        let answer = answer(&shared, &req);
        async move { Ok::<_, Infallible>(answer) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn unauthorized(scheme: &'static str, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = reply(StatusCode::UNAUTHORIZED, body);
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(scheme));
    r
}

fn answer(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
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
    let auth = &shared.auth;
    if let Some(token) = &auth.token {
        let presented = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        if !presented.is_some_and(|p| token_matches(p, token)) {
            return unauthorized(
                "Bearer realm=\"ferry-control\"",
                "send Authorization: Bearer <token> (FERRY_CONTROL_TOKEN)\n",
            );
        }
    }
    // With a secret, nothing about the key is told before the proof.
    let scope = Scope {
        channel: "http",
        name: key,
    };
    let challenge =
        match &auth.keys {
            None => None,
            Some(keys) => {
                let proof = req
                    .headers()
                    .get(PROOF_HEADER)
                    .and_then(|v| hex_decode(v.as_bytes()));
                match proof.map(|p| keys.check(scope, &p)) {
                    Some(Ok(challenge)) => Some(challenge),
                    _ => return unauthorized(
                        SECRET_SCHEME,
                        "this publisher answers only fetches that prove the deployment's secret\n",
                    ),
                }
            }
        };
    let Some(json) = shared.catalog.get(key) else {
        return reply(StatusCode::NOT_FOUND, "no metadata under this key\n");
    };
    let (body, kind) = match (&auth.keys, challenge) {
        (Some(keys), Some(ch)) => (
            Bytes::from(keys.seal(scope, &ch, json.as_bytes())),
            "application/octet-stream",
        ),
        _ => (Bytes::from(json.to_string()), "application/json"),
    };
    let mut r = reply(StatusCode::OK, body);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

pub(crate) fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn hex_decode(s: &[u8]) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 256 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_round_trips_and_refuses_junk() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(super::hex_encode(&b), "0001abff");
        assert_eq!(super::hex_decode(b"0001ABff").unwrap(), b);
        for bad in [&b"0"[..], b"0g", b"+1", &[b'0'; 258]] {
            assert!(super::hex_decode(bad).is_none());
        }
    }
}
