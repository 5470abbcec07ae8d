//! The two frames of a claim on an offer (protocol 16): the claimer's
//! [`OfferClaim`] and the owner's [`OfferReply`], one round trip.
//!
//! A claim names the offer and presents its token; it names no worker:
//! the owner binds the grant it makes to the connection's peer, as the
//! handshake authenticated it ([`grant::claim`](crate::grant::claim)).

use super::decode::Reader;
use super::grant::{put_str, refusal, refusal_parts};
use super::*;
use crate::grant::{GrantError, GrantMetadata, MAX_GRANT_JSON};

pub(super) const T_OFFER_CLAIM: u8 = 17;
pub(super) const T_OFFER_REPLY: u8 = 18;

/// A claim: req, offer, token.
pub(super) const CLAIM_BODY: u32 = 8 + 8 + 16;
/// A reply: req, status, then a grant's metadata (u16 length and JSON)
/// or a refusal (code, three numbers, two texts of at most
/// [`MAX_DETAIL`] bytes).
pub(super) const MAX_OFFER_REPLY_BODY: u32 = (8 + 1 + 1 + 24 + 2 * (2 + MAX_DETAIL)) as u32;

const GRANTED: u8 = 0;
const REFUSED: u8 = 2;

/// A worker asks the owner of an offer for a grant of its own.
#[derive(Clone, PartialEq, Eq)]
pub struct OfferClaim {
    /// The claimer's number for the claim, unique on the connection.
    pub req: u64,
    /// The offer, from its metadata.
    pub offer: u64,
    /// The offer's token, from its metadata.
    pub token: Token,
}

impl std::fmt::Debug for OfferClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfferClaim")
            .field("req", &self.req)
            .field("offer", &self.offer)
            .finish_non_exhaustive()
    }
}

/// How the owner answered an [`OfferClaim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfferAnswer {
    /// The grant made for the claimer (bound to it).
    Granted(Box<GrantMetadata>),
    /// Refused: no grant was made.
    Refused(GrantError),
}

/// The owner's answer to claim `req`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferReply {
    /// The claim.
    pub req: u64,
    /// What came of it.
    pub answer: OfferAnswer,
}

pub(super) fn encode_claim(c: &OfferClaim, out: &mut Vec<u8>) {
    out.extend_from_slice(&c.req.to_le_bytes());
    out.extend_from_slice(&c.offer.to_le_bytes());
    out.extend_from_slice(c.token.as_bytes());
}

pub(super) fn decode_claim(r: &mut Reader<'_>) -> Result<OfferClaim, WireError> {
    let req = r.u64()?;
    let offer = r.u64()?;
    let token = Token::from_bytes(r.take(16)?.try_into().expect("16 bytes"));
    Ok(OfferClaim { req, offer, token })
}

fn put_refusal(e: &GrantError, out: &mut Vec<u8>) {
    let (code, n, s) = refusal_parts(e);
    out.push(REFUSED);
    out.push(code);
    for v in n {
        out.extend_from_slice(&v.to_le_bytes());
    }
    put_str(out, s[0]);
    put_str(out, s[1]);
}

/// Encodes the reply. A grant whose metadata does not encode (it does
/// not validate, or is over 1 KiB) goes as the refusal that says why.
pub(super) fn encode_reply(r: &OfferReply, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.req.to_le_bytes());
    match &r.answer {
        OfferAnswer::Granted(g) => match g.to_json() {
            Ok(json) => {
                out.push(GRANTED);
                out.extend_from_slice(&(json.len() as u16).to_le_bytes());
                out.extend_from_slice(json.as_bytes());
            }
            Err(e) => put_refusal(&e, out),
        },
        OfferAnswer::Refused(e) => put_refusal(e, out),
    }
}

pub(super) fn decode_reply(r: &mut Reader<'_>) -> Result<OfferReply, WireError> {
    let req = r.u64()?;
    let answer = match r.u8()? {
        GRANTED => {
            let n = r.u16()? as usize;
            if n == 0 || n > MAX_GRANT_JSON {
                return Err(WireError::InvalidField("offer grant length"));
            }
            let g = GrantMetadata::decode(r.take(n)?)
                .map_err(|_| WireError::InvalidField("offer grant"))?;
            OfferAnswer::Granted(Box::new(g))
        }
        REFUSED => {
            let code = r.u8()?;
            let n = [r.u64()?, r.u64()?, r.u64()?];
            let s = [
                r.string(MAX_DETAIL, "refusal detail")?,
                r.string(MAX_DETAIL, "refusal detail")?,
            ];
            OfferAnswer::Refused(refusal(code, n, s)?)
        }
        _ => return Err(WireError::InvalidField("offer reply status")),
    };
    Ok(OfferReply { req, answer })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::{GrantId, Rights};

    fn grant() -> GrantMetadata {
        GrantMetadata {
            owner: "prefill-0".into(),
            host_id: "h".into(),
            grant: GrantId(4),
            token: Token::from_bytes([1; 16]),
            holder: Some("decode-1".into()),
            rights: Rights::WRITE,
            expires_at_ms: None,
            block_size: 4096,
            block_count: 8,
            device: crate::Device::CPU,
            cma: None,
            cuda_ipc: None,
            tcp: Some(crate::grant::TcpGrant {
                addresses: vec!["127.0.0.1:9".parse().unwrap()],
            }),
            ucx: None,
        }
    }

    fn round_trip(m: &Message) {
        let v = m.to_vec();
        assert_eq!(decode_frame(&v), Ok(Some((m.clone(), v.len()))));
        for cut in 0..v.len() {
            assert_eq!(decode_frame(&v[..cut]), Ok(None));
        }
        let h = decode_header(v[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert!(h.body_len <= max_body(v[0]));
        for cut in 0..v.len() - HEADER_LEN {
            let short = Header {
                body_len: cut as u32,
                ..h
            };
            assert!(decode_body(short, &v[HEADER_LEN..HEADER_LEN + cut]).is_err());
        }
    }

    fn decode(ty: u8, body: &[u8]) -> Result<Message, WireError> {
        let mut h = [ty, 0, 0, 0, 0, 0, 0, 0];
        h[4..].copy_from_slice(&(body.len() as u32).to_le_bytes());
        decode_body(decode_header(&h)?, body)
    }

    #[test]
    fn claims_and_replies_round_trip() {
        round_trip(&Message::OfferClaim(OfferClaim {
            req: 7,
            offer: 3,
            token: Token::from_bytes([9; 16]),
        }));
        for answer in [
            OfferAnswer::Granted(Box::new(grant())),
            OfferAnswer::Refused(GrantError::Revoked),
            OfferAnswer::Refused(GrantError::Forged { what: "token" }),
            OfferAnswer::Refused(GrantError::TooManyHolders { max: 256 }),
            OfferAnswer::Refused(GrantError::Expired {
                at_ms: 1,
                now_ms: 2,
            }),
            OfferAnswer::Refused(GrantError::Malformed("x".repeat(5000))),
        ] {
            let m = Message::OfferReply(OfferReply { req: 1, answer });
            let v = m.to_vec();
            let (back, _) = decode_frame(&v).unwrap().unwrap();
            // Texts are cut at MAX_DETAIL; everything else round trips.
            if let Message::OfferReply(OfferReply {
                answer: OfferAnswer::Refused(GrantError::Malformed(s)),
                ..
            }) = &back
            {
                assert_eq!(s.len(), MAX_DETAIL);
            } else {
                round_trip(&m);
            }
        }
        // A grant that does not encode goes as the refusal that says why.
        let mut bad = grant();
        bad.block_count = 0;
        let v = Message::OfferReply(OfferReply {
            req: 1,
            answer: OfferAnswer::Granted(Box::new(bad)),
        })
        .to_vec();
        assert!(matches!(
            decode_frame(&v),
            Ok(Some((
                Message::OfferReply(OfferReply {
                    answer: OfferAnswer::Refused(GrantError::Malformed(_)),
                    ..
                }),
                _
            )))
        ));
    }

    #[test]
    fn hostile_claims_and_replies_are_refused_typed() {
        // A claim of the wrong length.
        assert!(decode(T_OFFER_CLAIM, &[0; 31]).is_err());
        assert_eq!(
            decode(T_OFFER_CLAIM, &[0; 33]),
            Err(WireError::BodyTooLarge(33))
        );
        let mut h = [T_OFFER_CLAIM, 0, 0, 0, 0, 0, 0, 0];
        h[4..].copy_from_slice(&(CLAIM_BODY + 1).to_le_bytes());
        assert_eq!(
            decode_header(&h),
            Err(WireError::BodyTooLarge(CLAIM_BODY + 1))
        );
        // Replies: an unknown status, an empty or oversize grant, a grant
        // that does not parse.
        let reply = |status: u8, rest: &[u8]| {
            let mut b = vec![0; 8];
            b.push(status);
            b.extend_from_slice(rest);
            decode(T_OFFER_REPLY, &b)
        };
        assert_eq!(
            reply(9, &[]),
            Err(WireError::InvalidField("offer reply status"))
        );
        assert_eq!(
            reply(GRANTED, &[0, 0]),
            Err(WireError::InvalidField("offer grant length"))
        );
        assert_eq!(
            reply(GRANTED, &1025u16.to_le_bytes()),
            Err(WireError::InvalidField("offer grant length"))
        );
        let mut junk = 3u16.to_le_bytes().to_vec();
        junk.extend_from_slice(b"{}x");
        assert_eq!(
            reply(GRANTED, &junk),
            Err(WireError::InvalidField("offer grant"))
        );
    }
}
