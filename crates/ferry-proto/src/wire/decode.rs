//! Decoding frames: headers checked first, then bodies, never panicking and
//! never allocating or working more than the bytes received allow (see the
//! module above).

use super::segments::{run_ends_fit, Addresses};
use super::*;

/// A checked frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub(super) ty: u8,
    /// Body length, at most the largest valid body of its type (at most
    /// [`MAX_BODY`]; a `Lease`: [`MAX_LEASE_BODY`]).
    pub body_len: u32,
}

impl Header {
    /// The frame's type.
    pub fn frame_type(&self) -> FrameType {
        FrameType::of(self.ty).unwrap_or_else(|| unreachable!("checked by decode_header"))
    }

    /// The request number at the start of the body of a frame of a type
    /// that starts with one ([`FrameType::starts_with_req`]), from the
    /// body's first bytes (`prefix`, at least 8 of them); nothing else of
    /// the body is looked at.
    pub fn req(&self, prefix: &[u8]) -> Option<u64> {
        if !self.frame_type().starts_with_req() || self.body_len < 8 {
            return None;
        }
        Some(u64::from_le_bytes(prefix.get(..8)?.try_into().ok()?))
    }
}

/// Checks a frame header.
pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
    let ty = h[0];
    if FrameType::of(ty).is_none() {
        return Err(WireError::UnknownType(ty));
    }
    if h[1..4] != [0, 0, 0] {
        return Err(WireError::Reserved);
    }
    let body_len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if body_len > max_body(ty) {
        return Err(WireError::BodyTooLarge(body_len));
    }
    Ok(Header { ty, body_len })
}

pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(super) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub(super) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(super) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(super) fn string(&mut self, max: usize, field: &'static str) -> Result<String, WireError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(WireError::InvalidField(field));
        }
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::InvalidField(field))
    }
    /// `n` pairs of `(u64, u32)`, after checking that their bytes are
    /// there: what is allocated follows the bytes received.
    fn pairs(&mut self, n: usize) -> Result<Vec<(u64, u32)>, WireError> {
        if self.0.len() < n.saturating_mul(12) {
            return Err(WireError::Truncated);
        }
        (0..n).map(|_| Ok((self.u64()?, self.u32()?))).collect()
    }
    /// Sizes written as runs: at least one run, at most [`MAX_RUNS`], at
    /// most `max` sizes in all. Kept as runs: nothing is expanded.
    fn runs(&mut self, max: usize, field: &'static str) -> Result<Runs, WireError> {
        let n = self.u32()? as usize;
        if n == 0 || n > MAX_RUNS {
            return Err(WireError::InvalidField(field));
        }
        let runs = self.pairs(n)?;
        Runs::new(runs, max).map_err(|_| WireError::InvalidField(field))
    }
    /// The rest of the body: the addresses of segments of lengths `lens`,
    /// in either form (see [`Lease::segments`]), kept in that form. A run
    /// that claims more segments than there are, or whose addresses
    /// overflow, is refused, in one step per run.
    fn addresses(&mut self, lens: Runs) -> Result<Segments, WireError> {
        let n = lens.len();
        let exact = |r: &Self, want: usize| match r.0.len() {
            l if l < want => Err(WireError::Truncated),
            l if l > want => Err(WireError::Trailing(l - want)),
            _ => Ok(()),
        };
        let addrs = match self.u8()? {
            ADDRESSES_EACH => {
                exact(self, n * 8)?;
                Addresses::Each(
                    self.take(n * 8)?
                        .chunks_exact(8)
                        .map(|a| u64::from_le_bytes(a.try_into().expect("8 bytes")))
                        .collect(),
                )
            }
            ADDRESSES_RUNS => {
                let m = self.u32()? as usize;
                if m == 0 || m > n {
                    return Err(WireError::InvalidField("address run count"));
                }
                exact(self, m * 12)?;
                let runs = self.pairs(m)?;
                run_ends_fit(&lens, &runs).map_err(WireError::InvalidField)?;
                Addresses::Runs(runs)
            }
            _ => return Err(WireError::InvalidField("lease address form")),
        };
        Ok(Segments::from_parts(lens, addrs))
    }
    fn end(self) -> Result<(), WireError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing(self.0.len()))
        }
    }
}

/// Decodes the body of a frame whose header was checked by [`decode_header`].
pub fn decode_body(h: Header, body: &[u8]) -> Result<Message, WireError> {
    if body.len() != h.body_len as usize {
        return Err(WireError::Truncated);
    }
    let mut r = Reader(body);
    let msg = match h.ty {
        T_HELLO => {
            if r.take(MAGIC.len()).map_err(|_| WireError::BadMagic)? != MAGIC {
                return Err(WireError::BadMagic);
            }
            let version = r.u16()?;
            let worker_id = r.string(MAX_WORKER_ID, "worker_id")?;
            Message::Hello(Hello { version, worker_id })
        }
        T_OPEN => {
            let req = r.u64()?;
            let op_id = r.u64()?;
            let token = Token::from_bytes(r.take(16)?.try_into().unwrap());
            let kind = OperationKind::from_u8(r.u8()?).ok_or(WireError::InvalidField("kind"))?;
            let pull = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(WireError::InvalidField("pull")),
            };
            let (part, parts) = (r.u16()?, r.u16()?);
            if parts == 0 || parts > MAX_PARTS || part >= parts || (pull && parts > 1) {
                return Err(WireError::InvalidField("part"));
            }
            let sizes = r.runs(MAX_DESCRIPTORS, "descriptor count")?;
            Message::Open(Open {
                req,
                op_id,
                token,
                kind,
                sizes,
                pull,
                part,
                parts,
            })
        }
        T_DATA => {
            let d = Data {
                req: r.u64()?,
                desc: r.u32()?,
                offset: r.u64()?,
                len: r.u32()?,
            };
            if d.len > MAX_CHUNK {
                return Err(WireError::InvalidField("data length"));
            }
            Message::Data(d)
        }
        T_FINISH => Message::Finish { req: r.u64()? },
        T_ABORT => {
            let req = r.u64()?;
            let reason = AbortReason::from_code(r.u8()?);
            let detail = r.string(MAX_DETAIL, "detail")?;
            Message::Abort(Abort {
                req,
                reason,
                detail,
            })
        }
        T_AUTH => {
            let n = r.u16()? as usize;
            if n > MAX_HANDSHAKE {
                return Err(WireError::InvalidField("handshake"));
            }
            Message::Auth(Auth {
                handshake: r.take(n)?.to_vec(),
            })
        }
        T_LEASE => {
            let req = r.u64()?;
            let lane = LaneId(r.u8()?);
            let n = r.u32()? as usize;
            if n > MAX_LEASE_KEY {
                return Err(WireError::InvalidField("lease key"));
            }
            let key = r.take(n)?.to_vec();
            let lens = r.runs(MAX_LEASE_SEGMENTS, "segment count")?;
            let segments = r.addresses(lens)?;
            Message::Lease(Lease {
                req,
                lane,
                segments,
                key,
            })
        }
        T_LANE_OFFER => {
            let lane = LaneId(r.u8()?);
            let round = r.u8()?;
            let n = r.u32()? as usize;
            if n > MAX_LANE_OFFER {
                return Err(WireError::InvalidField("lane offer length"));
            }
            let bytes = r.take(n)?.to_vec();
            Message::LaneOffer(LaneOffer { lane, round, bytes })
        }
        T_RELEASE => Message::Release { req: r.u64()? },
        T_PING => Message::Ping,
        T_PONG => Message::Pong,
        T_DIGEST => {
            let req = r.u64()?;
            let algo = r.u8()?;
            let value = r.u32()?;
            let crc32 = match algo {
                DIGEST_NONE if value == 0 => None,
                DIGEST_CRC32 => Some(value),
                _ => return Err(WireError::InvalidField("digest")),
            };
            Message::Digest(Digest { req, crc32 })
        }
        grant::T_GRANT_REQUEST => Message::GrantRequest(grant::decode_request(&mut r)?),
        grant::T_GRANT_REPLY => Message::GrantReply(grant::decode_reply(&mut r)?),
        offer::T_OFFER_CLAIM => Message::OfferClaim(offer::decode_claim(&mut r)?),
        offer::T_OFFER_REPLY => Message::OfferReply(offer::decode_reply(&mut r)?),
        other => return Err(WireError::UnknownType(other)),
    };
    r.end()?;
    Ok(msg)
}

/// Decodes one frame from the front of `buf`: `Ok(None)` if more bytes are
/// needed, else the message and the number of bytes used (for `Data`, the
/// payload is not included).
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Message, usize)>, WireError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let header = decode_header(h.try_into().unwrap())?;
    let end = HEADER_LEN + header.body_len as usize;
    let Some(body) = buf.get(HEADER_LEN..end) else {
        return Ok(None);
    };
    Ok(Some((decode_body(header, body)?, end)))
}
