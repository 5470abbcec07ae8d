//! The two frames of a grant served over TCP (protocol 15): the holder's
//! [`GrantRequest`] and the owner's [`GrantReply`], one round trip per
//! request, no `Open`, `Lease` or `Finish`.
//!
//! A request moves at most [`MAX_TCP_CHUNK`] bytes of at most
//! [`MAX_TCP_BLOCKS`] blocks, carried in the frame's body (a WRITE's bytes
//! in the request, a READ's in the reply), so that one request never holds
//! the connection's other frames back for longer than a megabyte takes;
//! a holder splits a larger transfer into several requests
//! ([`grant::serve::chunks`](crate::grant::serve::chunks)).

use super::decode::Reader;
use super::*;
use crate::grant::{BlockRef, GrantError, Rights, MAX_NOTIFICATION, MAX_TCP_BLOCKS, MAX_TCP_CHUNK};

pub(super) const T_GRANT_REQUEST: u8 = 15;
pub(super) const T_GRANT_REPLY: u8 = 16;

/// The fixed fields of a request: req, grant, token, kind, flags, offset,
/// length, block count; then the blocks, the notification (u16 length and
/// bytes) and a WRITE's bytes.
const REQUEST_FIXED: usize = 8 + 8 + 16 + 1 + 1 + 8 + 4 + 4;
pub(super) const MAX_REQUEST_BODY: u32 =
    (REQUEST_FIXED + MAX_TCP_BLOCKS * 8 + 2 + MAX_NOTIFICATION + MAX_TCP_CHUNK) as u32;
/// A reply: req, status, then a READ's bytes (u32 length) or a refusal
/// (code, three numbers, two texts of at most [`MAX_DETAIL`] bytes).
pub(super) const MAX_REPLY_BODY: u32 = (8 + 1 + 4 + MAX_TCP_CHUNK) as u32;

const LAST: u8 = 1;
const NOTIFY: u8 = 2;

const DONE: u8 = 0;
const BYTES: u8 = 1;
const REFUSED: u8 = 2;

/// The holder of a grant asks its owner to read or write bytes of granted
/// blocks: the flat byte range `[offset, offset + len)` of the blocks
/// `blocks` taken in order (each at the generation it names).
#[derive(Clone, PartialEq, Eq)]
pub struct GrantRequest {
    /// The holder's number for the request, unique on the connection.
    pub req: u64,
    /// The grant, from its metadata.
    pub grant: u64,
    /// The grant's token, from its metadata.
    pub token: Token,
    /// READ (the reply carries the bytes) or WRITE (this frame does).
    pub kind: OperationKind,
    /// This request ends the holder's operation: its notification, if
    /// any, is queued after its bytes landed.
    pub last: bool,
    /// Where the range starts in the first named block's bytes, and
    /// following blocks' (less than the named blocks' total).
    pub offset: u64,
    /// How many bytes: 1 to [`MAX_TCP_CHUNK`] (0 for a bare notification).
    pub len: u32,
    /// The blocks, 1 to [`MAX_TCP_BLOCKS`] (none for a bare
    /// notification: `len` 0, `offset` 0, a notification, `last`).
    pub blocks: Vec<BlockRef>,
    /// The operation's notification payload (at most
    /// [`MAX_NOTIFICATION`] bytes), on its last request only: a WRITE's
    /// is queued after its bytes landed, a READ's after they were read.
    pub notify: Option<Vec<u8>>,
    /// A WRITE's bytes (exactly `len`); empty for a READ.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for GrantRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantRequest")
            .field("req", &self.req)
            .field("grant", &self.grant)
            .field("kind", &self.kind)
            .field("last", &self.last)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("blocks", &self.blocks.len())
            .field("notify", &self.notify.as_ref().map(Vec::len))
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// How the owner answered a [`GrantRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantAnswer {
    /// The WRITE landed (and its notification was queued).
    Done,
    /// The READ's bytes.
    Bytes(Vec<u8>),
    /// Refused: no byte moved (but see [`GrantError::NotificationsFull`]).
    Refused(GrantError),
}

/// The owner's answer to request `req`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantReply {
    /// The request.
    pub req: u64,
    /// What came of it.
    pub answer: GrantAnswer,
}

pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(MAX_DETAIL);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// Which fixed text a refusal's `what` was.
const WHATS: [&str; 4] = ["token", "block counts", "block sizes", "bytes"];

fn what_code(what: &str) -> u64 {
    WHATS.iter().position(|w| *w == what).unwrap_or(0) as u64
}

/// A refusal as a code, three numbers and two texts.
pub(super) fn refusal_parts(e: &GrantError) -> (u8, [u64; 3], [&str; 2]) {
    use GrantError as G;
    match e {
        G::Malformed(s) => (1, [0; 3], [s, ""]),
        G::Revoked => (2, [0; 3], ["", ""]),
        G::Expired { at_ms, now_ms } => (3, [*at_ms, *now_ms, 0], ["", ""]),
        G::NotYours { holder, me } => (4, [0; 3], [holder, me]),
        G::Unbound => (5, [0; 3], ["", ""]),
        G::Claimed { pid } => (6, [u64::from(*pid), 0, 0], ["", ""]),
        G::OutOfRange { index, count } => (7, [u64::from(*index), u64::from(*count), 0], ["", ""]),
        G::StaleGeneration {
            index,
            named,
            current,
        } => (
            8,
            [u64::from(*index), u64::from(*named), u64::from(*current)],
            ["", ""],
        ),
        G::RightsMissing { needed, granted } => (
            9,
            [u64::from(needed.bits()), u64::from(granted.bits()), 0],
            ["", ""],
        ),
        G::NoLane(s) => (10, [0; 3], [s, ""]),
        G::Forged { what } => (11, [what_code(what), 0, 0], ["", ""]),
        G::LengthMismatch {
            what,
            local,
            remote,
        } => (12, [what_code(what), *local, *remote], ["", ""]),
        G::NotificationTooLarge { len, max } => (13, [*len as u64, *max as u64, 0], ["", ""]),
        G::NotificationsFull { waited_ms } => (14, [*waited_ms, 0, 0], ["", ""]),
        G::OwnerGone(s) => (15, [0; 3], [s, ""]),
        G::HolderGone => (16, [0; 3], ["", ""]),
        G::Stalled { pending, waited_ms } => (17, [u64::from(*pending), *waited_ms, 0], ["", ""]),
        G::Copy(s) => (18, [0; 3], [s, ""]),
        G::TooLarge { len, max } => (19, [*len as u64, *max as u64, 0], ["", ""]),
        G::TooManyHolders { max } => (20, [u64::from(*max), 0, 0], ["", ""]),
    }
}

pub(super) fn refusal(code: u8, n: [u64; 3], s: [String; 2]) -> Result<GrantError, WireError> {
    use GrantError as G;
    let u32_of = |v: u64| u32::try_from(v).map_err(|_| WireError::InvalidField("refusal"));
    let rights = |v: u64| {
        u8::try_from(v)
            .ok()
            .and_then(Rights::from_bits)
            .ok_or(WireError::InvalidField("refusal rights"))
    };
    let what = |v: u64| WHATS.get(v as usize).copied().unwrap_or(WHATS[0]);
    let [s0, s1] = s;
    Ok(match code {
        1 => G::Malformed(s0),
        2 => G::Revoked,
        3 => G::Expired {
            at_ms: n[0],
            now_ms: n[1],
        },
        4 => G::NotYours { holder: s0, me: s1 },
        5 => G::Unbound,
        6 => G::Claimed { pid: u32_of(n[0])? },
        7 => G::OutOfRange {
            index: u32_of(n[0])?,
            count: u32_of(n[1])?,
        },
        8 => G::StaleGeneration {
            index: u32_of(n[0])?,
            named: u32_of(n[1])?,
            current: u32_of(n[2])?,
        },
        9 => G::RightsMissing {
            needed: rights(n[0])?,
            granted: rights(n[1])?,
        },
        10 => G::NoLane(s0),
        11 => G::Forged { what: what(n[0]) },
        12 => G::LengthMismatch {
            what: what(n[0]),
            local: n[1],
            remote: n[2],
        },
        13 => G::NotificationTooLarge {
            len: n[0] as usize,
            max: n[1] as usize,
        },
        14 => G::NotificationsFull { waited_ms: n[0] },
        15 => G::OwnerGone(s0),
        16 => G::HolderGone,
        17 => G::Stalled {
            pending: u32_of(n[0])?,
            waited_ms: n[1],
        },
        18 => G::Copy(s0),
        19 => G::TooLarge {
            len: n[0] as usize,
            max: n[1] as usize,
        },
        20 => G::TooManyHolders { max: u32_of(n[0])? },
        // A refusal this build does not know: still a refusal.
        other => G::Malformed(format!("the owner refused with code {other}: {s0}")),
    })
}

pub(super) fn encode_request(r: &GrantRequest, out: &mut Vec<u8>) {
    let blocks = &r.blocks[..r.blocks.len().min(MAX_TCP_BLOCKS)];
    let notify = r
        .notify
        .as_deref()
        .map(|n| &n[..n.len().min(MAX_NOTIFICATION)]);
    let bytes = &r.bytes[..r.bytes.len().min(MAX_TCP_CHUNK)];
    out.reserve(REQUEST_FIXED + blocks.len() * 8 + 2 + notify.map_or(0, <[u8]>::len) + bytes.len());
    out.extend_from_slice(&r.req.to_le_bytes());
    out.extend_from_slice(&r.grant.to_le_bytes());
    out.extend_from_slice(r.token.as_bytes());
    out.push(r.kind.as_u8());
    out.push(if r.last { LAST } else { 0 } | if notify.is_some() { NOTIFY } else { 0 });
    out.extend_from_slice(&r.offset.to_le_bytes());
    out.extend_from_slice(&r.len.to_le_bytes());
    out.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for b in blocks {
        out.extend_from_slice(&b.index.to_le_bytes());
        out.extend_from_slice(&b.generation.to_le_bytes());
    }
    let n = notify.unwrap_or(&[]);
    out.extend_from_slice(&(n.len() as u16).to_le_bytes());
    out.extend_from_slice(n);
    out.extend_from_slice(bytes);
}

pub(super) fn decode_request(r: &mut Reader<'_>) -> Result<GrantRequest, WireError> {
    let req = r.u64()?;
    let grant = r.u64()?;
    let token = Token::from_bytes(r.take(16)?.try_into().expect("16 bytes"));
    let kind = OperationKind::from_u8(r.u8()?).ok_or(WireError::InvalidField("grant kind"))?;
    let flags = r.u8()?;
    if flags & !(LAST | NOTIFY) != 0 {
        return Err(WireError::InvalidField("grant flags"));
    }
    let offset = r.u64()?;
    let len = r.u32()?;
    // A bare notification (no bytes, no blocks, offset 0) is the one
    // request of length 0.
    let bare = len == 0 && offset == 0 && flags == LAST | NOTIFY;
    if (len == 0 && !bare) || len as usize > MAX_TCP_CHUNK {
        return Err(WireError::InvalidField("grant length"));
    }
    let n = r.u32()? as usize;
    if (n == 0) != bare || n > MAX_TCP_BLOCKS {
        return Err(WireError::InvalidField("grant block count"));
    }
    let raw = r.take(n * 8)?;
    let blocks = raw
        .chunks_exact(8)
        .map(|b| BlockRef {
            index: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
            generation: u32::from_le_bytes(b[4..].try_into().expect("4 bytes")),
        })
        .collect();
    let m = r.u16()? as usize;
    if m > MAX_NOTIFICATION {
        return Err(WireError::InvalidField("grant notification"));
    }
    let payload = r.take(m)?;
    let notify = if flags & NOTIFY != 0 {
        if flags & LAST == 0 {
            return Err(WireError::InvalidField("grant notification"));
        }
        Some(payload.to_vec())
    } else if m != 0 {
        return Err(WireError::InvalidField("grant notification"));
    } else {
        None
    };
    let bytes = match kind {
        OperationKind::Read => Vec::new(),
        OperationKind::Write => r.take(len as usize)?.to_vec(),
    };
    Ok(GrantRequest {
        req,
        grant,
        token,
        kind,
        last: flags & LAST != 0,
        offset,
        len,
        blocks,
        notify,
        bytes,
    })
}

pub(super) fn encode_reply(r: &GrantReply, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.req.to_le_bytes());
    match &r.answer {
        GrantAnswer::Done => out.push(DONE),
        GrantAnswer::Bytes(b) => {
            let b = &b[..b.len().min(MAX_TCP_CHUNK)];
            out.reserve(5 + b.len());
            out.push(BYTES);
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        GrantAnswer::Refused(e) => {
            let (code, n, s) = refusal_parts(e);
            out.push(REFUSED);
            out.push(code);
            for v in n {
                out.extend_from_slice(&v.to_le_bytes());
            }
            put_str(out, s[0]);
            put_str(out, s[1]);
        }
    }
}

pub(super) fn decode_reply(r: &mut Reader<'_>) -> Result<GrantReply, WireError> {
    let req = r.u64()?;
    let answer = match r.u8()? {
        DONE => GrantAnswer::Done,
        BYTES => {
            let n = r.u32()? as usize;
            if n == 0 || n > MAX_TCP_CHUNK {
                return Err(WireError::InvalidField("grant reply length"));
            }
            GrantAnswer::Bytes(r.take(n)?.to_vec())
        }
        REFUSED => {
            let code = r.u8()?;
            let n = [r.u64()?, r.u64()?, r.u64()?];
            let s = [
                r.string(MAX_DETAIL, "refusal detail")?,
                r.string(MAX_DETAIL, "refusal detail")?,
            ];
            GrantAnswer::Refused(refusal(code, n, s)?)
        }
        _ => return Err(WireError::InvalidField("grant reply status")),
    };
    Ok(GrantReply { req, answer })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_req() -> GrantRequest {
        GrantRequest {
            req: 9,
            grant: 3,
            token: Token::from_bytes([5; 16]),
            kind: OperationKind::Write,
            last: true,
            offset: 17,
            len: 40,
            blocks: vec![BlockRef::new(2, 1), BlockRef::new(7, 0)],
            notify: Some(b"layer 3".to_vec()),
            bytes: vec![0xa5; 40],
        }
    }

    fn round_trip(m: &Message) {
        let v = m.to_vec();
        assert_eq!(decode_frame(&v), Ok(Some((m.clone(), v.len()))));
        // Every prefix wants more bytes; every shorter body is refused.
        for cut in 0..v.len() {
            assert_eq!(decode_frame(&v[..cut]), Ok(None));
        }
        let h = decode_header(v[..HEADER_LEN].try_into().unwrap()).unwrap();
        for cut in 0..v.len() - HEADER_LEN {
            let short = Header {
                body_len: cut as u32,
                ..h
            };
            assert!(decode_body(short, &v[HEADER_LEN..HEADER_LEN + cut]).is_err());
        }
    }

    #[test]
    fn requests_and_replies_round_trip() {
        round_trip(&Message::GrantRequest(write_req()));
        let read = GrantRequest {
            kind: OperationKind::Read,
            last: false,
            notify: None,
            bytes: Vec::new(),
            ..write_req()
        };
        round_trip(&Message::GrantRequest(read));
        for answer in [
            GrantAnswer::Done,
            GrantAnswer::Bytes(vec![1, 2, 3]),
            GrantAnswer::Refused(GrantError::Revoked),
            GrantAnswer::Refused(GrantError::StaleGeneration {
                index: 4,
                named: 1,
                current: 2,
            }),
            GrantAnswer::Refused(GrantError::NotYours {
                holder: "a".into(),
                me: "b".into(),
            }),
            GrantAnswer::Refused(GrantError::RightsMissing {
                needed: Rights::WRITE,
                granted: Rights::READ,
            }),
            GrantAnswer::Refused(GrantError::Forged { what: "token" }),
            GrantAnswer::Refused(GrantError::LengthMismatch {
                what: "bytes",
                local: 9,
                remote: 8,
            }),
            GrantAnswer::Refused(GrantError::OutOfRange { index: 9, count: 8 }),
            GrantAnswer::Refused(GrantError::Expired {
                at_ms: 1,
                now_ms: 2,
            }),
            GrantAnswer::Refused(GrantError::NotificationsFull { waited_ms: 3 }),
        ] {
            round_trip(&Message::GrantReply(GrantReply { req: 1, answer }));
        }
    }

    fn body_of(r: &GrantRequest) -> Vec<u8> {
        let mut v = Vec::new();
        encode_request(r, &mut v);
        v
    }

    fn decode(ty: u8, body: &[u8]) -> Result<Message, WireError> {
        let mut h = [ty, 0, 0, 0, 0, 0, 0, 0];
        h[4..].copy_from_slice(&(body.len() as u32).to_le_bytes());
        decode_body(decode_header(&h)?, body)
    }

    #[test]
    fn hostile_requests_are_refused_typed() {
        let ok = body_of(&write_req());
        assert!(decode(T_GRANT_REQUEST, &ok).is_ok());
        // Trailing bytes past a WRITE's `len`.
        let mut long = ok.clone();
        long.push(0);
        assert_eq!(decode(T_GRANT_REQUEST, &long), Err(WireError::Trailing(1)));
        // Unknown flags, a zero or oversize length, no blocks, too many.
        let fixed = |at: usize, bytes: &[u8]| {
            let mut b = ok.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            decode(T_GRANT_REQUEST, &b)
        };
        assert_eq!(fixed(33, &[4]), Err(WireError::InvalidField("grant flags")));
        assert_eq!(fixed(32, &[3]), Err(WireError::InvalidField("grant kind")));
        assert_eq!(
            fixed(42, &0u32.to_le_bytes()),
            Err(WireError::InvalidField("grant length"))
        );
        let over = (MAX_TCP_CHUNK as u32 + 1).to_le_bytes();
        assert_eq!(
            fixed(42, &over),
            Err(WireError::InvalidField("grant length"))
        );
        assert_eq!(
            fixed(46, &0u32.to_le_bytes()),
            Err(WireError::InvalidField("grant block count"))
        );
        let many = (MAX_TCP_BLOCKS as u32 + 1).to_le_bytes();
        assert_eq!(
            fixed(46, &many),
            Err(WireError::InvalidField("grant block count"))
        );
        // A notification on a READ's last request is one (the owner
        // queues it after the read); on a request before the last, or
        // one too long, not.
        let mut r = write_req();
        r.kind = OperationKind::Read;
        r.bytes.clear();
        round_trip(&Message::GrantRequest(r.clone()));
        r.last = false;
        assert_eq!(
            decode(T_GRANT_REQUEST, &body_of(&r)),
            Err(WireError::InvalidField("grant notification"))
        );
        // A bare notification: no bytes, no blocks; and only so.
        let bare = GrantRequest {
            offset: 0,
            len: 0,
            blocks: Vec::new(),
            bytes: Vec::new(),
            ..write_req()
        };
        round_trip(&Message::GrantRequest(bare.clone()));
        let not_bare = |f: fn(&mut GrantRequest)| {
            let mut b = bare.clone();
            f(&mut b);
            decode(T_GRANT_REQUEST, &body_of(&b))
        };
        assert_eq!(
            not_bare(|b| b.notify = None),
            Err(WireError::InvalidField("grant length"))
        );
        assert_eq!(
            not_bare(|b| b.offset = 1),
            Err(WireError::InvalidField("grant length"))
        );
        assert_eq!(
            not_bare(|b| b.blocks = vec![BlockRef::new(0, 0)]),
            Err(WireError::InvalidField("grant block count"))
        );
        let mut big = write_req();
        big.notify = None;
        let mut b = body_of(&big);
        let at = REQUEST_FIXED + 16;
        b[at..at + 2].copy_from_slice(&(MAX_NOTIFICATION as u16 + 1).to_le_bytes());
        assert_eq!(
            decode(T_GRANT_REQUEST, &b),
            Err(WireError::InvalidField("grant notification"))
        );
        // A header announcing more than the largest request.
        let mut h = [T_GRANT_REQUEST, 0, 0, 0, 0, 0, 0, 0];
        h[4..].copy_from_slice(&(MAX_REQUEST_BODY + 1).to_le_bytes());
        assert_eq!(
            decode_header(&h),
            Err(WireError::BodyTooLarge(MAX_REQUEST_BODY + 1))
        );
        // Replies: an unknown status, an empty READ, an unknown refusal
        // (still a refusal).
        assert!(decode(T_GRANT_REPLY, &[0, 0, 0, 0, 0, 0, 0, 0, 9]).is_err());
        assert!(decode(T_GRANT_REPLY, &[0, 0, 0, 0, 0, 0, 0, 0, BYTES, 0, 0, 0, 0]).is_err());
        let mut unknown = vec![0; 8];
        unknown.extend_from_slice(&[REFUSED, 200]);
        unknown.extend_from_slice(&[0; 24]);
        unknown.extend_from_slice(&[0; 4]);
        assert!(matches!(
            decode(T_GRANT_REPLY, &unknown),
            Ok(Message::GrantReply(GrantReply {
                answer: GrantAnswer::Refused(GrantError::Malformed(_)),
                ..
            }))
        ));
    }
}
