//! Encoding frames: [`Message::encode`] and the lists it writes compactly
//! (sizes as runs, lease addresses in the shorter of two forms, chosen
//! when the [`Segments`] were made).

use super::segments::Addresses;
use super::*;

fn put_header(out: &mut Vec<u8>, ty: u8, body_len: usize) {
    out.extend_from_slice(&[ty, 0, 0, 0]);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
}

/// Runs as a run count (u32) and `(size u64, count u32)` per run.
pub(super) fn put_runs(out: &mut Vec<u8>, runs: &[(u64, u32)]) {
    out.reserve(4 + runs.len() * 12);
    out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for &(size, count) in runs {
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
    }
}

/// The addresses of a lease, in the form they are kept in.
fn put_addresses(out: &mut Vec<u8>, segments: &Segments) {
    match segments.addrs() {
        Addresses::Runs(runs) => {
            out.push(ADDRESSES_RUNS);
            put_runs(out, runs);
        }
        Addresses::Each(addrs) => {
            out.push(ADDRESSES_EACH);
            // Reserved at once: a lease of many blocks is megabytes, and
            // growing by doubling would copy (and fault in) it repeatedly.
            out.reserve(addrs.len() * 8);
            for addr in addrs {
                out.extend_from_slice(&addr.to_le_bytes());
            }
        }
    }
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Message {
    /// Appends this frame (header and body; never a `Data` payload) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_header(out, 0, 0);
        let ty = match self {
            Message::Hello(h) => {
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&h.version.to_le_bytes());
                let id = truncate_utf8(&h.worker_id, MAX_WORKER_ID);
                out.extend_from_slice(&(id.len() as u16).to_le_bytes());
                out.extend_from_slice(id.as_bytes());
                T_HELLO
            }
            Message::Open(o) => {
                out.extend_from_slice(&o.req.to_le_bytes());
                out.extend_from_slice(&o.op_id.to_le_bytes());
                out.extend_from_slice(o.token.as_bytes());
                out.push(o.kind.as_u8());
                out.push(u8::from(o.pull));
                out.extend_from_slice(&o.part.to_le_bytes());
                out.extend_from_slice(&o.parts.to_le_bytes());
                put_runs(out, o.sizes.as_runs());
                T_OPEN
            }
            Message::Data(d) => {
                out.extend_from_slice(&d.req.to_le_bytes());
                out.extend_from_slice(&d.desc.to_le_bytes());
                out.extend_from_slice(&d.offset.to_le_bytes());
                out.extend_from_slice(&d.len.to_le_bytes());
                T_DATA
            }
            Message::Finish { req } => {
                out.extend_from_slice(&req.to_le_bytes());
                T_FINISH
            }
            Message::Abort(a) => {
                out.extend_from_slice(&a.req.to_le_bytes());
                out.push(a.reason.code());
                let d = truncate_utf8(&a.detail, MAX_DETAIL);
                out.extend_from_slice(&(d.len() as u16).to_le_bytes());
                out.extend_from_slice(d.as_bytes());
                T_ABORT
            }
            Message::Auth(a) => {
                let n = a.handshake.len().min(MAX_HANDSHAKE);
                out.extend_from_slice(&(n as u16).to_le_bytes());
                out.extend_from_slice(&a.handshake[..n]);
                T_AUTH
            }
            Message::Lease(l) => {
                out.extend_from_slice(&l.req.to_le_bytes());
                out.push(l.lane.0);
                let key = &l.key[..l.key.len().min(MAX_LEASE_KEY)];
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key);
                put_runs(out, l.segments.lens().as_runs());
                put_addresses(out, &l.segments);
                T_LEASE
            }
            Message::LaneOffer(o) => {
                let b = &o.bytes[..o.bytes.len().min(MAX_LANE_OFFER)];
                out.push(o.lane.0);
                out.push(o.round);
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
                T_LANE_OFFER
            }
            Message::Release { req } => {
                out.extend_from_slice(&req.to_le_bytes());
                T_RELEASE
            }
            Message::Ping => T_PING,
            Message::Pong => T_PONG,
            Message::Digest(d) => {
                out.extend_from_slice(&d.req.to_le_bytes());
                let (algo, value) = match d.crc32 {
                    Some(v) => (DIGEST_CRC32, v),
                    None => (DIGEST_NONE, 0),
                };
                out.push(algo);
                out.extend_from_slice(&value.to_le_bytes());
                T_DIGEST
            }
            Message::GrantRequest(r) => {
                super::grant::encode_request(r, out);
                super::grant::T_GRANT_REQUEST
            }
            Message::GrantReply(r) => {
                super::grant::encode_reply(r, out);
                super::grant::T_GRANT_REPLY
            }
            Message::OfferClaim(c) => {
                super::offer::encode_claim(c, out);
                super::offer::T_OFFER_CLAIM
            }
            Message::OfferReply(r) => {
                super::offer::encode_reply(r, out);
                super::offer::T_OFFER_REPLY
            }
        };
        let body_len = out.len() - start - HEADER_LEN;
        out[start] = ty;
        out[start + 4..start + 8].copy_from_slice(&(body_len as u32).to_le_bytes());
    }

    /// This frame as a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(32);
        self.encode(&mut v);
        v
    }
}
