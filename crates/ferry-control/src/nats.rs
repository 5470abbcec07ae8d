//! The hand-over over NATS: request/reply on `{prefix}.{key}`.

use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::connection::State;
use async_nats::{ConnectErrorKind, ConnectOptions};
use bytes::Bytes;
use ferry_proto::RdmaMetadata;
use futures_util::StreamExt;

type Slot = Mutex<Option<async_nats::Subscriber>>;

fn lock(slot: &Slot) -> MutexGuard<'_, Option<async_nats::Subscriber>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

use crate::catalog::{Catalog, Publication};
use crate::retry::until_deadline;
use crate::{validate_key, Error, Result, DEFAULT_PREFIX};

/// The longest one request waits before it is sent again (a request written
/// to a connection that then broke is lost; the next goes to the new one).
const ATTEMPT: Duration = Duration::from_secs(1);
/// How long `publish` waits for the server to acknowledge the subscription.
const FLUSH: Duration = Duration::from_secs(2);

/// One worker's NATS connection, for publishing metadata, fetching it, or
/// both. Cloning shares the connection.
///
/// The client reconnects by itself when the server goes away (within a
/// second of its return) and subscribes its publications again.
#[derive(Clone)]
pub struct NatsChannel {
    client: async_nats::Client,
    prefix: String,
    catalog: Catalog,
    url: String,
}

impl NatsChannel {
    /// Connects to the NATS server at `url` (`nats://host:4222`, or a comma
    /// separated list), waiting up to `deadline` for it to accept.
    pub async fn connect(url: &str, deadline: Duration) -> Result<NatsChannel> {
        let client = until_deadline(deadline, "connecting to NATS", |left| async move {
            let options = ConnectOptions::new()
                .connection_timeout(left)
                .request_timeout(Some(ATTEMPT))
                .reconnect_delay_callback(|n| {
                    Duration::from_millis((10u64 << n.min(7) as u32).min(1000))
                })
                .event_callback(|event| async move {
                    tracing::debug!(%event, "control plane: NATS event");
                });
            options.connect(url).await.map_err(|e| {
                let endpoint = url.to_owned();
                let detail = e.to_string();
                match e.kind() {
                    ConnectErrorKind::Io
                    | ConnectErrorKind::TimedOut
                    | ConnectErrorKind::Dns
                    | ConnectErrorKind::MaxReconnects => Error::NoServer { endpoint, detail },
                    ConnectErrorKind::ServerParse => Error::NoServer {
                        endpoint,
                        detail: format!("not a NATS URL: {detail}"),
                    },
                    _ => Error::Nats(format!("{url}: {detail}")),
                }
            })
        })
        .await?;
        Ok(Self::from_client(client, url))
    }

    /// Uses a connection the application already has; `url` only names it
    /// in errors.
    pub fn from_client(client: async_nats::Client, url: &str) -> NatsChannel {
        NatsChannel {
            client,
            prefix: DEFAULT_PREFIX.into(),
            catalog: Catalog::default(),
            url: url.into(),
        }
    }

    /// Uses the subject prefix `prefix` instead of [`DEFAULT_PREFIX`]: both
    /// sides must use the same.
    pub fn with_prefix(mut self, prefix: &str) -> Result<NatsChannel> {
        crate::validate_prefix(prefix)?;
        self.prefix = prefix.into();
        Ok(self)
    }

    /// The connection, to use it for other things too.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    fn subject(&self, key: &str) -> String {
        format!("{}.{key}", self.prefix)
    }

    /// Answers requests for `key` with `metadata` until the returned guard is
    /// dropped. Returns once the server has the subscription (or, if the
    /// server is away, once it is queued for when the client reconnects).
    pub async fn publish(&self, key: &str, metadata: &RdmaMetadata) -> Result<Publication> {
        validate_key(key)?;
        let json = metadata.to_json();
        self.catalog.insert(key, String::new())?;
        let sub = match self.client.subscribe(self.subject(key)).await {
            Ok(s) => s,
            Err(e) => {
                self.catalog.remove(key);
                return Err(Error::Nats(format!("cannot subscribe: {e}")));
            }
        };
        match tokio::time::timeout(FLUSH, self.client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "control plane: NATS flush failed"),
            Err(_) => tracing::warn!("control plane: NATS server slow to take a subscription"),
        }
        // The subscriber sits in a slot that the guard empties on drop: no
        // request is answered after that, and the client unsubscribes (a
        // moment later: a fetch racing the withdrawal may go unanswered).
        let slot = Arc::new(Mutex::new(Some(sub)));
        let client = self.client.clone();
        let json = Bytes::from(json);
        let polled = slot.clone();
        tokio::spawn(async move {
            let next = || {
                poll_fn(|cx| match lock(&polled).as_mut() {
                    Some(sub) => sub.poll_next_unpin(cx),
                    None => Poll::Ready(None),
                })
            };
            while let Some(msg) = next().await {
                let Some(reply) = msg.reply else { continue };
                if let Err(e) = client.publish(reply, json.clone()).await {
                    tracing::warn!(error = %e, "control plane: cannot answer a NATS request");
                }
            }
        });
        let catalog = self.catalog.clone();
        let owned = key.to_owned();
        // The subscriber's drop spawns its unsubscription: give it the
        // runtime, wherever the guard is dropped (a Python finalizer, say).
        let runtime = tokio::runtime::Handle::current();
        Ok(Publication::new(key, move || {
            let _entered = runtime.enter();
            drop(lock(&slot).take());
            catalog.remove(&owned);
        }))
    }

    /// The metadata published under `key`, asking again (nobody publishes it
    /// yet, the server is away) until `deadline` has passed.
    pub async fn fetch(&self, key: &str, deadline: Duration) -> Result<RdmaMetadata> {
        validate_key(key)?;
        let subject = self.subject(key);
        until_deadline(deadline, "fetching metadata over NATS", |left| {
            self.request(&subject, key, left.min(ATTEMPT))
        })
        .await
    }

    async fn request(&self, subject: &str, key: &str, timeout: Duration) -> Result<RdmaMetadata> {
        let request = async_nats::Request::new().timeout(Some(timeout));
        match self.client.send_request(subject.to_owned(), request).await {
            Ok(msg) => Ok(RdmaMetadata::from_json_bytes(&msg.payload)?),
            Err(e) => Err(match e.kind() {
                RequestErrorKind::NoResponders => Error::NotFound {
                    key: key.into(),
                    waited: Duration::ZERO,
                },
                _ if self.client.connection_state() != State::Connected => Error::ServerGone {
                    endpoint: self.url.clone(),
                    detail: "disconnected from the NATS server (reconnecting)".into(),
                },
                RequestErrorKind::TimedOut => Error::Timeout {
                    waited: timeout,
                    during: "waiting for the publisher's NATS reply",
                },
                RequestErrorKind::Other => Error::ServerGone {
                    endpoint: self.url.clone(),
                    detail: e.to_string(),
                },
            }),
        }
    }
}

impl std::fmt::Debug for NatsChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsChannel")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("published", &self.catalog.len())
            .finish()
    }
}
