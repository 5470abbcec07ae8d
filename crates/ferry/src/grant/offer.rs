//! Offers: a pool's memory offered to any number of workers, each of which
//! claims a grant of its own from the owner's runtime
//! ([`Connector::claim`](crate::Connector::claim)), bound to its
//! authenticated worker id; the owner's application does nothing per
//! claim. The owner's [`Offer`] sees every such grant: their holders,
//! their notifications merged, and revokes one holder or all of them.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::Duration;

use ferry_proto::grant::claim::{self, Offered};
use ferry_proto::grant::{GrantError, OfferId, OfferMetadata, Rights};
use ferry_proto::wire::{OfferAnswer, OfferClaim, OfferReply};
use ferry_proto::Token;

use super::{served, Grant, GrantOptions, GrantTable, Notification};
use crate::{host, Error, Pool, Result};

/// Past this many entries, the table forgets the offers that are gone.
const PRUNE_AT: usize = 1024;

/// How an offer's grants are made: what they allow, for how long, and
/// their lanes ([`GrantOptions`] without a holder: each claimer is its
/// grant's holder).
///
/// ```
/// use std::time::Duration;
/// use ferry::grant::{OfferOptions, Rights};
/// let opts = OfferOptions::read_write().expires_after(Duration::from_secs(600));
/// assert_eq!(opts.rights(), Rights::READ_WRITE);
/// ```
#[derive(Debug, Clone)]
pub struct OfferOptions {
    grant: GrantOptions,
    max_holders: u32,
}

/// How many workers may hold grants of one offer at once unless
/// [`OfferOptions::max_holders`] says otherwise (each costs its owner a
/// control page and a notification thread).
pub const DEFAULT_MAX_HOLDERS: u32 = 256;

impl OfferOptions {
    /// An offer of `rights`.
    pub fn new(rights: Rights) -> OfferOptions {
        OfferOptions {
            grant: GrantOptions::new(rights),
            max_holders: DEFAULT_MAX_HOLDERS,
        }
    }

    /// At most `n` workers (at least 1) hold grants of the offer at once
    /// ([`DEFAULT_MAX_HOLDERS`] otherwise): the claim of another worker is
    /// refused ([`GrantError::TooManyHolders`]) until a holder's grant
    /// ends (revoked, expired, or [`Offer::revoke_holder`]). A holder
    /// claiming again replaces its grant, and is never refused for this.
    pub fn max_holders(mut self, n: u32) -> OfferOptions {
        self.max_holders = n.max(1);
        self
    }

    /// A READ offer.
    pub fn read() -> OfferOptions {
        Self::new(Rights::READ)
    }

    /// A WRITE offer.
    pub fn write() -> OfferOptions {
        Self::new(Rights::WRITE)
    }

    /// A READ and WRITE offer.
    pub fn read_write() -> OfferOptions {
        Self::new(Rights::READ_WRITE)
    }

    /// Ends the offer, and every grant made from it, after `d`.
    pub fn expires_after(mut self, d: Duration) -> OfferOptions {
        self.grant = self.grant.expires_after(d);
        self
    }

    /// The low-latency mode of each grant's notifications
    /// ([`GrantOptions::spin`]).
    pub fn spin(mut self, d: Duration) -> OfferOptions {
        self.grant = self.grant.spin(d);
        self
    }

    /// How long a revoke waits for a holder's operation in flight
    /// ([`GrantOptions::revoke_deadline`]).
    pub fn revoke_deadline(mut self, d: Duration) -> OfferOptions {
        self.grant = self.grant.revoke_deadline(d);
        self
    }

    /// Whether each grant offers its TCP lane ([`GrantOptions::tcp`];
    /// claims themselves always travel over TCP).
    pub fn tcp(mut self, offered: bool) -> OfferOptions {
        self.grant = self.grant.tcp(offered);
        self
    }

    /// Whether each grant offers the UCX lane ([`GrantOptions::ucx`]).
    pub fn ucx(mut self, on: bool) -> OfferOptions {
        self.grant = self.grant.ucx(on);
        self
    }

    /// Whether each grant offers cross-memory attach ([`GrantOptions::cma`]).
    pub fn cma(mut self, on: bool) -> OfferOptions {
        self.grant = self.grant.cma(on);
        self
    }

    /// The rights each grant gives.
    pub fn rights(&self) -> Rights {
        self.grant.rights
    }
}

/// An offer over a [`Pool`], on its owner's side: made by
/// [`Connector::offer`](crate::Connector::offer), published as
/// [`metadata`](Self::metadata). Any worker that has the metadata claims a
/// grant of its own with [`Connector::claim`](crate::Connector::claim):
/// the owner's runtime checks the claim, makes a grant bound to the
/// claiming connection's worker id (authenticated with a shared secret)
/// with the offer's rights, expiry and lanes, and answers its metadata.
///
/// A worker that claims again gets a fresh grant, which replaces (revokes)
/// its previous one. [`revoke`](Self::revoke), or dropping the offer,
/// revokes every grant made from it and refuses later claims
/// ([`GrantError::Revoked`]).
pub struct Offer {
    inner: Arc<Shared>,
}

/// What the owner keeps of an offer.
pub(crate) struct Shared {
    meta: OfferMetadata,
    pool: Pool,
    opts: GrantOptions,
    max_holders: u32,
    grants: Arc<GrantTable>,
    addresses: Vec<SocketAddr>,
    revoked: AtomicBool,
    state: Mutex<State>,
    /// A grant was made or ended, or the offer was revoked.
    changed: tokio::sync::Notify,
    /// Where the next look for a notification starts (fairness).
    cursor: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// Each holder's grant.
    holders: HashMap<String, Arc<Grant>>,
    /// Holders whose grant the owner revoked: their claims are refused.
    banned: HashSet<String>,
}

/// This connector's offers, by id, for the claims of workers over TCP.
#[derive(Default)]
pub(crate) struct OfferTable {
    map: Mutex<HashMap<u64, (Token, Weak<Shared>)>>,
}

/// Makes an offer over `pool` (see [`Connector::offer`](crate::Connector::offer)).
pub(crate) fn create(
    (owner, host_id): (&str, &str),
    pool: &Pool,
    opts: OfferOptions,
    (offers, grants): (&OfferTable, &Arc<GrantTable>),
    addresses: Vec<SocketAddr>,
) -> Result<Offer> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let max_holders = opts.max_holders;
    let opts = opts.grant;
    if addresses.is_empty() {
        return Err(GrantError::NoLane(
            "an offer is claimed over TCP: the connector must listen".into(),
        )
        .into());
    }
    if opts.rights.allows(Rights::WRITE) && !pool.is_writable() {
        return Err(crate::PoolError::ReadOnly.into());
    }
    let block_count = u32::try_from(pool.block_count()).map_err(|_| {
        GrantError::Malformed(format!(
            "{} blocks: an offer takes at most 2^32 - 1",
            pool.block_count()
        ))
    })?;
    let mut meta = OfferMetadata {
        owner: owner.to_string(),
        host_id: host_id.to_string(),
        offer: OfferId(NEXT.fetch_add(1, SeqCst)),
        token: Token::from_bytes(host::random_bytes()),
        rights: opts.rights,
        expires_at_ms: opts
            .expires_after
            .map(|d| super::now_ms().saturating_add(d.as_millis().min(u64::MAX as u128) as u64)),
        block_size: pool.block_size() as u64,
        block_count,
        device: pool.device(),
        tcp: addresses
            .iter()
            .take(ferry_proto::grant::MAX_TCP_ADDRESSES)
            .copied()
            .collect(),
    };
    // Past 1 KiB (long worker ids, many addresses): fewer addresses.
    while matches!(meta.to_json(), Err(GrantError::TooLarge { .. })) && meta.tcp.len() > 1 {
        meta.tcp.pop();
    }
    meta.to_json()?;
    let inner = Arc::new(Shared {
        meta,
        pool: pool.clone(),
        opts,
        max_holders,
        grants: grants.clone(),
        addresses,
        revoked: AtomicBool::new(false),
        state: Mutex::new(State::default()),
        changed: tokio::sync::Notify::new(),
        cursor: AtomicUsize::new(0),
    });
    offers.insert(&inner);
    Ok(Offer { inner })
}

impl OfferTable {
    fn insert(&self, offer: &Arc<Shared>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= PRUNE_AT {
            map.retain(|_, (_, o)| o.strong_count() > 0);
        }
        map.insert(
            offer.meta.offer.0,
            (offer.meta.token, Arc::downgrade(offer)),
        );
    }

    /// Serves claim `c` of worker `peer` (the connection's peer, as its
    /// handshake authenticated it): the reply to send.
    pub(crate) async fn claim(&self, peer: &str, c: OfferClaim) -> OfferReply {
        let req = c.req;
        let answer = match self.serve(peer, &c).await {
            Ok(meta) => OfferAnswer::Granted(Box::new(meta)),
            Err(Error::Grant(e)) => OfferAnswer::Refused(e),
            Err(e) => OfferAnswer::Refused(GrantError::NoLane(e.to_string())),
        };
        OfferReply { req, answer }
    }

    async fn serve(&self, peer: &str, c: &OfferClaim) -> Result<ferry_proto::grant::GrantMetadata> {
        // An id unknown, or a wrong token: forged (nothing told of other
        // offers); the token right but the offer gone: revoked.
        let found = {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&c.offer) {
                Some((t, o)) if t.ct_eq(&c.token) => Some(o.upgrade()),
                _ => None,
            }
        };
        let offer = match found {
            None => return Err(GrantError::Forged { what: "token" }.into()),
            Some(None) => return Err(GrantError::Revoked.into()),
            Some(Some(o)) => o,
        };
        offer.grant_for(peer, c).await
    }
}

impl Shared {
    /// Checks claim `c` of `peer` and makes its grant, replacing the one
    /// it had.
    async fn grant_for(
        &self,
        peer: &str,
        c: &OfferClaim,
    ) -> Result<ferry_proto::grant::GrantMetadata> {
        let now = super::now_ms();
        let offered = Offered {
            token: &self.meta.token,
            revoked: self.revoked.load(SeqCst),
            expires_at_ms: self.meta.expires_at_ms,
        };
        claim::check(&offered, peer, c, now)?;
        let old = {
            let mut st = self.lock();
            if st.banned.contains(peer) {
                return Err(GrantError::Revoked.into());
            }
            self.check_room(&mut st, peer)?;
            st.holders.remove(peer)
        };
        if let Some(old) = old {
            self.changed.notify_waiters();
            old.revoke().await?;
        }
        let mut opts = self.opts.clone().holder(peer);
        opts.expires_after = self
            .meta
            .expires_at_ms
            .map(|at| Duration::from_millis(at.saturating_sub(now).max(1)));
        let g = served::create(
            &self.meta.owner,
            &self.meta.host_id,
            &self.pool,
            opts,
            Some((&*self.grants, self.addresses.clone())),
        )?;
        let meta = g.metadata().clone();
        {
            let mut st = self.lock();
            // Revoked meanwhile: the grant goes (its drop revokes it).
            if self.revoked.load(SeqCst) || st.banned.contains(peer) {
                return Err(GrantError::Revoked.into());
            }
            // Another worker's claim may have taken the last place meanwhile.
            self.check_room(&mut st, peer)?;
            st.holders.insert(peer.to_string(), Arc::new(g));
        }
        self.changed.notify_waiters();
        Ok(meta)
    }

    /// Refuses a claim of `peer`, which holds none of the offer's grants,
    /// when as many workers as the offer takes hold one (grants that ended
    /// leave their place first).
    fn check_room(&self, st: &mut State, peer: &str) -> Result<()> {
        if st.holders.contains_key(peer) {
            return Ok(());
        }
        if st.holders.len() >= self.max_holders as usize {
            st.holders.retain(|_, g| !g.is_revoked());
        }
        if st.holders.len() >= self.max_holders as usize {
            return Err(GrantError::TooManyHolders {
                max: self.max_holders,
            }
            .into());
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The grants, from where the last look for a notification ended.
    fn grants(&self) -> Vec<Arc<Grant>> {
        let st = self.lock();
        let mut v: Vec<Arc<Grant>> = st.holders.values().cloned().collect();
        if !v.is_empty() {
            let at = self.cursor.fetch_add(1, SeqCst) % v.len();
            v.rotate_left(at);
        }
        v
    }
}

type Waiting<'a> = Pin<Box<dyn Future<Output = Option<Notification>> + Send + 'a>>;

impl Offer {
    /// The offer's name.
    pub fn id(&self) -> OfferId {
        self.inner.meta.offer
    }

    /// What to publish (as [`OfferMetadata::to_json`], at most 1 KiB): a
    /// capability for every reader.
    pub fn metadata(&self) -> &OfferMetadata {
        &self.inner.meta
    }

    /// The pool offered.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Whether the offer was revoked.
    pub fn is_revoked(&self) -> bool {
        self.inner.revoked.load(SeqCst)
    }

    /// The workers that hold a live grant of the offer now (not revoked,
    /// not expired), sorted.
    pub fn holders(&self) -> Vec<String> {
        let st = self.inner.lock();
        let live = st.holders.iter().filter(|(_, g)| !g.is_revoked());
        let mut v: Vec<String> = live.map(|(h, _)| h.clone()).collect();
        v.sort();
        v
    }

    /// The grant worker `holder` holds, if any.
    pub fn grant_of(&self, holder: &str) -> Option<Arc<Grant>> {
        self.inner.lock().holders.get(holder).cloned()
    }

    /// Revokes the offer: later claims are refused
    /// ([`GrantError::Revoked`]) and every grant made from it is revoked
    /// (as [`Grant::revoke`]: once this returns, no byte moves through any
    /// of them). Idempotent. The first error of a grant's revoke
    /// ([`GrantError::Stalled`]) is returned once all were revoked.
    pub async fn revoke(&self) -> Result<()> {
        let grants: Vec<Arc<Grant>> = {
            let mut st = self.inner.lock();
            self.inner.revoked.store(true, SeqCst);
            st.holders.drain().map(|(_, g)| g).collect()
        };
        self.inner.changed.notify_waiters();
        let mut first = Ok(());
        for g in grants {
            if let Err(e) = g.revoke().await {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Revokes the grant of worker `holder` (as [`Grant::revoke`]) and
    /// refuses its later claims ([`GrantError::Revoked`]); the other
    /// holders' grants go on. A worker that holds none is refused its
    /// claims from now on.
    pub async fn revoke_holder(&self, holder: &str) -> Result<()> {
        let g = {
            let mut st = self.inner.lock();
            st.banned.insert(holder.to_string());
            st.holders.remove(holder)
        };
        self.inner.changed.notify_waiters();
        match g {
            Some(g) => g.revoke().await,
            None => Ok(()),
        }
    }

    /// Retires blocks `indices` in every grant of the offer (as
    /// [`Grant::retire`]): a transfer of any holder that names an older
    /// generation is refused from the time this returns. Each holder's
    /// current references are its own grant's
    /// ([`RemoteGrant::block_refs`](crate::RemoteGrant::block_refs)).
    /// Grants claimed later start at generation 0.
    pub async fn retire(&self, indices: &[u32]) -> Result<()> {
        if let Some(&index) = indices.iter().find(|&&i| i >= self.inner.meta.block_count) {
            return Err(GrantError::OutOfRange {
                index,
                count: self.inner.meta.block_count,
            }
            .into());
        }
        for g in self.inner.grants() {
            g.retire(indices).await?;
        }
        Ok(())
    }

    /// A notification already queued by any holder, if any, without
    /// waiting; each names its [`holder`](Notification::holder).
    pub fn poll_notification(&self) -> Option<Notification> {
        self.inner
            .grants()
            .iter()
            .find_map(|g| g.try_next_notification())
    }

    /// The next notification of any holder's operations (each holder's in
    /// its order), naming its [`holder`](Notification::holder); `None`
    /// once the offer is revoked and holds no grant, or expired (and none
    /// is queued).
    pub async fn next_notification(&self) -> Option<Notification> {
        let expiry = self.inner.meta.expires_at_ms;
        let expired = move || expiry.is_some_and(|at| super::now_ms() >= at);
        let until_expiry = async move {
            match expiry {
                Some(at) => {
                    let ms = at.saturating_sub(super::now_ms());
                    tokio::time::sleep(Duration::from_millis(ms)).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(until_expiry);
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let grants = self.inner.grants();
            if let Some(n) = grants.iter().find_map(|g| g.try_next_notification()) {
                return Some(n);
            }
            if (grants.is_empty() && self.is_revoked()) || expired() {
                return None;
            }
            let mut waits: Vec<Waiting<'_>> = grants
                .iter()
                .map(|g| Box::pin(g.next_notification()) as Waiting<'_>)
                .collect();
            let got = std::future::poll_fn(|cx| {
                for w in waits.iter_mut() {
                    if let Poll::Ready(n) = w.as_mut().poll(cx) {
                        return Poll::Ready(n);
                    }
                }
                let changed = changed.as_mut().poll(cx).is_ready();
                if changed || until_expiry.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            if got.is_some() {
                return got;
            }
        }
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        let grants: Vec<Arc<Grant>> = {
            let mut st = self.inner.lock();
            self.inner.revoked.store(true, SeqCst);
            st.holders.drain().map(|(_, g)| g).collect()
        };
        self.inner.changed.notify_waiters();
        // Each grant's drop revokes it (fenced: the memory stays alive for
        // an operation in flight).
        drop(grants);
    }
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offer")
            .field("id", &self.id())
            .field("revoked", &self.is_revoked())
            .field("holders", &self.holders())
            .field("metadata", &self.inner.meta)
            .finish()
    }
}
