//! Byte ranges inside the blocks of a grant: what a holder names when it
//! moves less than whole blocks (NIXL's `(addr, len)` descriptors inside a
//! registered region), the pure checks every lane makes before it moves a
//! byte of them, and how a holder served over TCP batches them into
//! requests ([`requests`]).
//!
//! ```
//! use ferry_proto::grant::{ranges, BlockRange, BlockRef, GrantError};
//! let r = [BlockRange::new(BlockRef::new(2, 0), 100, 28)];
//! assert!(ranges::check(&r, 128, 4).is_ok());
//! let past = [BlockRange::new(BlockRef::new(2, 0), 100, 29)];
//! assert!(matches!(
//!     ranges::check(&past, 128, 4),
//!     Err(GrantError::LengthMismatch { what: "bytes", .. })
//! ));
//! ```

use serde::{Deserialize, Serialize};

use super::{BlockRef, GrantError, MAX_TCP_BLOCKS, MAX_TCP_CHUNK};

/// The most ranges one operation names (each is checked, and each costs a
/// few words of memory on both sides: the bound keeps both bounded).
pub const MAX_RANGES: usize = 1 << 20;

/// A byte range inside one block of granted memory: `len` bytes from
/// `offset` in block `block` (at the generation it names).
/// `offset + len <= block_size` and `len > 0`, checked ([`check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockRange {
    /// The block, and the generation the transfer expects.
    pub block: BlockRef,
    /// Where the range starts in the block.
    pub offset: u64,
    /// How many bytes (at least 1).
    pub len: u64,
}

impl BlockRange {
    /// `len` bytes from `offset` of `block`.
    pub const fn new(block: BlockRef, offset: u64, len: u64) -> BlockRange {
        BlockRange { block, offset, len }
    }

    /// The whole of `block`, of `block_size` bytes.
    pub const fn whole(block: BlockRef, block_size: u64) -> BlockRange {
        BlockRange {
            block,
            offset: 0,
            len: block_size,
        }
    }
}

/// The refusal of a range past its block, or empty.
fn outside(offset: u64, len: u64, block_size: u64) -> GrantError {
    GrantError::LengthMismatch {
        what: "bytes",
        local: offset.saturating_add(len),
        remote: if len == 0 { 0 } else { block_size },
    }
}

/// Every range lies within a block of the `count` granted blocks of
/// `block_size` bytes, is not empty, and there are 1 to [`MAX_RANGES`]
/// of them: their total bytes. Refusals: no range or too many
/// ([`GrantError::LengthMismatch`] `"block counts"`), a block past the
/// grant ([`GrantError::OutOfRange`]), an empty range or one past its
/// block's end ([`GrantError::LengthMismatch`] `"bytes"`). Generations
/// are checked inside the fence
/// ([`check::generations`](super::check::generations) over [`refs`]).
pub fn check(ranges: &[BlockRange], block_size: u64, count: u32) -> Result<u64, GrantError> {
    if ranges.is_empty() || ranges.len() > MAX_RANGES {
        return Err(GrantError::LengthMismatch {
            what: "block counts",
            local: ranges.len() as u64,
            remote: MAX_RANGES as u64,
        });
    }
    let mut total = 0u64;
    for r in ranges {
        if r.block.index >= count {
            return Err(GrantError::OutOfRange {
                index: r.block.index,
                count,
            });
        }
        let inside = r.len > 0 && r.offset.checked_add(r.len).is_some_and(|e| e <= block_size);
        if !inside {
            return Err(outside(r.offset, r.len, block_size));
        }
        // At most MAX_RANGES block sizes, each within the address space
        // (the metadata's `validate`): saturating only for a hostile size.
        total = total.saturating_add(r.len);
    }
    Ok(total)
}

/// The blocks the ranges name, in order (for
/// [`check::generations`](super::check::generations)).
pub fn refs(ranges: &[BlockRange]) -> Vec<BlockRef> {
    ranges.iter().map(|r| r.block).collect()
}

/// The local side of a range transfer: `(block, offset)` pairs of a local
/// pool of `count` blocks of `block_size` bytes, one per remote range, each
/// taking that range's length. Each lies within its block; with
/// `disjoint` (the destination of a read), no two overlap. Refusals as
/// [`check`]'s ([`GrantError::OutOfRange`] names the local block).
pub fn local(
    local: &[(u32, u64)],
    remote: &[BlockRange],
    block_size: u64,
    count: u64,
    disjoint: bool,
) -> Result<(), GrantError> {
    if local.len() != remote.len() {
        return Err(GrantError::LengthMismatch {
            what: "block counts",
            local: local.len() as u64,
            remote: remote.len() as u64,
        });
    }
    for (&(block, offset), r) in local.iter().zip(remote) {
        if u64::from(block) >= count {
            return Err(GrantError::OutOfRange {
                index: block,
                count: u32::try_from(count).unwrap_or(u32::MAX),
            });
        }
        if !offset.checked_add(r.len).is_some_and(|e| e <= block_size) {
            return Err(outside(offset, r.len, block_size));
        }
    }
    if disjoint {
        let mut spans: Vec<(u32, u64, u64)> = local
            .iter()
            .zip(remote)
            .map(|(&(b, o), r)| (b, o, o + r.len))
            .collect();
        spans.sort_unstable();
        if let Some(w) = spans
            .windows(2)
            .find(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
        {
            return Err(GrantError::LengthMismatch {
                what: "bytes",
                local: w[1].1,
                remote: w[0].2,
            });
        }
    }
    Ok(())
}

/// The distinct local blocks of `local` pairs, ascending (what a holder
/// takes from its pool: each once).
pub fn local_blocks(local: &[(u32, u64)]) -> Vec<u32> {
    let mut ids: Vec<u32> = local.iter().map(|l| l.0).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// One request of a range transfer served over TCP: the flat range
/// `[offset, offset + len)` of `blocks` taken in order, which is the range
/// `[at, at + len)` of the transfer's bytes (the ranges' bytes one after
/// the other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRequest {
    /// The blocks it names, 1 to [`MAX_TCP_BLOCKS`].
    pub blocks: Vec<BlockRef>,
    /// Where its range starts in the first one.
    pub offset: u64,
    /// Its length, 1 to [`MAX_TCP_CHUNK`].
    pub len: u32,
    /// Where its range starts in the transfer's bytes.
    pub at: u64,
}

/// Cuts checked `ranges` ([`check`]) of blocks of `block_size` bytes into
/// requests of at most [`MAX_TCP_CHUNK`] bytes and [`MAX_TCP_BLOCKS`]
/// blocks, in order, covering every byte once: a range that follows on
/// from the previous one (the rest of the same block, or the start of a
/// block after one that ended at its block's end) joins its request.
///
/// The first request also names, after the blocks its range covers, the
/// operation's other blocks (each once, as many as fit in
/// [`MAX_TCP_BLOCKS`]): the owner checks the generation of every block a
/// request names, so an operation that names a retired block is refused
/// at its first request, before any byte moved.
pub fn requests(ranges: &[BlockRange], block_size: u64) -> Vec<RangeRequest> {
    let mut out: Vec<RangeRequest> = Vec::new();
    // Where the current request's range ends in its last block.
    let mut end = 0u64;
    let mut at = 0u64;
    for r in ranges {
        let (mut off, mut left) = (r.offset, r.len);
        while left > 0 {
            let joins = out.last().and_then(|q| {
                let room = MAX_TCP_CHUNK as u64 - u64::from(q.len);
                if room == 0 {
                    return None;
                }
                let last = *q.blocks.last()?;
                if last == r.block && end == off {
                    Some((room, false))
                } else if end == block_size && off == 0 && q.blocks.len() < MAX_TCP_BLOCKS {
                    Some((room, true))
                } else {
                    None
                }
            });
            let n = match joins {
                Some((room, push)) => {
                    let n = room.min(left);
                    let q = out.last_mut().expect("joined a request");
                    if push {
                        q.blocks.push(r.block);
                    }
                    q.len += n as u32;
                    n
                }
                None => {
                    let n = (MAX_TCP_CHUNK as u64).min(left);
                    out.push(RangeRequest {
                        blocks: vec![r.block],
                        offset: off,
                        len: n as u32,
                        at,
                    });
                    n
                }
            };
            (off, left, at, end) = (off + n, left - n, at + n, off + n);
        }
    }
    if let Some(first) = out.first_mut() {
        let mut named: std::collections::HashSet<BlockRef> = first.blocks.iter().copied().collect();
        for r in ranges {
            if first.blocks.len() >= MAX_TCP_BLOCKS {
                break;
            }
            if named.insert(r.block) {
                first.blocks.push(r.block);
            }
        }
    }
    out
}

/// A request that moves no byte and carries a notification (a bare
/// notification, NIXL's `send_notif`): no blocks, length 0, offset 0.
pub fn is_bare(len: u32, offset: u64, blocks: &[BlockRef], notify: Option<&[u8]>) -> bool {
    len == 0 && offset == 0 && blocks.is_empty() && notify.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(index: u32, offset: u64, len: u64) -> BlockRange {
        BlockRange::new(BlockRef::new(index, 0), offset, len)
    }

    #[test]
    fn ranges_lie_within_their_blocks() {
        assert_eq!(check(&[r(0, 0, 100), r(3, 99, 1)], 100, 4), Ok(101));
        assert_eq!(
            check(&[r(4, 0, 1)], 100, 4),
            Err(GrantError::OutOfRange { index: 4, count: 4 })
        );
        for bad in [r(1, 0, 0), r(1, 50, 51), r(1, 100, 1), r(1, u64::MAX, 2)] {
            assert!(
                matches!(
                    check(&[bad], 100, 4),
                    Err(GrantError::LengthMismatch { what: "bytes", .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            check(&[], 100, 4),
            Err(GrantError::LengthMismatch {
                what: "block counts",
                ..
            })
        ));
    }

    #[test]
    fn the_local_side_fits_and_a_read_does_not_overlap() {
        let remote = [r(0, 0, 10), r(1, 0, 10)];
        assert!(local(&[(0, 0), (0, 10)], &remote, 20, 2, true).is_ok());
        assert!(local(&[(0, 0), (0, 9)], &remote, 20, 2, false).is_ok());
        assert!(matches!(
            local(&[(0, 0), (0, 9)], &remote, 20, 2, true),
            Err(GrantError::LengthMismatch { what: "bytes", .. })
        ));
        assert!(matches!(
            local(&[(0, 0), (1, 11)], &remote, 20, 2, true),
            Err(GrantError::LengthMismatch { what: "bytes", .. })
        ));
        assert_eq!(
            local(&[(0, 0), (2, 0)], &remote, 20, 2, true),
            Err(GrantError::OutOfRange { index: 2, count: 2 })
        );
        assert!(local(&[(0, 0)], &remote, 20, 2, true).is_err());
        assert_eq!(local_blocks(&[(3, 0), (1, 5), (3, 9)]), vec![1, 3]);
    }

    #[test]
    fn requests_batch_what_follows_on_and_cover_every_byte_once() {
        let bs = 100;
        let q = requests(&[r(2, 10, 20), r(2, 30, 70), r(5, 0, 100), r(7, 1, 2)], bs);
        assert_eq!(q.len(), 2);
        assert_eq!(
            q[0],
            RangeRequest {
                // Block 7 only for its generation (past the range).
                blocks: vec![
                    BlockRef::new(2, 0),
                    BlockRef::new(5, 0),
                    BlockRef::new(7, 0)
                ],
                offset: 10,
                len: 190,
                at: 0
            }
        );
        assert_eq!(q[1].blocks, vec![BlockRef::new(7, 0)]);
        assert_eq!((q[1].offset, q[1].len, q[1].at), (1, 2, 190));
        // Large blocks: cut at MAX_TCP_CHUNK, in order.
        let big = 5 * MAX_TCP_CHUNK as u64 / 2;
        let ranges = [r(0, 3, big - 3), r(1, 0, 7), r(1, 9, big - 9)];
        let q = requests(&ranges, big);
        let mut at = 0;
        for x in &q {
            assert_eq!(x.at, at);
            assert!(x.len > 0 && x.len as usize <= MAX_TCP_CHUNK);
            assert!(x.offset + u64::from(x.len) <= x.blocks.len() as u64 * big);
            assert!(x.blocks.len() <= MAX_TCP_BLOCKS);
            at += u64::from(x.len);
        }
        assert_eq!(at, ranges.iter().map(|r| r.len).sum::<u64>());
        assert_eq!(q[0].blocks, vec![BlockRef::new(0, 0), BlockRef::new(1, 0)]);
        // Many blocks: the first request names as many as fit.
        let many: Vec<_> = (0..2 * MAX_TCP_BLOCKS as u32).map(|i| r(i, 0, 1)).collect();
        let q = requests(&many, 100);
        assert_eq!(q.len(), many.len());
        assert_eq!(q[0].blocks.len(), MAX_TCP_BLOCKS);
        assert_eq!(q[1].blocks, vec![BlockRef::new(1, 0)]);
        // A bare notification.
        assert!(is_bare(0, 0, &[], Some(b"x")));
        assert!(!is_bare(0, 0, &[], None));
        assert!(!is_bare(1, 0, &[], Some(b"x")));
    }
}
