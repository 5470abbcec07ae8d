//! Offers: what the owner of registered memory publishes for any number of
//! workers, each of which presents it to the owner's runtime (an
//! [`OfferClaim`](crate::wire::OfferClaim) over its authenticated
//! connection) and gets a grant of its own, bound to its authenticated
//! worker id ([`claim::check`](super::claim::check)).

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{GrantError, Rights, MAX_TCP_ADDRESSES};
use crate::{Device, Token};

/// The offer metadata format this build writes and reads.
pub const OFFER_VERSION: u32 = 1;
/// The longest offer metadata, encoded (JSON), in bytes.
pub const MAX_OFFER_JSON: usize = 1024;
/// The longest worker or host id an offer names.
const MAX_NAME: usize = 256;
/// The largest block (1 TiB) and the largest offered memory (256 TiB).
const MAX_BLOCK: u64 = 1 << 40;
const MAX_TOTAL: u64 = 1 << 48;

/// The name of an offer, unique within its owner's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OfferId(pub u64);

impl fmt::Display for OfferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "offer {}", self.0)
    }
}

/// What the owner of an offer publishes: any worker that has it may claim
/// a grant of its own over the offered memory, with the offer's rights and
/// expiry, bound to its own (authenticated) worker id. JSON of at most
/// [`MAX_OFFER_JSON`] (1 KiB) bytes whatever the pool size. It is a
/// capability for everyone who reads it (its `Debug` hides the token):
/// publish it only where every reader may have the offered rights.
///
/// Parsing is total: any text gives an offer or a typed [`GrantError`].
///
/// ```
/// use ferry_proto::grant::{GrantError, OfferMetadata};
/// assert!(matches!(OfferMetadata::from_json("{}"), Err(GrantError::Malformed(_))));
/// assert!(matches!(
///     OfferMetadata::from_json(&"x".repeat(2000)),
///     Err(GrantError::TooLarge { .. })
/// ));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct OfferMetadata {
    /// The owner's worker id.
    pub owner: String,
    /// The owner's host (its boot id).
    pub host_id: String,
    /// The offer's name in the owner's process.
    pub offer: OfferId,
    /// The offer's secret, presented with each claim.
    pub token: Token,
    /// What each claimer's grant allows.
    pub rights: Rights,
    /// When the offer (and every grant made from it) ends by itself (unix
    /// milliseconds), if ever.
    pub expires_at_ms: Option<u64>,
    /// Bytes per block.
    pub block_size: u64,
    /// How many blocks.
    pub block_count: u32,
    /// Where the memory lives.
    pub device: Device,
    /// The owner connector's advertised addresses, where claims go (1 to
    /// [`MAX_TCP_ADDRESSES`]).
    pub tcp: Vec<SocketAddr>,
}

impl fmt::Debug for OfferMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OfferMetadata")
            .field("owner", &self.owner)
            .field("offer", &self.offer)
            .field("rights", &self.rights)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .field("device", &self.device)
            .field("tcp", &self.tcp)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOffer {
    version: u32,
    owner: String,
    host_id: String,
    offer: u64,
    token: String,
    rights: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<u64>,
    block_size: u64,
    block_count: u32,
    device: Device,
    tcp: Vec<SocketAddr>,
}

fn check_name(s: &str, field: &str) -> Result<(), GrantError> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err(GrantError::Malformed(format!(
            "{field} must be 1 to {MAX_NAME} bytes long"
        )));
    }
    Ok(())
}

fn too_large(len: usize) -> Result<(), GrantError> {
    if len > MAX_OFFER_JSON {
        return Err(GrantError::TooLarge {
            len,
            max: MAX_OFFER_JSON,
        });
    }
    Ok(())
}

impl OfferMetadata {
    /// Checks every field as [`from_json`](Self::from_json) does.
    pub fn validate(&self) -> Result<(), GrantError> {
        check_name(&self.owner, "owner")?;
        check_name(&self.host_id, "host_id")?;
        if self.rights.is_empty() {
            return Err(GrantError::Malformed("an offer of no rights".into()));
        }
        if self.block_size == 0 || self.block_size > MAX_BLOCK {
            return Err(GrantError::Malformed(format!(
                "block size {} (1 to {MAX_BLOCK})",
                self.block_size
            )));
        }
        if self.block_count == 0 {
            return Err(GrantError::Malformed("an offer of no blocks".into()));
        }
        self.block_size
            .checked_mul(u64::from(self.block_count))
            .filter(|&t| t <= MAX_TOTAL)
            .ok_or_else(|| GrantError::Malformed("more than 256 TiB offered".into()))?;
        if self.tcp.is_empty() || self.tcp.len() > MAX_TCP_ADDRESSES {
            return Err(GrantError::Malformed(format!(
                "an offer must carry 1 to {MAX_TCP_ADDRESSES} addresses of its owner"
            )));
        }
        Ok(())
    }

    /// The bytes offered: `block_size * block_count`.
    pub fn size(&self) -> u64 {
        self.block_size.saturating_mul(u64::from(self.block_count))
    }

    /// Encodes the offer as JSON, of at most [`MAX_OFFER_JSON`] bytes
    /// ([`GrantError::TooLarge`] past it).
    pub fn to_json(&self) -> Result<String, GrantError> {
        self.validate()?;
        let raw = RawOffer {
            version: OFFER_VERSION,
            owner: self.owner.clone(),
            host_id: self.host_id.clone(),
            offer: self.offer.0,
            token: self.token.to_hex(),
            rights: self.rights.bits(),
            expires_at_ms: self.expires_at_ms,
            block_size: self.block_size,
            block_count: self.block_count,
            device: self.device,
            tcp: self.tcp.clone(),
        };
        let s = serde_json::to_string(&raw).map_err(|e| GrantError::Malformed(e.to_string()))?;
        too_large(s.len())?;
        Ok(s)
    }

    /// [`to_json`](Self::to_json) as bytes.
    pub fn encode(&self) -> Result<Vec<u8>, GrantError> {
        self.to_json().map(String::into_bytes)
    }

    /// Parses offer metadata: an offer, or a typed error for any input
    /// (never a panic).
    pub fn from_json(s: &str) -> Result<OfferMetadata, GrantError> {
        too_large(s.len())?;
        let raw: RawOffer = serde_json::from_str(s).map_err(|e| {
            let mut m = e.to_string();
            m.truncate(200);
            GrantError::Malformed(m)
        })?;
        if raw.version != OFFER_VERSION {
            return Err(GrantError::Malformed(format!(
                "offer version {} (this build reads {OFFER_VERSION})",
                raw.version
            )));
        }
        let token = Token::from_hex(&raw.token)
            .ok_or_else(|| GrantError::Malformed("the token is not 32 hex digits".into()))?;
        let m = OfferMetadata {
            owner: raw.owner,
            host_id: raw.host_id,
            offer: OfferId(raw.offer),
            token,
            rights: Rights::try_from(raw.rights)?,
            expires_at_ms: raw.expires_at_ms,
            block_size: raw.block_size,
            block_count: raw.block_count,
            device: raw.device,
            tcp: raw.tcp,
        };
        m.validate()?;
        Ok(m)
    }

    /// [`from_json`](Self::from_json) of bytes (which must be UTF-8).
    pub fn decode(b: &[u8]) -> Result<OfferMetadata, GrantError> {
        too_large(b.len())?;
        let s = std::str::from_utf8(b)
            .map_err(|_| GrantError::Malformed("offer metadata is not UTF-8".into()))?;
        Self::from_json(s)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use proptest::prelude::*;

    use super::*;

    pub(crate) fn sample() -> OfferMetadata {
        OfferMetadata {
            owner: "prefill-0".into(),
            host_id: "0b1e5a9c-6a57-4e9b-9c3e-2f1f1a0c7e11".into(),
            offer: OfferId(3),
            token: Token::from_bytes([0xab; 16]),
            rights: Rights::READ_WRITE,
            expires_at_ms: Some(1_800_000_000_000),
            block_size: 32768,
            block_count: 16384,
            device: Device::CPU,
            tcp: vec!["10.0.0.7:7100".parse().unwrap()],
        }
    }

    #[test]
    fn offers_round_trip_and_hide_their_token() {
        let m = sample();
        let json = m.to_json().unwrap();
        assert_eq!(OfferMetadata::from_json(&json).unwrap(), m);
        assert_eq!(OfferMetadata::decode(&m.encode().unwrap()).unwrap(), m);
        let forever = OfferMetadata {
            expires_at_ms: None,
            ..sample()
        };
        let json = forever.to_json().unwrap();
        assert!(!json.contains("expires"));
        assert_eq!(OfferMetadata::from_json(&json).unwrap(), forever);
        assert!(!format!("{m:?}").contains("abab"));
    }

    #[test]
    fn offers_are_small_whatever_the_pool_size() {
        let m = OfferMetadata {
            owner: "o".repeat(256),
            host_id: "h".repeat(256),
            offer: OfferId(u64::MAX),
            expires_at_ms: Some(u64::MAX),
            block_size: 1 << 40,
            block_count: 256,
            device: Device::cuda(u32::MAX),
            tcp: vec![
                "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
                    .parse()
                    .unwrap();
                4
            ],
            ..sample()
        };
        assert!(m.to_json().unwrap().len() <= MAX_OFFER_JSON);
        let many = OfferMetadata {
            tcp: vec![
                "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
                    .parse()
                    .unwrap();
                8
            ],
            ..m
        };
        assert!(matches!(many.to_json(), Err(GrantError::TooLarge { .. })));
    }

    #[test]
    fn invalid_offers_are_refused_typed() {
        for bad in [
            OfferMetadata {
                owner: String::new(),
                ..sample()
            },
            OfferMetadata {
                rights: Rights::NONE,
                ..sample()
            },
            OfferMetadata {
                block_size: 0,
                ..sample()
            },
            OfferMetadata {
                block_count: 0,
                ..sample()
            },
            OfferMetadata {
                block_size: 1 << 40,
                block_count: 1 << 20,
                ..sample()
            },
            OfferMetadata {
                tcp: Vec::new(),
                ..sample()
            },
        ] {
            assert!(matches!(bad.to_json(), Err(GrantError::Malformed(_))));
        }
        let json = sample().to_json().unwrap();
        for (from, to) in [
            ("\"version\":1", "\"version\":2"),
            ("\"rights\":3", "\"rights\":4"),
            ("abab", "zzab"),
            ("\"block_count\":16384", "\"block_count\":-1"),
            ("\"offer\":3", "\"offer\":3,\"holder\":\"x\""),
        ] {
            let edited = json.replacen(from, to, 1);
            assert_ne!(edited, json);
            assert!(matches!(
                OfferMetadata::from_json(&edited),
                Err(GrantError::Malformed(_))
            ));
        }
        assert!(matches!(
            OfferMetadata::decode(&[0xff, 0xfe]),
            Err(GrantError::Malformed(_))
        ));
        assert!(matches!(
            OfferMetadata::decode(&[b' '; 1025]),
            Err(GrantError::TooLarge { len: 1025, .. })
        ));
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_typed(b in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = OfferMetadata::decode(&b);
        }

        #[test]
        fn truncated_or_flipped_offers_never_panic(cut in 0usize..400, at in 0usize..400, bit in 0u8..8) {
            let good = sample().encode().unwrap();
            let cut = cut.min(good.len());
            let _ = OfferMetadata::decode(&good[..cut]);
            let mut f = good.clone();
            let at = at % f.len();
            f[at] ^= 1 << bit;
            if let Ok(m) = OfferMetadata::decode(&f) {
                prop_assert!(m.validate().is_ok());
            }
        }
    }
}
