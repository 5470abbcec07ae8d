//! Serving a grant over TCP, without IO: what the owner's runtime checks
//! before it moves a byte of a holder's [`GrantRequest`] ([`check`]), and
//! how a holder cuts a transfer into requests ([`chunks`]).
//!
//! The owner checks every request itself: the token, the holder binding
//! against the connection's authenticated peer, the rights, the expiry,
//! the range; then, inside the grant's fence, the revocation and the
//! generations ([`check::generations`](super::check::generations)). Nothing
//! is left to the holder's good will.

use super::{check as checks, BlockRef, GrantError, Rights, MAX_TCP_BLOCKS, MAX_TCP_CHUNK};
use crate::wire::GrantRequest;
use crate::{OperationKind, Token};

/// What the owner keeps of a grant, to check requests against.
#[derive(Debug, Clone, Copy)]
pub struct Served<'a> {
    /// The grant's secret.
    pub token: &'a Token,
    /// The worker it is bound to (`None`: a bearer grant).
    pub holder: Option<&'a str>,
    /// What it allows.
    pub rights: Rights,
    /// When it expires (unix milliseconds).
    pub expires_at_ms: Option<u64>,
    /// Bytes per block.
    pub block_size: u64,
    /// How many blocks.
    pub block_count: u32,
}

/// The pieces of granted memory a request moves, in order: `(offset from
/// block 0, length)`, neighbours merged. Their lengths add up to the
/// request's `len`.
pub type Spans = Vec<(u64, u64)>;

/// Checks request `req`, sent by worker `peer` (the connection's
/// authenticated peer), against grant `g` at `now_ms`: the pieces of the
/// granted memory it moves, or why it is refused. Refusals, in this order:
/// a wrong token ([`GrantError::Forged`]), another worker's grant
/// ([`GrantError::NotYours`]), expiry, rights, block indices, a range past
/// the named blocks or a WRITE whose bytes are not `len`
/// ([`GrantError::LengthMismatch`]), a notification too large. Revocation
/// and generations are checked inside the fence, by the caller.
///
/// A request of no bytes, no blocks, offset 0 and a notification is a
/// bare notification ([`ranges::is_bare`](super::ranges::is_bare)): it
/// needs no right, and moves nothing (no spans). A READ may carry a
/// notification too (the owner queues it once the last request's bytes
/// were read).
pub fn check(
    g: &Served<'_>,
    peer: &str,
    req: &GrantRequest,
    now_ms: u64,
) -> Result<Spans, GrantError> {
    if req.token != *g.token {
        return Err(GrantError::Forged { what: "token" });
    }
    checks::holder(g.holder, peer)?;
    checks::expiry(g.expires_at_ms, now_ms)?;
    if let Some(n) = req
        .notify
        .as_deref()
        .filter(|_| super::ranges::is_bare(req.len, req.offset, &req.blocks, req.notify.as_deref()))
    {
        // A bare notification: no byte moves, any right sends it.
        checks::payload(n.len())?;
        return Ok(Spans::new());
    }
    let needed = match req.kind {
        OperationKind::Read => Rights::READ,
        OperationKind::Write => Rights::WRITE,
    };
    checks::rights(g.rights, needed)?;
    if req.blocks.len() > MAX_TCP_BLOCKS {
        return Err(GrantError::LengthMismatch {
            what: "block counts",
            local: req.blocks.len() as u64,
            remote: MAX_TCP_BLOCKS as u64,
        });
    }
    checks::blocks(&req.blocks, g.block_count)?;
    let named = g.block_size.saturating_mul(req.blocks.len() as u64);
    let len = u64::from(req.len);
    let fits = len > 0
        && len as usize <= MAX_TCP_CHUNK
        && req.offset.checked_add(len).is_some_and(|end| end <= named);
    if !fits {
        return Err(GrantError::LengthMismatch {
            what: "bytes",
            local: req.offset.saturating_add(len),
            remote: named,
        });
    }
    let carried = match req.kind {
        OperationKind::Read => 0,
        OperationKind::Write => len,
    };
    if req.bytes.len() as u64 != carried {
        return Err(GrantError::LengthMismatch {
            what: "bytes",
            local: req.bytes.len() as u64,
            remote: carried,
        });
    }
    if let Some(n) = &req.notify {
        checks::payload(n.len())?;
    }
    Ok(spans(&req.blocks, g.block_size, req.offset, len))
}

/// The pieces of memory (offsets from block 0) of the flat range
/// `[offset, offset + len)` of blocks `blocks` taken in order. The caller
/// checked that it lies within them.
pub fn spans(blocks: &[BlockRef], block_size: u64, offset: u64, len: u64) -> Spans {
    let mut out: Spans = Vec::new();
    let (mut at, end) = (offset, offset.saturating_add(len));
    while at < end && block_size > 0 {
        let i = (at / block_size) as usize;
        let Some(b) = blocks.get(i) else { break };
        let within = at % block_size;
        let n = (block_size - within).min(end - at);
        let start = u64::from(b.index)
            .saturating_mul(block_size)
            .saturating_add(within);
        match out.last_mut() {
            Some((s, l)) if s.saturating_add(*l) == start => *l += n,
            _ => out.push((start, n)),
        }
        at += n;
    }
    out
}

/// One request of a holder's transfer: blocks `first..first + count` of
/// the transfer's blocks, the range `[offset, offset + len)` of them, which
/// is the range `[at, at + len)` of the transfer's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// The first block of the transfer's it names.
    pub first: usize,
    /// How many it names.
    pub count: usize,
    /// Where its range starts in the first one.
    pub offset: u64,
    /// Its length, at most [`MAX_TCP_CHUNK`].
    pub len: u32,
    /// Where its range starts in the transfer's bytes.
    pub at: u64,
}

/// Cuts a transfer of `blocks` blocks of `block_size` bytes into requests
/// of at most [`MAX_TCP_CHUNK`] bytes and [`MAX_TCP_BLOCKS`] blocks each,
/// in order, covering every byte once.
pub fn chunks(blocks: usize, block_size: u64) -> Vec<Chunk> {
    let total = block_size.saturating_mul(blocks as u64);
    if total == 0 {
        return Vec::new();
    }
    // A range of `step` bytes touches at most `step / block_size + 2`
    // blocks: at most MAX_TCP_BLOCKS.
    let step = (MAX_TCP_CHUNK as u64)
        .min(block_size.saturating_mul(MAX_TCP_BLOCKS as u64 - 2))
        .max(1);
    let mut out = Vec::with_capacity(total.div_ceil(step) as usize);
    let mut at = 0u64;
    while at < total {
        let len = step.min(total - at);
        let first = (at / block_size) as usize;
        let last = ((at + len - 1) / block_size) as usize;
        out.push(Chunk {
            first,
            count: last - first + 1,
            offset: at - first as u64 * block_size,
            len: len as u32,
            at,
        });
        at += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(token: &Token) -> Served<'_> {
        Served {
            token,
            holder: Some("decode-0"),
            rights: Rights::READ,
            expires_at_ms: Some(1_000),
            block_size: 100,
            block_count: 8,
        }
    }

    fn read(token: Token, blocks: &[u32], offset: u64, len: u32) -> GrantRequest {
        GrantRequest {
            req: 1,
            grant: 1,
            token,
            kind: OperationKind::Read,
            last: true,
            offset,
            len,
            blocks: blocks.iter().map(|&i| BlockRef::new(i, 0)).collect(),
            notify: None,
            bytes: Vec::new(),
        }
    }

    #[test]
    fn a_request_moves_the_pieces_of_the_blocks_it_names() {
        let t = Token::from_bytes([7; 16]);
        let g = grant(&t);
        let r = read(t, &[3, 4, 6], 50, 200);
        assert_eq!(
            check(&g, "decode-0", &r, 10),
            Ok(vec![(350, 150), (600, 50)])
        );
    }

    #[test]
    fn every_refusal_is_typed_and_in_order() {
        let t = Token::from_bytes([7; 16]);
        let g = grant(&t);
        let ok = read(t, &[1], 0, 100);
        let forged = read(Token::from_bytes([8; 16]), &[1], 0, 100);
        assert_eq!(
            check(&g, "decode-0", &forged, 10),
            Err(GrantError::Forged { what: "token" })
        );
        assert!(matches!(
            check(&g, "decode-1", &ok, 10),
            Err(GrantError::NotYours { .. })
        ));
        assert!(matches!(
            check(&g, "decode-0", &ok, 1_000),
            Err(GrantError::Expired { .. })
        ));
        let mut w = ok.clone();
        w.kind = OperationKind::Write;
        w.bytes = vec![0; 100];
        assert!(matches!(
            check(&g, "decode-0", &w, 10),
            Err(GrantError::RightsMissing { .. })
        ));
        assert_eq!(
            check(&g, "decode-0", &read(t, &[8], 0, 100), 10),
            Err(GrantError::OutOfRange { index: 8, count: 8 })
        );
        assert!(matches!(
            check(&g, "decode-0", &read(t, &[1, 2], 150, 51), 10),
            Err(GrantError::LengthMismatch { what: "bytes", .. })
        ));
        let rw = Served {
            rights: Rights::READ_WRITE,
            ..g
        };
        let mut short = w.clone();
        short.bytes.pop();
        assert!(matches!(
            check(&rw, "decode-0", &short, 10),
            Err(GrantError::LengthMismatch { what: "bytes", .. })
        ));
        assert!(check(&rw, "decode-0", &w, 10).is_ok());
        let bearer = Served { holder: None, ..g };
        assert!(check(&bearer, "anyone", &ok, 10).is_ok());
    }

    #[test]
    fn a_bare_notification_moves_nothing_and_a_read_may_notify() {
        let t = Token::from_bytes([7; 16]);
        let g = grant(&t);
        let mut bare = read(t, &[], 0, 0);
        bare.kind = OperationKind::Write;
        bare.notify = Some(b"done".to_vec());
        // Any right sends one (this grant is READ only).
        assert_eq!(check(&g, "decode-0", &bare, 10), Ok(Vec::new()));
        assert!(matches!(
            check(&g, "decode-1", &bare, 10),
            Err(GrantError::NotYours { .. })
        ));
        bare.notify = Some(vec![0; crate::grant::MAX_NOTIFICATION + 1]);
        assert!(matches!(
            check(&g, "decode-0", &bare, 10),
            Err(GrantError::NotificationTooLarge { .. })
        ));
        // Without a notification, no bytes is no request.
        bare.notify = None;
        assert!(check(&g, "decode-0", &bare, 10).is_err());
        let mut r = read(t, &[2], 7, 9);
        r.notify = Some(b"read".to_vec());
        assert_eq!(check(&g, "decode-0", &r, 10), Ok(vec![(207, 9)]));
    }

    #[test]
    fn chunks_cover_every_byte_once_within_bounds() {
        for (blocks, bs) in [
            (1, 4096u64),
            (3, 5 << 20),
            (9000, 64),
            (5, 1 << 20),
            (40, 100_000),
        ] {
            let cs = chunks(blocks, bs);
            let mut at = 0;
            for c in &cs {
                assert_eq!(c.at, at);
                assert!(c.len as usize <= MAX_TCP_CHUNK && c.len > 0);
                assert!(c.count <= MAX_TCP_BLOCKS);
                assert!(c.offset < bs);
                assert_eq!(c.first as u64 * bs + c.offset, c.at);
                assert!(c.offset + u64::from(c.len) <= c.count as u64 * bs);
                at += u64::from(c.len);
            }
            assert_eq!(at, blocks as u64 * bs);
        }
    }
}
