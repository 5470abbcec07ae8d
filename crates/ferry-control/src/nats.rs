//! The hand-over over NATS: request/reply on `{prefix}.{key}`.

use std::future::poll_fn;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::{ConnectErrorKind, ConnectOptions, StatusCode};
use bytes::Bytes;
use ferry_proto::RdmaMetadata;
use futures_util::StreamExt;
use tokio::time::Instant;

type Slot = Mutex<Option<async_nats::Subscriber>>;

fn lock(slot: &Slot) -> MutexGuard<'_, Option<async_nats::Subscriber>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

use crate::catalog::{Catalog, Publication};
use crate::config::{is_loopback, Auth, Config, NatsAuth, TRUSTED_NETWORK_ENV};
use crate::retry::until_deadline;
use crate::seal::{looks_sealed, Challenge, Scope};
use crate::{validate_key, Error, Result, DEFAULT_PREFIX};

/// The longest one request waits before it is sent again (a request written
/// to a connection that then broke is lost; the next goes to the new one).
const ATTEMPT: Duration = Duration::from_secs(1);
/// How long `publish` waits for the server to acknowledge the subscription.
const FLUSH: Duration = Duration::from_secs(2);
/// What a publisher with a secret answers to a request that does not prove
/// it.
const REFUSAL: &[u8] =
    b"FCR1 this publisher answers only fetches that prove the deployment's secret";

/// One worker's NATS connection, for publishing metadata, fetching it, or
/// both. Cloning shares the connection.
///
/// The client reconnects by itself when the server goes away (within a
/// second of its return) and subscribes its publications again.
///
/// With a secret ([`Config::secret`], `FERRY_SECRET`), a fetch sends a
/// proof of the secret and listens to every answer until one is sealed for
/// it with the secret: any other client of the server may answer too, and
/// is ignored. A publisher answers only requests that prove the secret,
/// with the metadata sealed for that request, so that other clients of the
/// server, and whoever watches the subject, learn nothing usable.
#[derive(Clone)]
pub struct NatsChannel {
    client: async_nats::Client,
    prefix: String,
    catalog: Catalog,
    url: String,
    auth: Arc<Auth>,
}

fn with_credentials(options: ConnectOptions, nats: &NatsAuth) -> Result<ConnectOptions> {
    Ok(match nats {
        NatsAuth::None => options,
        NatsAuth::UserPassword(u, p) => options.user_and_password(u.clone(), p.clone()),
        NatsAuth::Token(t) => options.token(t.clone()),
        NatsAuth::NKey(seed) => options.nkey(seed.clone()),
        NatsAuth::CredsFile(path) => {
            let creds = std::fs::read_to_string(path).map_err(|e| {
                Error::Config(format!("cannot read the NATS credentials file {path}: {e}"))
            })?;
            options
                .credentials(&creds)
                .map_err(|e| Error::Config(format!("{path} is not a NATS credentials file: {e}")))?
        }
    })
}

impl NatsChannel {
    /// Connects to the NATS server at `url` (`nats://host:4222`, or a comma
    /// separated list), waiting up to `deadline` for it to accept;
    /// configured from the environment ([`Config::new`]).
    pub async fn connect(url: &str, deadline: Duration) -> Result<NatsChannel> {
        Self::connect_with(url, deadline, &Config::new()).await
    }

    /// Connects to `url` with `config` (the secret, NATS credentials).
    pub async fn connect_with(
        url: &str,
        deadline: Duration,
        config: &Config,
    ) -> Result<NatsChannel> {
        let auth = config.resolve()?;
        let nats = &auth.nats;
        let client = until_deadline(deadline, "connecting to NATS", false, |left| async move {
            let options = ConnectOptions::new()
                .connection_timeout(left)
                .request_timeout(Some(ATTEMPT))
                .reconnect_delay_callback(|n| {
                    Duration::from_millis((10u64 << n.min(7) as u32).min(1000))
                })
                .event_callback(|event| async move {
                    tracing::debug!(%event, "control plane: NATS event");
                });
            let options = with_credentials(options, nats)?;
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
                    ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                        Error::Unauthorized {
                            endpoint,
                            detail: format!(
                                "{detail} (NATS credentials: FERRY_NATS_USER and \
                                 FERRY_NATS_PASSWORD, FERRY_NATS_TOKEN, FERRY_NATS_NKEY or \
                                 FERRY_NATS_CREDS)"
                            ),
                        }
                    }
                    _ => Error::Nats(format!("{url}: {detail}")),
                }
            })
        })
        .await?;
        Ok(Self::with_auth(client, url, auth))
    }

    /// Uses a connection the application already has (its credentials are
    /// the client's); `url` only names it in errors.
    pub fn from_client(
        client: async_nats::Client,
        url: &str,
        config: &Config,
    ) -> Result<NatsChannel> {
        Ok(Self::with_auth(client, url, config.resolve()?))
    }

    fn with_auth(client: async_nats::Client, url: &str, auth: Auth) -> NatsChannel {
        NatsChannel {
            client,
            prefix: DEFAULT_PREFIX.into(),
            catalog: Catalog::default(),
            url: url.into(),
            auth: Arc::new(auth),
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

    /// Whether it seals what it publishes and accepts only sealed answers.
    pub fn has_secret(&self) -> bool {
        self.auth.keys.is_some()
    }

    fn subject(&self, key: &str) -> String {
        format!("{}.{key}", self.prefix)
    }

    /// Without a secret, publishes only to a server this process reaches
    /// over loopback (the server runs on this host), unless the network is
    /// declared trusted.
    fn check_network(&self) -> Result<()> {
        if self.auth.keys.is_some() || self.auth.trusted_network {
            return Ok(());
        }
        let seen_as = self.client.server_info().client_ip;
        match seen_as.parse::<IpAddr>() {
            Ok(ip) if is_loopback(ip) => Ok(()),
            _ => Err(Error::UntrustedNetwork {
                addr: format!(
                    "the NATS server at {} (it sees this client as {seen_as:?})",
                    self.url
                ),
                env: TRUSTED_NETWORK_ENV,
            }),
        }
    }

    /// Answers requests for `key` with `metadata` until the returned guard is
    /// dropped. Returns once the server has the subscription (or, if the
    /// server is away, once it is queued for when the client reconnects).
    ///
    /// Without a secret, refused with [`Error::UntrustedNetwork`] unless the
    /// server is reached over loopback or the network is declared trusted.
    pub async fn publish(&self, key: &str, metadata: &RdmaMetadata) -> Result<Publication> {
        validate_key(key)?;
        self.check_network()?;
        let json = metadata.to_json();
        self.catalog.insert(key, String::new())?;
        let subject = self.subject(key);
        let sub = match self.client.subscribe(subject.clone()).await {
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
        let keys = self.auth.keys.clone();
        tokio::spawn(async move {
            let next = || {
                poll_fn(|cx| match lock(&polled).as_mut() {
                    Some(sub) => sub.poll_next_unpin(cx),
                    None => Poll::Ready(None),
                })
            };
            let scope = Scope {
                channel: "nats",
                name: &subject,
            };
            while let Some(msg) = next().await {
                let Some(reply) = msg.reply else { continue };
                let answer = match &keys {
                    None => json.clone(),
                    Some(keys) => match keys.check(scope, &msg.payload) {
                        Ok(challenge) => Bytes::from(keys.seal(scope, &challenge, &json)),
                        Err(_) => Bytes::from_static(REFUSAL),
                    },
                };
                if let Err(e) = client.publish(reply, answer).await {
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
    /// yet, the server is away) until `deadline` has passed. With a secret,
    /// answers that are not sealed for this request are refused (and
    /// reported as [`Error::Forged`] if no real one came by the deadline).
    pub async fn fetch(&self, key: &str, deadline: Duration) -> Result<RdmaMetadata> {
        validate_key(key)?;
        let subject = self.subject(key);
        until_deadline(
            deadline,
            "fetching metadata over NATS",
            self.has_secret(),
            |left| self.request(&subject, key, left.min(ATTEMPT)),
        )
        .await
    }

    /// One request: sent to `subject`, answered on an inbox of its own,
    /// every answer examined until one is accepted or `timeout` passes.
    async fn request(&self, subject: &str, key: &str, timeout: Duration) -> Result<RdmaMetadata> {
        let end = Instant::now() + timeout;
        let gone = |detail: String| Error::ServerGone {
            endpoint: self.url.clone(),
            detail,
        };
        let scope = Scope {
            channel: "nats",
            name: subject,
        };
        let (challenge, payload) = match &self.auth.keys {
            Some(keys) => {
                let (challenge, proof) = keys.prove(scope);
                (Some(challenge), Bytes::copy_from_slice(&proof))
            }
            None => (None, Bytes::new()),
        };
        let inbox = self.client.new_inbox();
        let mut answers = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| gone(e.to_string()))?;
        self.client
            .publish_with_reply(subject.to_owned(), inbox, payload)
            .await
            .map_err(|e| gone(e.to_string()))?;
        let mut refused = None;
        loop {
            let msg = match tokio::time::timeout_at(end, answers.next()).await {
                Ok(Some(msg)) => msg,
                Ok(None) => return Err(gone("the subscription ended".into())),
                Err(_) if self.client.connection_state() != State::Connected => {
                    return Err(gone(
                        "disconnected from the NATS server (reconnecting)".into(),
                    ))
                }
                Err(_) => {
                    return Err(refused.unwrap_or(Error::Timeout {
                        waited: timeout,
                        during: "waiting for the publisher's NATS reply",
                    }))
                }
            };
            match msg.status {
                Some(StatusCode::NO_RESPONDERS) => {
                    return Err(refused.unwrap_or(Error::NotFound {
                        key: key.into(),
                        waited: Duration::ZERO,
                    }))
                }
                Some(s) if s != StatusCode::OK => continue,
                _ => {}
            }
            match self.accept(scope, challenge.as_ref(), &msg.payload) {
                Ok(metadata) => return Ok(metadata),
                // With a secret, whoever else answers is ignored: the
                // real publisher may answer next.
                Err(e) if self.has_secret() => {
                    tracing::debug!(error = %e, "control plane: refused a NATS answer");
                    refused = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The metadata in an answer, if this side accepts it.
    fn accept(
        &self,
        scope: Scope<'_>,
        challenge: Option<&Challenge>,
        answer: &[u8],
    ) -> Result<RdmaMetadata> {
        let endpoint = || format!("{} on {}", scope.name, self.url);
        if answer.starts_with(&REFUSAL[..4]) {
            return Err(Error::SecretRequired {
                endpoint: endpoint(),
                detail: "it refused this fetch's request".into(),
            });
        }
        match (&self.auth.keys, challenge) {
            (Some(keys), Some(challenge)) => {
                let json = keys
                    .open(scope, challenge, answer)
                    .map_err(|r| Error::Forged {
                        endpoint: endpoint(),
                        detail: r.describe("the answer"),
                    })?;
                Ok(RdmaMetadata::from_json_bytes(&json)?)
            }
            _ if looks_sealed(answer) => Err(Error::SecretRequired {
                endpoint: endpoint(),
                detail: "it sent the metadata sealed with a secret".into(),
            }),
            _ => Ok(RdmaMetadata::from_json_bytes(answer)?),
        }
    }
}

impl std::fmt::Debug for NatsChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsChannel")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("published", &self.catalog.len())
            .field("secret", &self.has_secret())
            .finish()
    }
}
