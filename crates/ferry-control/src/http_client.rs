//! The hand-over over HTTP/1.1: the fetching side.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_proto::{RdmaMetadata, MAX_METADATA_JSON};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{AUTHORIZATION, HOST, WWW_AUTHENTICATE};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::config::{Auth, Config};
use crate::http::{hex_encode, HTTP_PATH, PROOF_HEADER, SECRET_SCHEME};
use crate::retry::until_deadline;
use crate::seal::{looks_sealed, Scope, SEAL_OVERHEAD};
use crate::{validate_key, Error, Result};

/// Fetches metadata from an [`HttpServer`](crate::HttpServer).
#[derive(Clone, Debug)]
pub struct HttpClient {
    /// `host:port`.
    authority: String,
    /// The configuration, or why it is invalid (told at each fetch).
    auth: std::result::Result<Arc<Auth>, String>,
}

impl HttpClient {
    /// A client of the server at `endpoint`: `host:port`, or
    /// `http://host:port` (a trailing `/` is ignored), configured from the
    /// environment ([`Config::new`]); an invalid environment (a secret too
    /// short, say) fails each fetch with [`Error::Config`].
    pub fn new(endpoint: impl Into<String>) -> HttpClient {
        let auth = Config::new().resolve().map(Arc::new).map_err(|e| match e {
            Error::Config(m) => m,
            e => e.to_string(),
        });
        HttpClient {
            authority: authority(endpoint.into()),
            auth,
        }
    }

    /// A client of the server at `endpoint` with `config`.
    pub fn with_config(endpoint: impl Into<String>, config: &Config) -> Result<HttpClient> {
        Ok(HttpClient {
            authority: authority(endpoint.into()),
            auth: Ok(Arc::new(config.resolve()?)),
        })
    }

    fn auth(&self) -> Result<Arc<Auth>> {
        self.auth.clone().map_err(Error::Config)
    }

    /// The metadata published under `key`, asking again (server not up yet,
    /// key not published yet, connection lost) until `deadline` has passed.
    /// With a secret, an answer that is not sealed for this request (forged,
    /// replayed, or not from a holder of the secret) is refused and the
    /// fetch asks again, until the deadline.
    pub async fn fetch(&self, key: &str, deadline: Duration) -> Result<RdmaMetadata> {
        validate_key(key)?;
        let auth = self.auth()?;
        until_deadline(
            deadline,
            "fetching metadata over HTTP",
            auth.keys.is_some(),
            |_| self.fetch_once(&auth, key),
        )
        .await
    }

    /// One request, no retry (but still bounded by `deadline`).
    pub async fn fetch_once_within(&self, key: &str, deadline: Duration) -> Result<RdmaMetadata> {
        validate_key(key)?;
        let auth = self.auth()?;
        match tokio::time::timeout(deadline, self.fetch_once(&auth, key)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                waited: deadline,
                during: "fetching metadata over HTTP",
            }),
        }
    }

    async fn fetch_once(&self, auth: &Auth, key: &str) -> Result<RdmaMetadata> {
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
        let scope = Scope {
            channel: "http",
            name: key,
        };
        let mut req = Request::get(format!("{HTTP_PATH}{key}")).header(HOST, &self.authority);
        if let Some(token) = &auth.token {
            req = req.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let mut challenge = None;
        if let Some(keys) = &auth.keys {
            let (ch, proof) = keys.prove(scope);
            req = req.header(PROOF_HEADER, hex_encode(&proof));
            challenge = Some(ch);
        }
        let req = req
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
        let scheme = resp
            .headers()
            .get(WWW_AUTHENTICATE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let limit = MAX_METADATA_JSON + SEAL_OVERHEAD;
        let announced = hyper::body::Body::size_hint(resp.body()).lower();
        if announced > limit as u64 {
            return Err(Error::BadReply {
                endpoint: endpoint(),
                detail: format!("a body of {announced} bytes, more than {limit}"),
            });
        }
        let body = Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    Error::BadReply {
                        endpoint: endpoint(),
                        detail: format!("a body larger than {limit} bytes"),
                    }
                } else {
                    gone(e.to_string())
                }
            })?
            .to_bytes();
        drop(conn);
        let said = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        match status {
            StatusCode::OK => match (&auth.keys, challenge) {
                (Some(keys), Some(ch)) => {
                    let json = keys.open(scope, &ch, &body).map_err(|r| Error::Forged {
                        endpoint: endpoint(),
                        detail: r.describe("the answer"),
                    })?;
                    Ok(RdmaMetadata::from_json_bytes(&json)?)
                }
                _ if looks_sealed(&body) => Err(Error::SecretRequired {
                    endpoint: endpoint(),
                    detail: "it sent the metadata sealed with a secret".into(),
                }),
                _ => Ok(RdmaMetadata::from_json_bytes(&body)?),
            },
            StatusCode::NOT_FOUND => Err(Error::NotFound {
                key: key.into(),
                waited: Duration::ZERO,
            }),
            StatusCode::UNAUTHORIZED if scheme.starts_with(SECRET_SCHEME) => {
                Err(Error::SecretRequired {
                    endpoint: endpoint(),
                    detail: said().trim_end().to_owned(),
                })
            }
            StatusCode::UNAUTHORIZED => Err(Error::Unauthorized {
                endpoint: endpoint(),
                detail: said().trim_end().to_owned(),
            }),
            s => Err(Error::Refused {
                endpoint: endpoint(),
                status: s.as_u16(),
                reason: said(),
            }),
        }
    }
}

fn authority(endpoint: String) -> String {
    endpoint
        .strip_prefix("http://")
        .unwrap_or(&endpoint)
        .trim_end_matches('/')
        .to_owned()
}

struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
