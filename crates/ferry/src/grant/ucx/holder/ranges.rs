//! Byte ranges and bare notifications over UCX: a get or put per range at
//! the block's address plus the range's offset, after the same one-sided
//! read of the state and generations as for blocks; a notification as the
//! same active message, of its kind.

use ferry_proto::grant::{ranges, BlockRange};

use super::{failed, UcxHeld};
use crate::grant::{copy, NotificationKind};
use crate::transport::ucx::{post_get, post_with};
use crate::{Pool, Result};

impl UcxHeld {
    /// The owner's address of range `r`.
    fn range_addr(&self, r: &BlockRange) -> u64 {
        self.addr(r.block.index) + r.offset
    }

    /// Reads `remote` into `local` at `at` (checked by the caller:
    /// rights, ranges, places, payload), then sends `notify` as a READ's
    /// notification.
    pub(in crate::grant) fn read_ranges(
        &self,
        remote: &[BlockRange],
        local: &Pool,
        at: &[(u32, u64)],
        notify: Option<Vec<u8>>,
    ) -> Result<()> {
        let ids = ranges::local_blocks(at);
        let desc = local.blocks(&ids)?;
        let mut segs = Vec::with_capacity(desc.block_count());
        desc.raw_segments(&mut segs);
        let pieces = copy::pieces(&segs, &ids, at, remote);
        self.control(&ranges::refs(remote))?;
        let batch = crate::transport::ucx::Batch::new();
        let api = &self.ep.worker.ucx.api;
        for (&(dst, n), r) in pieces.iter().zip(remote) {
            // SAFETY: `desc` holds the local blocks exclusively until the
            // batch ended (leaked if it never does), and each piece lies
            // within its block, none overlapping another (checked by the
            // caller); the data key is unpacked on this endpoint and
            // outlives the batch.
            let p =
                unsafe { post_get(&self.ep, &batch, dst, n, self.range_addr(r), self.keys.data) };
            if let Err(s) = p {
                if self.wait(&batch).is_err_and(|e| e.is_none()) {
                    std::mem::forget(desc);
                }
                return Err(failed("a get", api.describe(s)).into());
            }
        }
        self.finish(batch, "a get", desc)?;
        self.range_note(NotificationKind::Read, remote, notify)
    }

    /// Writes `local` at `at` into `remote`, flushed, then sends `notify`
    /// as a WRITE's notification.
    pub(in crate::grant) fn write_ranges(
        &self,
        local: &Pool,
        at: &[(u32, u64)],
        remote: &[BlockRange],
        notify: Option<Vec<u8>>,
    ) -> Result<()> {
        let ids = ranges::local_blocks(at);
        let desc = local.shared_blocks(&ids)?;
        let mut segs = Vec::with_capacity(desc.block_count());
        desc.raw_segments(&mut segs);
        let pieces = copy::pieces(&segs, &ids, at, remote);
        self.control(&ranges::refs(remote))?;
        let batch = crate::transport::ucx::Batch::new();
        let api = &self.ep.worker.ucx.api;
        for (&(src, n), r) in pieces.iter().zip(remote) {
            let (addr, key) = (self.range_addr(r), self.keys.data);
            // SAFETY: `desc` holds the local blocks shared (readable, no
            // writer) until the batch ended (leaked if it never does);
            // each piece lies within its block; the key outlives the batch.
            let p = unsafe {
                post_with(&self.ep, &batch, None, |raw, param| {
                    (api.put_nbx)(raw, src.cast_const().cast(), n, addr, key, param)
                })
            };
            if let Err(s) = p {
                if self.wait(&batch).is_err_and(|e| e.is_none()) {
                    std::mem::forget(desc);
                }
                return Err(failed("a put", api.describe(s)).into());
            }
        }
        // The puts are complete at the owner once the flush ends.
        // SAFETY: a flush hands UCX nothing of ours.
        let f = unsafe {
            post_with(&self.ep, &batch, None, |raw, param| {
                (api.ep_flush_nbx)(raw, param)
            })
        };
        if let Err(s) = f {
            if self.wait(&batch).is_err_and(|e| e.is_none()) {
                std::mem::forget(desc);
            }
            return Err(failed("a flush", api.describe(s)).into());
        }
        self.finish(batch, "a put", desc)?;
        self.range_note(NotificationKind::Write, remote, notify)
    }

    /// Sends a bare notification, once the grant's state was read live.
    pub(in crate::grant) fn notify_message(&self, payload: Vec<u8>) -> Result<()> {
        self.control(&[])?;
        self.notify(NotificationKind::Message, 0, 0, payload)
    }

    fn range_note(
        &self,
        kind: NotificationKind,
        remote: &[BlockRange],
        notify: Option<Vec<u8>>,
    ) -> Result<()> {
        match notify {
            Some(payload) => {
                let first = remote.first().map_or(0, |r| r.block.index);
                self.notify(kind, first, remote.len(), payload)
            }
            None => Ok(()),
        }
    }
}
