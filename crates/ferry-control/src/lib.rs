//! Ferry's control plane: hands [`RdmaMetadata`] from the worker that
//! exposes memory to the worker that moves it, over NATS, HTTP or etcd.
//!
//! The reference (Dynamo's NIXL Connect) leaves this "secondary channel" to
//! the application, "most likely HTTP or TCP+NATS". The shape here is the
//! one a disaggregated prefill → decode pair uses: both workers already know
//! a key for the hand-over (the request id the router gave both). The
//! exposing worker **publishes** its operation's metadata under that key;
//! the other worker **fetches** it, with a deadline, and starts its read or
//! write. The publication lasts until its [`Publication`] guard is dropped
//! (typically when the operation completes), and fetching is idempotent, so
//! a reader whose connection broke simply asks again.
//!
//! - NATS ([`NatsChannel`]): request/reply on the subject
//!   `{prefix}.{key}` (default prefix [`DEFAULT_PREFIX`]). Each publication
//!   subscribes to its own subject, so a key nobody publishes is answered at
//!   once by the server's "no responders". The client reconnects by itself
//!   when the server restarts, and publications are re-subscribed.
//! - HTTP ([`HttpServer`], [`HttpClient`]): `GET /ferry/v1/metadata/{key}`
//!   answers `200` with the metadata, or `404`. HTTP/1.1, no TLS.
//! - etcd ([`EtcdStore`], the store NIXL and Dynamo use): the metadata is
//!   stored under `{prefix}/{key}` (default prefix [`DEFAULT_ETCD_PREFIX`])
//!   through etcd's v3 JSON gateway (`http://host:2379`, etcd 3.4 or
//!   later), on a lease the publisher keeps alive: withdrawn, it is
//!   deleted; if the publisher dies, etcd deletes it when the lease runs
//!   out ([`DEFAULT_LEASE_TTL`]). A key already in etcd is never
//!   overwritten.
//!
//! The metadata is a capability: whoever gets it can read or write the
//! exposed memory, and whoever makes a fetcher accept its own metadata
//! feeds it bytes. So, with the deployment's secret ([`Config::secret`] or
//! `FERRY_SECRET`, the connector's), a fetch proves it holds the secret, the
//! publisher answers only such fetches, with the metadata encrypted and
//! authenticated for that one request (XChaCha20-Poly1305 under a key
//! derived from the secret), and a fetch refuses every other answer
//! ([`Error::Forged`]) and goes on waiting for the real one. Without a
//! secret, an [`HttpServer`] binds only loopback addresses and a
//! [`NatsChannel`] or an [`EtcdStore`] publishes only to a server it
//! reaches over loopback, unless the network is declared trusted ([`Config::trusted_network`],
//! `FERRY_CONTROL_TRUSTED_NETWORK=1`): [`Error::UntrustedNetwork`]. HTTP
//! bearer tokens (`FERRY_CONTROL_TOKEN`), NATS credentials
//! (`FERRY_NATS_*`) and etcd users (`FERRY_ETCD_USER`,
//! `FERRY_ETCD_PASSWORD`) keep out those without them. etcd is a store,
//! not a publisher that answers each fetch, so there the secret seals the
//! value once, bound to its etcd key: whoever reads etcd without the
//! secret learns nothing usable, and a fetch accepts only a value sealed
//! with the secret for that key. See [`Config`] and
//! `docs/security.md`, "The control plane".
//!
//! A fetch waits until the deadline for the key to appear and for the server
//! to be reachable, then fails with the last cause it saw
//! ([`Error::NotFound`], [`Error::NoServer`], [`Error::ServerGone`], else
//! [`Error::Timeout`]). Replies are bounded by
//! [`MAX_METADATA_JSON`](ferry_proto::MAX_METADATA_JSON) and validated.
//!
//! A prefill worker exposes its KV cache and publishes the metadata; a
//! decode worker (normally another process, that knows the server's address
//! and the request id) fetches it and reads:
//!
//! ```
//! use std::time::Duration;
//! use ferry::{Connector, Descriptor};
//! use ferry_control::{HttpClient, HttpServer};
//!
//! # #[tokio::main]
//! # async fn main() -> anyhow::Result<()> {
//! // Prefill: expose, then publish under the request id.
//! let prefill = Connector::new().await?;
//! let kv = vec![7u8; 1 << 20];
//! let readable = prefill.create_readable(vec![Descriptor::from_vec(kv)]).await?;
//! let server = HttpServer::bind("127.0.0.1:0").await?;
//! let published = server.publish("req-42", readable.metadata())?;
//!
//! // Decode: fetch within 5 s (asking again while the key or the server is
//! // not there yet), then read.
//! let decode = Connector::new().await?;
//! let client = HttpClient::new(server.local_addr().to_string());
//! let remote = client.fetch("req-42", Duration::from_secs(5)).await?;
//! let dst = vec![Descriptor::from_vec(vec![0u8; 1 << 20])];
//! let read = decode.begin_read(&remote, dst).await?;
//! read.wait_for_completion().await?;
//! readable.wait_for_completion().await?;
//! drop(published); // withdrawn: later fetches get Error::NotFound
//! # Ok(()) }
//! ```
//!
//! Over NATS the two sides share a server instead:
//! `NatsChannel::connect("nats://host:4222", deadline)`, then
//! `channel.publish(key, metadata).await?` on one side and
//! `channel.fetch(key, deadline).await?` on the other; through etcd,
//! `EtcdStore::connect("http://host:2379", deadline)`, then
//! `store.publish(key, metadata).await?` and `store.fetch(key, deadline).await?`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod catalog;
mod config;
mod error;
mod etcd;
mod etcd_gateway;
mod http;
mod http_client;
mod nats;
mod retry;
mod seal;

pub use catalog::Publication;
pub use config::{
    Config, ETCD_PASSWORD_ENV, ETCD_USER_ENV, MIN_SECRET, NATS_CREDS_ENV, NATS_NKEY_ENV,
    NATS_PASSWORD_ENV, NATS_TOKEN_ENV, NATS_USER_ENV, SECRET_ENV, TOKEN_ENV, TRUSTED_NETWORK_ENV,
};
pub use error::{Error, Result};
pub use etcd::{EtcdStore, DEFAULT_ETCD_PREFIX, DEFAULT_LEASE_TTL, MAX_VALUE_BYTES};
pub use ferry_proto::RdmaMetadata;
pub use http::{
    HttpServer, CONNECTION_LIFETIME, FIRST_BYTE_TIMEOUT, HEADER_TIMEOUT, HTTP_PATH, MAX_CONNECTIONS,
};
pub use http_client::HttpClient;
pub use nats::NatsChannel;

/// The NATS subject prefix used unless [`NatsChannel::with_prefix`] says
/// otherwise: metadata for key `k` is requested on `ferry.metadata.k`.
pub const DEFAULT_PREFIX: &str = "ferry.metadata";

/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 128;

/// Checks that `key` can name metadata: 1 to [`MAX_KEY_LEN`] characters from
/// `A-Z a-z 0-9 _ -`.
pub fn validate_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "it is empty"
    } else if key.len() > MAX_KEY_LEN {
        "it is longer than 128 bytes"
    } else if !key.bytes().all(token_byte) {
        "it has a character outside A-Z a-z 0-9 _ -"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey {
        key: key.chars().take(64).collect(),
        reason,
    })
}

/// Checks that `prefix` can start NATS subjects: tokens of `A-Z a-z 0-9 _ -`
/// separated by dots.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let valid = !prefix.is_empty()
        && prefix
            .split('.')
            .all(|t| !t.is_empty() && t.bytes().all(token_byte));
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidPrefix {
            prefix: prefix.chars().take(64).collect(),
        })
    }
}

fn token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for ok in ["a", "req-42", "A_b-9", &"k".repeat(128)] {
            validate_key(ok).unwrap();
        }
        for bad in ["", "a.b", "a b", "*", ">", "a/b", "é", &"k".repeat(129)] {
            assert!(
                matches!(validate_key(bad), Err(Error::InvalidKey { .. })),
                "{bad}"
            );
        }
    }
}
