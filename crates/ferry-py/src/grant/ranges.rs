//! Byte ranges and bare notifications of `RemoteGrant`
//! ([`ferry::RemoteGrant::read_ranges`], `write_ranges`, `notify`): the
//! arguments as the Python layer hands them over (remote ranges as
//! `(block, offset, len)` with `block` an index or an `(index,
//! generation)` pair; local places as `(block, offset)`), and the
//! transfers, which take their local blocks from the Python pool's table
//! as block transfers do.

use std::sync::Arc;

use ferry::BlockRange;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{finish, RemoteGrant};
use crate::claims::Claim;
use crate::pool::Pool;

/// What a range transfer needs, made with the GIL.
pub(super) struct Ranges {
    pub(super) remote: Arc<[BlockRange]>,
    pub(super) pool: ferry::Pool,
    pub(super) at: Arc<[(u32, u64)]>,
    pub(super) claim: Claim,
}

/// A range transfer's arguments, checked: the owner's ranges, the local
/// places, and the distinct local blocks they touch (ascending).
pub(super) struct Parsed {
    pub(super) remote: Arc<[BlockRange]>,
    pub(super) at: Arc<[(u32, u64)]>,
    pub(super) ids: Vec<u32>,
}

fn non_negative(what: &str, v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| PyValueError::new_err(format!("{what} must be >= 0, not {v}")))
}

impl RemoteGrant {
    /// The owner's ranges `items` name: each `(block, offset, len)`.
    fn remote_ranges(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<Vec<BlockRange>> {
        let mut out = Vec::new();
        for item in items.try_iter()? {
            let (block, offset, len): (Bound<'_, PyAny>, i64, i64) = item?.extract()?;
            let one = pyo3::types::PyList::new(py, [block])?;
            let r = self.remote_refs(py, one.as_any())?;
            out.push(BlockRange::new(
                r[0],
                non_negative("a range's offset", offset)?,
                non_negative("a range's length", len)?,
            ));
        }
        Ok(out)
    }

    pub(super) fn ranges(
        &self,
        py: Python<'_>,
        remote: &Bound<'_, PyAny>,
        pool: &Bound<'_, Pool>,
        local: Vec<(i64, i64)>,
        writes_local: bool,
    ) -> PyResult<Ranges> {
        let parsed = self.parse_ranges(py, remote, pool, local)?;
        let p = pool.get();
        let claim = p.hold_blocks(py, &parsed.ids, writes_local)?;
        Ok(Ranges {
            remote: parsed.remote,
            pool: p.rust().clone(),
            at: parsed.at,
            claim,
        })
    }

    /// The arguments of a range transfer, checked (the core checks each
    /// range against the grant again when the transfer runs).
    pub(super) fn parse_ranges(
        &self,
        py: Python<'_>,
        remote: &Bound<'_, PyAny>,
        pool: &Bound<'_, Pool>,
        local: Vec<(i64, i64)>,
    ) -> PyResult<Parsed> {
        let remote = self.remote_ranges(py, remote)?;
        let p = pool.get();
        let count = p.rust().block_count();
        let mut at = Vec::with_capacity(local.len());
        for (b, o) in local {
            let b = u32::try_from(b)
                .ok()
                .filter(|&b| (b as usize) < count)
                .ok_or_else(|| {
                    crate::errors::named_error(
                        py,
                        "BlockRangeError",
                        format!("local block {b} is out of range: the pool has blocks 0 to {count} (exclusive)"),
                    )
                })?;
            at.push((b, non_negative("a local offset", o)?));
        }
        let ids = ferry_ids(&at);
        Ok(Parsed {
            remote: remote.into(),
            at: at.into(),
            ids,
        })
    }
}

/// The distinct local blocks, ascending (each held once).
fn ferry_ids(at: &[(u32, u64)]) -> Vec<u32> {
    let mut ids: Vec<u32> = at.iter().map(|a| a.0).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl Ranges {
    fn is_large(&self) -> bool {
        is_large(&self.remote)
    }
}

/// Whether a transfer of `remote` runs its copy off the runtime's threads
/// (as the core does from [`ferry::grant::INLINE_MAX`] bytes).
pub(super) fn is_large(remote: &[BlockRange]) -> bool {
    remote.iter().map(|r| r.len).fold(0u64, u64::saturating_add) >= ferry::grant::INLINE_MAX as u64
}

pub(super) async fn read(
    g: ferry::RemoteGrant,
    t: Ranges,
    notify: Option<Vec<u8>>,
) -> ferry::Result<()> {
    let large = t.is_large();
    finish(large, async move {
        let r = g
            .read_ranges(&t.remote, &t.pool, &t.at, notify.as_deref())
            .await;
        drop(t.claim);
        r
    })
    .await
}

pub(super) async fn write(
    g: ferry::RemoteGrant,
    t: Ranges,
    notify: Option<Vec<u8>>,
) -> ferry::Result<()> {
    let large = t.is_large();
    finish(large, async move {
        let r = g
            .write_ranges(&t.pool, &t.at, &t.remote, notify.as_deref())
            .await;
        drop(t.claim);
        r
    })
    .await
}

pub(super) async fn notify(g: ferry::RemoteGrant, payload: Vec<u8>) -> ferry::Result<()> {
    g.notify(&payload).await
}
