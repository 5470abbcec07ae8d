//! A connector's offers (owner side) and claims (claimer side): see
//! [`Offer`](crate::Offer) and `docs/grants.md`, "Offers".

use ferry_proto::grant::claim;
use ferry_proto::wire::{OfferAnswer, OfferClaim};
use ferry_proto::{DescriptorInfo, Device, OperationKind, RdmaMetadata};

use super::Connector;
use crate::grant::{GrantLane, OfferMetadata, OfferOptions};
use crate::{Error, GrantError, Offer, Pool, RemoteGrant, Result};

impl Connector {
    /// Offers `pool`'s blocks to any worker that has the offer's
    /// [`metadata`](Offer::metadata): each claims a grant of its own
    /// ([`claim`](Self::claim)), which this connector's runtime makes,
    /// bound to the claiming connection's worker id, with `opts`' rights,
    /// expiry and lanes. Claims travel over TCP: the connector must listen
    /// ([`GrantError::NoLane`] otherwise).
    pub fn offer(&self, pool: &Pool, opts: OfferOptions) -> Result<Offer> {
        let host = &self.inner._host;
        crate::grant::create_offer(
            (&self.inner.worker_id, &self.inner.host_id),
            pool,
            opts,
            (&host.offers, &host.grants),
            self.inner.advertised.clone(),
        )
    }

    /// Claims a grant of the offer `meta` for this worker: asks the
    /// offer's owner over this connector's (authenticated) connection,
    /// checks that the grant it answers is the offer's and bound to this
    /// worker, and opens it ([`open_grant`](Self::open_grant): cross-memory
    /// attach on the same host, else UCX where offered, else TCP). Claiming
    /// again gets a fresh grant, which replaces (revokes) the previous one.
    /// Refusals are typed: [`GrantError::Forged`] (a token that is not
    /// the offer's), [`GrantError::Revoked`], [`GrantError::Expired`].
    pub async fn claim(&self, meta: &OfferMetadata) -> Result<RemoteGrant> {
        self.claim_via(meta, GrantLane::Any).await
    }

    /// [`claim`](Self::claim), opening the grant by lane `via` only.
    pub async fn claim_via(&self, meta: &OfferMetadata, via: GrantLane) -> Result<RemoteGrant> {
        meta.validate()?;
        let owner = RdmaMetadata::new(
            OperationKind::Read,
            meta.owner.clone(),
            meta.host_id.clone(),
            meta.host_id.clone(),
            meta.tcp.clone(),
            meta.offer.0,
            meta.token,
            vec![DescriptorInfo::new(Device::CPU, meta.block_size)],
        )
        .map_err(|e| GrantError::Malformed(e.to_string()))?;
        let c = OfferClaim {
            req: 0,
            offer: meta.offer.0,
            token: meta.token,
        };
        let answer = self.inner.transports.tcp().offer_call(&owner, c).await?;
        match answer {
            OfferAnswer::Granted(g) => {
                claim::granted(meta, &self.inner.worker_id, &g)?;
                self.open_grant_via(&g, via).await
            }
            OfferAnswer::Refused(e) => Err(Error::Grant(e)),
        }
    }
}
