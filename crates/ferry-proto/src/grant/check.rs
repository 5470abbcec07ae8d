//! The checks every lane makes before it moves a byte through a grant:
//! pure functions of the grant, the request, a clock value and a snapshot
//! of the generation table, tested without any IO.

use super::{BlockRef, GrantError, Rights, MAX_NOTIFICATION};

/// The grant gives `needed`.
pub fn rights(granted: Rights, needed: Rights) -> Result<(), GrantError> {
    if granted.allows(needed) {
        Ok(())
    } else {
        Err(GrantError::RightsMissing { needed, granted })
    }
}

/// The grant has not expired at `now_ms` (unix milliseconds): it is valid
/// strictly before `expires_at_ms`.
pub fn expiry(expires_at_ms: Option<u64>, now_ms: u64) -> Result<(), GrantError> {
    match expires_at_ms {
        Some(at_ms) if now_ms >= at_ms => Err(GrantError::Expired { at_ms, now_ms }),
        _ => Ok(()),
    }
}

/// A grant bound to `holder` is opened by that worker (`me`); a bearer
/// grant (`None`) by anyone.
pub fn holder(holder: Option<&str>, me: &str) -> Result<(), GrantError> {
    match holder {
        Some(h) if h != me => Err(GrantError::NotYours {
            holder: h.to_string(),
            me: me.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Every named block lies within the `count` blocks granted (and there is
/// at least one).
pub fn blocks(refs: &[BlockRef], count: u32) -> Result<(), GrantError> {
    if refs.is_empty() {
        return Err(GrantError::LengthMismatch {
            what: "block counts",
            local: 0,
            remote: 0,
        });
    }
    match refs.iter().find(|r| r.index >= count) {
        Some(r) => Err(GrantError::OutOfRange {
            index: r.index,
            count,
        }),
        None => Ok(()),
    }
}

/// Every named block is at the generation it names, by `current` (the
/// generation table, or a snapshot of it; called once per block, in order).
/// The first stale one is the error.
pub fn generations(
    refs: &[BlockRef],
    mut current: impl FnMut(u32) -> u32,
) -> Result<(), GrantError> {
    for r in refs {
        let now = current(r.index);
        if now != r.generation {
            return Err(GrantError::StaleGeneration {
                index: r.index,
                named: r.generation,
                current: now,
            });
        }
    }
    Ok(())
}

/// The local side names as many blocks as the remote one, of the grant's
/// block size.
pub fn shape(
    local_blocks: usize,
    local_block_size: u64,
    remote_blocks: usize,
    grant_block_size: u64,
) -> Result<(), GrantError> {
    if local_blocks != remote_blocks {
        return Err(GrantError::LengthMismatch {
            what: "block counts",
            local: local_blocks as u64,
            remote: remote_blocks as u64,
        });
    }
    if local_block_size != grant_block_size {
        return Err(GrantError::LengthMismatch {
            what: "block sizes",
            local: local_block_size,
            remote: grant_block_size,
        });
    }
    Ok(())
}

/// A notification payload fits.
pub fn payload(len: usize) -> Result<(), GrantError> {
    if len > MAX_NOTIFICATION {
        Err(GrantError::NotificationTooLarge {
            len,
            max: MAX_NOTIFICATION,
        })
    } else {
        Ok(())
    }
}

/// The `(address, length)` ranges of blocks `indices` of memory whose block
/// 0 is at `base`, neighbours merged (blocks that follow each other in
/// memory move as one range). The caller checked the indices
/// ([`blocks`]) and that the memory fits the address space (the
/// metadata's `validate`); saturating otherwise.
pub fn ranges(
    base: u64,
    block_size: u64,
    indices: impl IntoIterator<Item = u32>,
) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for i in indices {
        let at = base.saturating_add(u64::from(i).saturating_mul(block_size));
        match out.last_mut() {
            Some((a, n)) if a.saturating_add(*n) == at => *n = n.saturating_add(block_size),
            _ => out.push((at, block_size)),
        }
    }
    out
}
