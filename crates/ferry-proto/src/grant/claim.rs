//! Claiming a grant from an offer, without IO: what the owner's runtime
//! checks of a worker's [`OfferClaim`] before it makes that worker a grant
//! ([`check`]), and what the claimer checks of the grant it gets back
//! ([`granted`]).
//!
//! The grant the owner makes is bound to the worker id of the connection
//! the claim came over (its handshake's, authenticated with a shared
//! secret), never to a name the claim carries: a claim carries none.

use super::{check as checks, GrantError, GrantMetadata, OfferMetadata};
use crate::wire::OfferClaim;
use crate::Token;

/// What the owner keeps of an offer, to check claims against.
#[derive(Debug, Clone, Copy)]
pub struct Offered<'a> {
    /// The offer's secret.
    pub token: &'a Token,
    /// Whether the offer was revoked (or dropped).
    pub revoked: bool,
    /// When it expires (unix milliseconds).
    pub expires_at_ms: Option<u64>,
}

/// Checks claim `c` of worker `peer` (the connection's peer, as its
/// handshake authenticated it) against offer `o` at `now_ms`. Refusals, in
/// this order: a wrong token ([`GrantError::Forged`]: the same refusal as
/// for an offer the owner does not have, so that it tells nothing of other
/// offers), a revoked offer ([`GrantError::Revoked`]), an expired one
/// ([`GrantError::Expired`]), a connection without a worker id
/// ([`GrantError::Unbound`]: there is nobody to bind the grant to).
pub fn check(o: &Offered<'_>, peer: &str, c: &OfferClaim, now_ms: u64) -> Result<(), GrantError> {
    if !c.token.ct_eq(o.token) {
        return Err(GrantError::Forged { what: "token" });
    }
    if o.revoked {
        return Err(GrantError::Revoked);
    }
    checks::expiry(o.expires_at_ms, now_ms)?;
    if peer.is_empty() {
        return Err(GrantError::Unbound);
    }
    Ok(())
}

/// The claimer's check of the grant an owner answered its claim with: the
/// offer's owner, bound to this worker `me`, with the offer's shape and no
/// more than its rights. [`GrantError::Malformed`] otherwise.
pub fn granted(offer: &OfferMetadata, me: &str, g: &GrantMetadata) -> Result<(), GrantError> {
    let bad = |what: &str| {
        Err(GrantError::Malformed(format!(
            "the owner answered the claim with a grant of another {what}"
        )))
    };
    if g.owner != offer.owner || g.host_id != offer.host_id {
        return bad("owner");
    }
    if g.holder.as_deref() != Some(me) {
        return bad("holder");
    }
    if !offer.rights.allows(g.rights) {
        return bad("rights");
    }
    if (g.block_size, g.block_count, g.device)
        != (offer.block_size, offer.block_count, offer.device)
    {
        return bad("shape");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::tests::sample_metadata;
    use crate::grant::Rights;

    fn claim(token: [u8; 16]) -> OfferClaim {
        OfferClaim {
            req: 1,
            offer: 3,
            token: Token::from_bytes(token),
        }
    }

    #[test]
    fn every_refusal_is_typed_and_in_order() {
        let t = Token::from_bytes([7; 16]);
        let live = Offered {
            token: &t,
            revoked: false,
            expires_at_ms: Some(1_000),
        };
        assert_eq!(check(&live, "decode-0", &claim([7; 16]), 10), Ok(()));
        let revoked = Offered {
            revoked: true,
            ..live
        };
        // A wrong token says nothing of the offer, revoked or not.
        for o in [&live, &revoked] {
            assert_eq!(
                check(o, "decode-0", &claim([8; 16]), 10_000),
                Err(GrantError::Forged { what: "token" })
            );
        }
        assert_eq!(
            check(&revoked, "decode-0", &claim([7; 16]), 10_000),
            Err(GrantError::Revoked)
        );
        assert!(matches!(
            check(&live, "decode-0", &claim([7; 16]), 1_000),
            Err(GrantError::Expired { .. })
        ));
        assert_eq!(
            check(&live, "", &claim([7; 16]), 10),
            Err(GrantError::Unbound)
        );
    }

    #[test]
    fn a_claimer_takes_only_a_grant_of_the_offer_for_itself() {
        let offer = crate::grant::offer::tests::sample();
        let mut g = sample_metadata();
        g.owner = offer.owner.clone();
        g.host_id = offer.host_id.clone();
        g.block_size = offer.block_size;
        g.block_count = offer.block_count;
        g.holder = Some("decode-3".into());
        assert_eq!(granted(&offer, "decode-3", &g), Ok(()));
        assert!(granted(&offer, "decode-4", &g).is_err());
        let mut other = g.clone();
        other.owner = "mallory".into();
        assert!(granted(&offer, "decode-3", &other).is_err());
        let mut bigger = g.clone();
        bigger.block_count += 1;
        assert!(granted(&offer, "decode-3", &bigger).is_err());
        let read_only = crate::grant::OfferMetadata {
            rights: Rights::READ,
            ..offer
        };
        assert!(granted(&read_only, "decode-3", &g).is_err());
    }
}
