//! etcd's v3 JSON gateway (`POST /v3/...` over HTTP/1.1, base64 keys and
//! values): one call, its reply bounded and sorted into the control plane's
//! errors. The store itself is in `etcd.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use ferry_proto::MAX_METADATA_JSON;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::config::EtcdUser;
use crate::seal::SEAL_OVERHEAD;
use crate::{Error, Result};

/// The largest reply read: a range reply with the largest sealed metadata,
/// base64-encoded, and room for etcd's header.
pub(crate) const MAX_REPLY: usize = (MAX_METADATA_JSON + SEAL_OVERHEAD) / 3 * 4 + (64 << 10);

/// The longest authentication token accepted from etcd.
const MAX_TOKEN: usize = 4096;

/// The etcd cluster's gateway endpoints and this side's login.
pub(crate) struct Gateway {
    /// `host:port` of each endpoint.
    endpoints: Vec<String>,
    /// The endpoint tried first (the last that answered).
    first: AtomicUsize,
    user: Option<EtcdUser>,
    /// The token etcd gave `user`, once authenticated.
    token: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gateway {
    /// `endpoints`: `http://host:port` or `host:port`, comma-separated.
    pub(crate) fn new(endpoints: &str, user: Option<EtcdUser>) -> Result<Gateway> {
        let mut list = Vec::new();
        for e in endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let authority = e.strip_prefix("http://").unwrap_or(e).trim_end_matches('/');
            if authority.contains("://") || authority.contains('/') || authority.is_empty() {
                return Err(Error::Config(format!(
                    "{e:?} is not an etcd endpoint this client can use: give http://host:port \
                     (etcd's JSON gateway, without TLS)"
                )));
            }
            list.push(authority.to_owned());
        }
        if list.is_empty() {
            return Err(Error::Config("no etcd endpoint given".into()));
        }
        Ok(Gateway {
            endpoints: list,
            first: AtomicUsize::new(0),
            user,
            token: Mutex::new(None),
        })
    }

    /// The endpoints, for errors and `Debug`.
    pub(crate) fn name(&self) -> String {
        self.endpoints.join(",")
    }

    pub(crate) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// `POST {path}` with `body`, logged in as the configured user (asking
    /// for a new token once if etcd no longer takes the one it gave).
    pub(crate) async fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let Some(user) = &self.user else {
            return self.post(path, body, None).await;
        };
        let mut renewed = false;
        loop {
            let cached = lock(&self.token).clone();
            let token = match cached {
                Some(t) => t,
                None => {
                    renewed = true;
                    let t = self.authenticate(user).await?;
                    *lock(&self.token) = Some(t.clone());
                    t
                }
            };
            match self.post(path, body, Some(&token)).await {
                Err(Error::Unauthorized { detail, .. })
                    if !renewed && detail.contains("invalid auth token") =>
                {
                    // Expired (etcd's simple tokens last minutes): once more.
                    let mut t = lock(&self.token);
                    if t.as_deref() == Some(&token) {
                        *t = None;
                    }
                }
                r => return r,
            }
        }
    }

    async fn authenticate(&self, user: &EtcdUser) -> Result<String> {
        let reply = self
            .post(
                "/v3/auth/authenticate",
                &json!({"name": user.name, "password": user.password}),
                None,
            )
            .await?;
        match reply.get("token").and_then(Value::as_str) {
            Some(t)
                if !t.is_empty()
                    && t.len() <= MAX_TOKEN
                    && t.bytes().all(|b| b.is_ascii_graphic()) =>
            {
                Ok(t.to_owned())
            }
            Some(_) => Err(self.bad_reply("an authentication token that cannot be sent back")),
            None => Err(Error::Unauthorized {
                endpoint: self.name(),
                detail: "etcd gave no token: is authentication enabled there?".into(),
            }),
        }
    }

    /// One request, to the first endpoint that takes the connection.
    async fn post(&self, path: &str, body: &Value, token: Option<&str>) -> Result<Value> {
        let body = Bytes::from(body.to_string());
        let n = self.endpoints.len();
        let start = self.first.load(Ordering::Relaxed) % n;
        let mut last = None;
        for i in 0..n {
            let at = (start + i) % n;
            match post_to(&self.endpoints[at], path, body.clone(), token).await {
                Err(e @ Error::NoServer { .. }) => last = Some(e),
                r => {
                    self.first.store(at, Ordering::Relaxed);
                    return r;
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("no etcd endpoint given".into())))
    }

    fn bad_reply(&self, detail: &str) -> Error {
        Error::BadReply {
            endpoint: self.name(),
            detail: detail.into(),
        }
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password or the token.
        f.debug_struct("Gateway")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.is_some())
            .finish()
    }
}

async fn post_to(authority: &str, path: &str, body: Bytes, token: Option<&str>) -> Result<Value> {
    let endpoint = || format!("etcd at {authority}");
    let gone = |detail: String| Error::ServerGone {
        endpoint: endpoint(),
        detail,
    };
    let stream = TcpStream::connect(authority)
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
    let mut req = Request::post(path)
        .header(HOST, authority)
        .header(CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        req = req.header(AUTHORIZATION, t);
    }
    let req = req.body(Full::new(body)).map_err(|e| Error::NoServer {
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
    if announced > MAX_REPLY as u64 {
        return Err(Error::BadReply {
            endpoint: endpoint(),
            detail: format!("a body of {announced} bytes, more than {MAX_REPLY}"),
        });
    }
    let body = Limited::new(resp.into_body(), MAX_REPLY)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                Error::BadReply {
                    endpoint: endpoint(),
                    detail: format!("a body larger than {MAX_REPLY} bytes"),
                }
            } else {
                gone(e.to_string())
            }
        })?
        .to_bytes();
    drop(conn);
    classify(&endpoint(), path, status, &body)
}

/// The reply's JSON object, or the error it says.
pub(crate) fn classify(
    endpoint: &str,
    path: &str,
    status: StatusCode,
    body: &[u8],
) -> Result<Value> {
    // A streaming call (lease keep-alive) answers objects one after
    // another: the first is the answer.
    let parsed = serde_json::Deserializer::from_slice(body)
        .into_iter::<Value>()
        .next()
        .and_then(|v| v.ok());
    let said = || {
        String::from_utf8_lossy(&body[..body.len().min(200)])
            .trim_end()
            .to_owned()
    };
    let Some(Value::Object(mut reply)) = parsed else {
        return Err(match status {
            StatusCode::OK => Error::BadReply {
                endpoint: endpoint.into(),
                detail: format!("not a JSON object: {:?}", said()),
            },
            StatusCode::NOT_FOUND => Error::BadReply {
                endpoint: endpoint.into(),
                detail: format!(
                    "404 for POST {path}: not etcd's v3 JSON gateway (etcd 3.4 or later)"
                ),
            },
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Unauthorized {
                endpoint: endpoint.into(),
                detail: said(),
            },
            s => Error::Refused {
                endpoint: endpoint.into(),
                status: s.as_u16(),
                reason: said(),
            },
        });
    };
    // A stream's answer comes as {"result": ...} or {"error": ...}.
    if let Some(Value::Object(inner)) = reply.remove("result") {
        reply = inner;
    }
    let error = reply.get("error");
    if status == StatusCode::OK && error.is_none() {
        return Ok(Value::Object(reply));
    }
    let error = match error {
        Some(Value::Object(e)) => e,
        _ => &reply,
    };
    let code = error.get("code").and_then(Value::as_i64);
    let message: String = error
        .get("message")
        .or_else(|| error.get("error"))
        .and_then(Value::as_str)
        .unwrap_or("no message")
        .chars()
        .take(200)
        .collect();
    let has = |s: &str| message.contains(s);
    Err(
        if matches!(code, Some(7 | 16))
            || status == StatusCode::UNAUTHORIZED
            || has("authentication failed")
            || has("user name is empty")
            || has("invalid auth token")
            || has("permission denied")
        {
            Error::Unauthorized {
                endpoint: endpoint.into(),
                detail: format!(
                    "{message} (etcd user: FERRY_ETCD_USER and FERRY_ETCD_PASSWORD, or \
                     Config::etcd_user_and_password)"
                ),
            }
        } else if matches!(code, Some(4 | 14))
            || has("request timed out")
            || has("leader changed")
            || has("no leader")
            || has("too many requests")
        {
            Error::ServerGone {
                endpoint: endpoint.into(),
                detail: message,
            }
        } else {
            Error::Refused {
                endpoint: endpoint.into(),
                status: status.as_u16(),
                reason: message,
            }
        },
    )
}

/// Base64, as the gateway writes bytes.
pub(crate) fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// Bytes the gateway wrote as base64 (absent: empty, as the gateway omits
/// empty fields).
pub(crate) fn unb64(v: Option<&Value>) -> Option<Vec<u8>> {
    match v {
        None => Some(Vec::new()),
        Some(Value::String(s)) => BASE64.decode(s).ok(),
        Some(_) => None,
    }
}

/// A 64-bit integer the gateway wrote as a string (or a number; absent: 0).
pub(crate) fn int64(v: Option<&Value>) -> Option<i64> {
    match v {
        None => Some(0),
        Some(Value::String(s)) => s.parse().ok(),
        Some(Value::Number(n)) => n.as_i64(),
        Some(_) => None,
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sort(status: u16, body: &str) -> Result<Value> {
        classify(
            "etcd at x",
            "/v3/kv/range",
            StatusCode::from_u16(status).unwrap(),
            body.as_bytes(),
        )
    }

    #[test]
    fn replies_are_sorted_into_typed_errors() {
        assert!(sort(200, r#"{"header":{},"kvs":[]}"#).is_ok());
        let stream = r#"{"result":{"ID":"5","TTL":"10"}}"#;
        assert_eq!(sort(200, stream).unwrap()["TTL"], "10");
        for (status, body) in [
            (
                401,
                r#"{"error":"etcdserver: invalid auth token","code":16}"#,
            ),
            (
                400,
                r#"{"error":"etcdserver: user name is empty","message":"etcdserver: user name is empty","code":3}"#,
            ),
            (
                200,
                r#"{"error":{"code":7,"message":"etcdserver: permission denied"}}"#,
            ),
            (403, "forbidden"),
        ] {
            assert!(
                matches!(sort(status, body), Err(Error::Unauthorized { .. })),
                "{body}"
            );
        }
        for (status, body) in [
            (
                503,
                r#"{"error":"etcdserver: request timed out","code":14}"#,
            ),
            (500, r#"{"message":"etcdserver: leader changed","code":2}"#),
        ] {
            assert!(
                matches!(sort(status, body), Err(Error::ServerGone { .. })),
                "{body}"
            );
        }
        for (status, body) in [(200, ""), (200, "[1]"), (200, "<html>"), (404, "Not Found")] {
            assert!(
                matches!(sort(status, body), Err(Error::BadReply { .. })),
                "{body}"
            );
        }
        let e = sort(
            400,
            r#"{"error":"etcdserver: request is too large","code":3}"#,
        );
        assert!(
            matches!(e, Err(Error::Refused { status: 400, .. })),
            "{e:?}"
        );
        assert!(matches!(
            sort(502, "bad gateway"),
            Err(Error::Refused { status: 502, .. })
        ));
    }

    #[test]
    fn fields_decode_or_say_no() {
        assert_eq!(unb64(Some(&json!(b64(b"ab")))).unwrap(), b"ab");
        assert_eq!(unb64(None).unwrap(), b"");
        assert!(unb64(Some(&json!("!!"))).is_none());
        assert!(unb64(Some(&json!(3))).is_none());
        assert_eq!(int64(Some(&json!("-7"))), Some(-7));
        assert_eq!(int64(Some(&json!(7))), Some(7));
        assert_eq!(int64(None), Some(0));
        assert_eq!(int64(Some(&json!("x"))), None);
        assert!(Gateway::new("https://a:1", None).is_err());
        assert!(Gateway::new(" , ", None).is_err());
        let g = Gateway::new("http://a:1/, b:2", None).unwrap();
        assert_eq!(g.endpoints(), ["a:1", "b:2"]);
    }
}
