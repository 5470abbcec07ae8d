//! Byte ranges and bare notifications over TCP: ranges that follow on
//! from each other are batched into one request
//! ([`ranges::requests`]), at most [`MAX_TCP_CHUNK`](super::super::MAX_TCP_CHUNK)
//! bytes each; a READ's notification rides on its last request, a bare
//! notification is a request of no bytes. The owner checks and serves each
//! as it does a block transfer's.

use ferry_proto::grant::{ranges, BlockRange, GrantError, Rights};
use ferry_proto::wire::{GrantAnswer, GrantRequest};
use ferry_proto::OperationKind;

use super::{gather, scatter, Segs, TcpHeld};
use crate::grant::copy;
use crate::{Pool, Result};

impl TcpHeld {
    /// The request of `q`, the last of its operation or not.
    fn range_request(
        &self,
        kind: OperationKind,
        q: &ranges::RangeRequest,
        last: bool,
        notify: Option<&[u8]>,
    ) -> GrantRequest {
        GrantRequest {
            req: 0,
            grant: self.meta.grant.0,
            token: self.meta.token,
            kind,
            last,
            offset: q.offset,
            len: q.len,
            blocks: q.blocks.clone(),
            notify: notify.filter(|_| last).map(<[u8]>::to_vec),
            bytes: Vec::new(),
        }
    }

    /// Reads ranges (the caller checked rights, ranges, the local places
    /// and the payload).
    pub(in crate::grant) async fn read_ranges(
        &self,
        remote: &[BlockRange],
        local: &Pool,
        local_at: &[(u32, u64)],
        notify: Option<&[u8]>,
    ) -> Result<()> {
        let ids = ranges::local_blocks(local_at);
        let desc = local.blocks(&ids)?;
        let segs = pieces(&desc, &ids, local_at, remote);
        let all = ranges::requests(remote, self.meta.block_size);
        let n = all.len();
        for (i, q) in all.iter().enumerate() {
            let req = self.range_request(OperationKind::Read, q, i + 1 == n, notify);
            match self.call(req).await? {
                GrantAnswer::Bytes(b) if b.len() == q.len as usize => {
                    // SAFETY: `desc` holds the local blocks exclusively
                    // (taken writable) until it drops below; `segs` lie
                    // within them, and `q.at + len` within their total.
                    unsafe { scatter(&segs, q.at, &b) };
                }
                other => {
                    return Err(GrantError::Copy(format!(
                        "the owner answered a read of {} bytes with {other:?}",
                        q.len
                    ))
                    .into())
                }
            }
        }
        drop(desc);
        Ok(())
    }

    /// Writes ranges (the caller checked rights, ranges, the local places
    /// and the payload).
    pub(in crate::grant) async fn write_ranges(
        &self,
        local: &Pool,
        local_at: &[(u32, u64)],
        remote: &[BlockRange],
        notify: Option<&[u8]>,
    ) -> Result<()> {
        let ids = ranges::local_blocks(local_at);
        let desc = local.shared_blocks(&ids)?;
        let segs = pieces(&desc, &ids, local_at, remote);
        let all = ranges::requests(remote, self.meta.block_size);
        let n = all.len();
        for (i, q) in all.iter().enumerate() {
            let mut req = self.range_request(OperationKind::Write, q, i + 1 == n, notify);
            // SAFETY: `desc` holds the local blocks shared (no writer)
            // until it drops below; the range lies within `segs`, which
            // lie within them.
            req.bytes = unsafe { gather(&segs, q.at, q.len as usize) };
            match self.call(req).await? {
                GrantAnswer::Done => {}
                other => {
                    return Err(GrantError::Copy(format!(
                        "the owner answered a write with {other:?}"
                    ))
                    .into())
                }
            }
        }
        drop(desc);
        Ok(())
    }

    /// Sends a bare notification (the caller checked the payload).
    pub(in crate::grant) async fn notify(&self, payload: &[u8]) -> Result<()> {
        // The owner needs no right for it; the kind is the grant's.
        let kind = if self.meta.rights.allows(Rights::READ) {
            OperationKind::Read
        } else {
            OperationKind::Write
        };
        let req = GrantRequest {
            req: 0,
            grant: self.meta.grant.0,
            token: self.meta.token,
            kind,
            last: true,
            offset: 0,
            len: 0,
            blocks: Vec::new(),
            notify: Some(payload.to_vec()),
            bytes: Vec::new(),
        };
        match self.call(req).await? {
            GrantAnswer::Done => Ok(()),
            other => Err(GrantError::Copy(format!(
                "the owner answered a notification with {other:?}"
            ))
            .into()),
        }
    }
}

/// The local pieces of the ranges, as addresses, in order.
fn pieces(
    desc: &crate::Descriptor<'static>,
    ids: &[u32],
    at: &[(u32, u64)],
    remote: &[BlockRange],
) -> Segs {
    let mut raw = Vec::with_capacity(desc.block_count());
    desc.raw_segments(&mut raw);
    copy::pieces(&raw, ids, at, remote)
        .into_iter()
        .map(|(p, n)| (p as usize, n))
        .collect()
}
