//! The hand-over through etcd (v3): metadata stored under
//! `{prefix}/{key}`, on a lease the publisher keeps alive (the JSON gateway
//! is in `etcd_gateway.rs`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferry_proto::RdmaMetadata;
use serde_json::{json, Value};

use crate::catalog::Publication;
use crate::config::{is_loopback, Auth, Config, TRUSTED_NETWORK_ENV};
use crate::etcd_gateway::{b64, int64, unb64, Gateway};
use crate::retry::until_deadline;
use crate::seal::{looks_sealed_stored, Scope};
use crate::{validate_key, Error, Result};

/// The most bytes [`EtcdStore::publish_bytes`] stores under one key (what
/// a reply carries: as much as the largest metadata).
pub const MAX_VALUE_BYTES: usize = ferry_proto::MAX_METADATA_JSON;

/// The key prefix used unless [`EtcdStore::with_prefix`] says otherwise:
/// metadata for key `k` is stored at `/ferry/metadata/k`.
pub const DEFAULT_ETCD_PREFIX: &str = "/ferry/metadata";

/// The lease a publication is stored on unless
/// [`EtcdStore::with_lease_ttl`] says otherwise: if the publisher dies, its
/// metadata is gone from etcd this long after its last keep-alive.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// The longest one request waits before it is sent again.
const ATTEMPT: Duration = Duration::from_secs(1);
/// How long `publish` and `withdraw` keep trying.
const PUBLISH_DEADLINE: Duration = Duration::from_secs(5);

/// Live publications of a store and its clones: etcd key → (publication
/// number, lease).
type Live = Arc<Mutex<HashMap<String, (u64, i64)>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One worker's client of an etcd cluster, to publish metadata, fetch it,
/// or both, through etcd's v3 JSON gateway (`http://host:2379`, etcd 3.4
/// or later). Cloning shares it.
///
/// A publication is stored under `{prefix}/{key}` on a lease of its own,
/// kept alive while the [`Publication`] lives: dropping it revokes the
/// lease (the key goes with it), and if the publisher dies, etcd deletes
/// the key when the lease runs out ([`DEFAULT_LEASE_TTL`]). A key already
/// in etcd is never overwritten: [`Error::AlreadyPublished`].
///
/// With a secret ([`Config::secret`], `FERRY_SECRET`), the value stored is
/// the metadata encrypted and authenticated under a key derived from the
/// secret, bound to its etcd key: whoever reads etcd without the secret
/// learns nothing usable, and a fetch accepts only a value sealed with the
/// secret for that key ([`Error::Forged`] otherwise, after asking again
/// until its deadline). Without a secret, it publishes only to an etcd it
/// reaches over loopback, unless the network is declared trusted
/// ([`Error::UntrustedNetwork`]). An etcd with authentication enabled
/// takes a user and password ([`Config::etcd_user_and_password`],
/// `FERRY_ETCD_USER` and `FERRY_ETCD_PASSWORD`).
#[derive(Clone)]
pub struct EtcdStore {
    gateway: Arc<Gateway>,
    prefix: String,
    auth: Arc<Auth>,
    /// Whether every endpoint resolves to a loopback address.
    loopback: bool,
    lease_ttl: Duration,
    live: Live,
    next: Arc<AtomicU64>,
}

impl EtcdStore {
    /// Connects to the etcd cluster at `endpoints` (`http://host:2379`, or
    /// a comma-separated list), waiting up to `deadline` for it to answer;
    /// configured from the environment ([`Config::new`]).
    pub async fn connect(endpoints: &str, deadline: Duration) -> Result<EtcdStore> {
        Self::connect_with(endpoints, deadline, &Config::new()).await
    }

    /// Connects to `endpoints` with `config` (the secret, the etcd user).
    pub async fn connect_with(
        endpoints: &str,
        deadline: Duration,
        config: &Config,
    ) -> Result<EtcdStore> {
        let auth = config.resolve()?;
        let gateway = Arc::new(Gateway::new(endpoints, auth.etcd.clone())?);
        let (g, empty) = (&gateway, json!({}));
        until_deadline(deadline, "connecting to etcd", false, |left| {
            attempt(left, g.call("/v3/maintenance/status", &empty))
        })
        .await?;
        let mut loopback = true;
        for e in gateway.endpoints() {
            let ips: Vec<IpAddr> = match tokio::net::lookup_host(e.as_str()).await {
                Ok(addrs) => addrs.map(|a| a.ip()).collect(),
                Err(_) => Vec::new(),
            };
            loopback &= !ips.is_empty() && ips.into_iter().all(is_loopback);
        }
        Ok(EtcdStore {
            gateway,
            prefix: DEFAULT_ETCD_PREFIX.into(),
            auth: Arc::new(auth),
            loopback,
            lease_ttl: DEFAULT_LEASE_TTL,
            live: Live::default(),
            next: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Stores metadata under `prefix` instead of [`DEFAULT_ETCD_PREFIX`]
    /// (`/ferry/<namespace>`, say): both sides must use the same. It
    /// starts with `/`, and its segments are `A-Z a-z 0-9 _ -`.
    pub fn with_prefix(mut self, prefix: &str) -> Result<EtcdStore> {
        let valid = prefix.len() <= 256
            && prefix.strip_prefix('/').is_some_and(|rest| {
                rest.split('/')
                    .all(|s| !s.is_empty() && s.bytes().all(crate::token_byte))
            });
        if !valid {
            return Err(Error::InvalidEtcdPrefix {
                prefix: prefix.chars().take(64).collect(),
            });
        }
        self.prefix = prefix.into();
        Ok(self)
    }

    /// Keeps publications on leases of `ttl` (at least a second; etcd may
    /// round it up) instead of [`DEFAULT_LEASE_TTL`]: how long metadata
    /// outlives a publisher that died.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> EtcdStore {
        self.lease_ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// Whether it seals what it publishes and accepts only sealed values.
    pub fn has_secret(&self) -> bool {
        self.auth.keys.is_some()
    }

    /// The etcd key that metadata for `key` is stored at.
    pub fn etcd_key(&self, key: &str) -> String {
        format!("{}/{key}", self.prefix)
    }

    fn check_network(&self) -> Result<()> {
        if self.auth.keys.is_some() || self.auth.trusted_network || self.loopback {
            return Ok(());
        }
        Err(Error::UntrustedNetwork {
            addr: format!("the etcd server at {}", self.gateway.name()),
            env: TRUSTED_NETWORK_ENV,
        })
    }

    /// Stores `metadata` under `key` until the returned guard is dropped
    /// (or [`withdraw`](Self::withdraw)n), trying for up to 5 seconds.
    /// Refused with [`Error::AlreadyPublished`] if the key is in etcd
    /// already (whoever stored it), and, without a secret, with
    /// [`Error::UntrustedNetwork`] unless etcd is reached over loopback or
    /// the network is declared trusted.
    ///
    /// Dropping the guard revokes the lease in the background (a fetch
    /// racing it may still find the metadata); `withdraw` waits for it.
    pub async fn publish(&self, key: &str, metadata: &RdmaMetadata) -> Result<Publication> {
        self.publish_bytes(key, metadata.to_json().as_bytes()).await
    }

    /// [`publish`](Self::publish) for any value of at most
    /// [`MAX_VALUE_BYTES`] (another component's metadata: a NIXL agent's,
    /// say), sealed the same way with a secret.
    pub async fn publish_bytes(&self, key: &str, value: &[u8]) -> Result<Publication> {
        validate_key(key)?;
        self.check_network()?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(Error::TooLarge {
                len: value.len(),
                max: MAX_VALUE_BYTES,
            });
        }
        let at = self.etcd_key(key);
        let value = match &self.auth.keys {
            Some(keys) => keys.seal_stored(scope(&at), value),
            None => value.to_vec(),
        };
        let record = Arc::new(Record {
            key: b64(at.as_bytes()),
            value: b64(&value),
        });
        let ttl = self.lease_ttl.as_secs().max(1);
        let lease = Mutex::new(None);
        let stored = until_deadline(
            PUBLISH_DEADLINE,
            "publishing metadata to etcd",
            false,
            |left| attempt(left, self.store(&record, ttl, &lease)),
        )
        .await;
        let lease_now = *lock(&lease);
        if let Err(e) = stored {
            if let Some(id) = lease_now {
                let gateway = self.gateway.clone();
                tokio::spawn(async move { revoke(&gateway, id).await });
            }
            return Err(e);
        }
        let Some(id) = lease_now else {
            return Err(Error::Timeout {
                waited: PUBLISH_DEADLINE,
                during: "publishing metadata to etcd",
            });
        };
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.live).insert(at.clone(), (number, id));
        let keeper = tokio::spawn(keep_alive(
            self.gateway.clone(),
            self.live.clone(),
            at.clone(),
            number,
            record,
            ttl,
        ))
        .abort_handle();
        let live = self.live.clone();
        let gateway = self.gateway.clone();
        let owned = at;
        // Revoked on the runtime, wherever the guard is dropped.
        let runtime = tokio::runtime::Handle::current();
        Ok(Publication::new(key, move || {
            keeper.abort();
            if let Some(id) = take_live(&live, &owned, number) {
                runtime.spawn(async move { revoke(&gateway, id).await });
            }
        }))
    }

    /// One try at storing the record on a lease: the lease made once (by
    /// the first try), the key created only if absent.
    async fn store(&self, record: &Record, ttl: u64, lease: &Mutex<Option<i64>>) -> Result<()> {
        let known = *lock(lease);
        let id = match known {
            Some(id) => id,
            None => {
                let id = grant(&self.gateway, ttl).await?;
                *lock(lease) = Some(id);
                id
            }
        };
        put_if_absent(&self.gateway, record, id).await
    }

    /// Withdraws `publication` (made by this store or a clone of it) and
    /// waits until etcd has deleted it: later fetches get
    /// [`Error::NotFound`]. If etcd cannot be reached within 5 seconds, the
    /// error says so and the metadata goes when its lease runs out.
    pub async fn withdraw(&self, publication: Publication) -> Result<()> {
        let taken = lock(&self.live).remove(&self.etcd_key(publication.key()));
        drop(publication);
        let Some((_, id)) = taken else {
            return Ok(());
        };
        until_deadline(
            PUBLISH_DEADLINE,
            "withdrawing metadata from etcd",
            false,
            |left| attempt(left, revoke_once(&self.gateway, id)),
        )
        .await
    }

    /// The metadata stored under `key`, asking again (nobody published it
    /// yet, etcd is away or slow) until `deadline` has passed. With a
    /// secret, a value not sealed with it for this key is refused (and
    /// reported as [`Error::Forged`] if no real one came by the deadline).
    pub async fn fetch(&self, key: &str, deadline: Duration) -> Result<RdmaMetadata> {
        let value = self.fetch_bytes(key, deadline).await?;
        Ok(RdmaMetadata::from_json_bytes(&value)?)
    }

    /// [`fetch`](Self::fetch) of a value stored by
    /// [`publish_bytes`](Self::publish_bytes), as it was given.
    pub async fn fetch_bytes(&self, key: &str, deadline: Duration) -> Result<Vec<u8>> {
        validate_key(key)?;
        let at = self.etcd_key(key);
        until_deadline(
            deadline,
            "fetching metadata from etcd",
            self.has_secret(),
            |left| attempt(left, self.fetch_once(key, &at)),
        )
        .await
    }

    async fn fetch_once(&self, key: &str, at: &str) -> Result<Vec<u8>> {
        let reply = self
            .gateway
            .call("/v3/kv/range", &json!({"key": b64(at.as_bytes())}))
            .await?;
        let bad = |detail: String| Error::BadReply {
            endpoint: self.gateway.name(),
            detail,
        };
        let kv = match reply.get("kvs") {
            None => None,
            Some(Value::Array(kvs)) => kvs.first(),
            Some(_) => return Err(bad("\"kvs\" is not a list".into())),
        };
        let Some(kv) = kv else {
            return Err(Error::NotFound {
                key: key.into(),
                waited: Duration::ZERO,
            });
        };
        if unb64(kv.get("key")).as_deref() != Some(at.as_bytes()) {
            return Err(bad(format!("the reply is not about {at}")));
        }
        let value = unb64(kv.get("value")).ok_or_else(|| bad("a value not in base64".into()))?;
        let endpoint = || format!("{at} in etcd at {}", self.gateway.name());
        match &self.auth.keys {
            Some(keys) => keys
                .open_stored(scope(at), &value)
                .map_err(|r| Error::Forged {
                    endpoint: endpoint(),
                    detail: r.describe("the value stored"),
                }),
            None if looks_sealed_stored(&value) => Err(Error::SecretRequired {
                endpoint: endpoint(),
                detail: "the metadata there is sealed with a secret".into(),
            }),
            None => Ok(value),
        }
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.gateway.name())
            .field("prefix", &self.prefix)
            .field("published", &lock(&self.live).len())
            .field("secret", &self.has_secret())
            .finish()
    }
}

/// What a publication stores: its etcd key and value, in base64.
struct Record {
    key: String,
    value: String,
}

fn scope(at: &str) -> Scope<'_> {
    Scope {
        channel: "etcd",
        name: at,
    }
}

/// Runs one request for at most [`ATTEMPT`] (and `left`).
async fn attempt<T>(
    left: Duration,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let limit = left.min(ATTEMPT);
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            waited: limit,
            during: "waiting for etcd's reply",
        }),
    }
}

/// Removes the live entry of publication `number` under `key`, if it is
/// still there: its lease.
fn take_live(live: &Live, key: &str, number: u64) -> Option<i64> {
    let mut map = lock(live);
    match map.get(key) {
        Some(&(n, id)) if n == number => {
            map.remove(key);
            Some(id)
        }
        _ => None,
    }
}

async fn grant(gateway: &Gateway, ttl: u64) -> Result<i64> {
    let reply = gateway
        .call("/v3/lease/grant", &json!({"TTL": ttl}))
        .await?;
    match int64(reply.get("ID")) {
        Some(id) if id != 0 => Ok(id),
        _ => Err(Error::BadReply {
            endpoint: gateway.name(),
            detail: "a lease grant without a lease".into(),
        }),
    }
}

/// Creates the key on lease `id` unless it exists; it is fine if it
/// exists on that very lease (an earlier try whose reply was lost).
async fn put_if_absent(gateway: &Gateway, record: &Record, id: i64) -> Result<()> {
    let txn = json!({
        "compare": [{"key": record.key, "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": {"key": record.key, "value": record.value, "lease": id.to_string()}}],
        "failure": [{"request_range": {"key": record.key}}],
    });
    let reply = gateway.call("/v3/kv/txn", &txn).await?;
    if reply.get("succeeded").and_then(Value::as_bool) == Some(true) {
        return Ok(());
    }
    let holder = reply
        .pointer("/responses/0/response_range/kvs/0")
        .map(|kv| int64(kv.get("lease")));
    match holder {
        Some(Some(lease)) if lease == id => Ok(()),
        // Deleted in between: the next try creates it.
        None => Err(Error::ServerGone {
            endpoint: gateway.name(),
            detail: "the key changed while it was being created".into(),
        }),
        Some(_) => {
            let key = unb64(Some(&Value::String(record.key.clone())))
                .map(|k| String::from_utf8_lossy(&k).into_owned())
                .unwrap_or_default();
            Err(Error::AlreadyPublished { key })
        }
    }
}

async fn revoke_once(gateway: &Gateway, id: i64) -> Result<()> {
    match gateway
        .call("/v3/lease/revoke", &json!({"ID": id.to_string()}))
        .await
    {
        Err(Error::Refused { reason, .. }) if reason.contains("lease not found") => Ok(()),
        r => r.map(drop),
    }
}

/// Best effort, in the background: if etcd is away, the lease runs out.
async fn revoke(gateway: &Gateway, id: i64) {
    if let Err(e) = attempt(PUBLISH_DEADLINE, revoke_once(gateway, id)).await {
        tracing::warn!(error = %e, "control plane: could not revoke an etcd lease (it will expire)");
    }
}

/// Keeps a publication's lease alive (a third of its TTL apart), and
/// stores it again on a new lease if etcd lost the old one (it ran out
/// while etcd was unreachable, say). Aborted when the publication goes.
async fn keep_alive(
    gateway: Arc<Gateway>,
    live: Live,
    key: String,
    number: u64,
    record: Arc<Record>,
    ttl: u64,
) {
    let period = Duration::from_millis(ttl * 1000 / 3);
    loop {
        tokio::time::sleep(period).await;
        let Some(id) = lock(&live).get(&key).filter(|e| e.0 == number).map(|e| e.1) else {
            return;
        };
        let kept = attempt(
            period,
            gateway.call("/v3/lease/keepalive", &json!({"ID": id.to_string()})),
        )
        .await;
        match kept {
            Ok(reply) if int64(reply.get("TTL")).is_some_and(|t| t > 0) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "control plane: etcd keep-alive failed; will try again");
                continue;
            }
        }
        // The lease is gone, and the key with it: store it again.
        tracing::warn!(%key, "control plane: etcd lost a publication's lease; storing it again");
        let renewed = async {
            let id = grant(&gateway, ttl).await?;
            put_if_absent(&gateway, &record, id).await.map(|()| id)
        };
        match attempt(period, renewed).await {
            Ok(new) => {
                if let Some(e) = lock(&live).get_mut(&key).filter(|e| e.0 == number) {
                    e.1 = new;
                }
            }
            Err(e @ Error::AlreadyPublished { .. }) => {
                tracing::warn!(error = %e, "control plane: another publisher took the key");
                return;
            }
            Err(e) => tracing::debug!(error = %e, "control plane: will store it again later"),
        }
    }
}
