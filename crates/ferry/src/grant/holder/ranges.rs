//! Byte ranges and bare notifications on a held grant: the holder reads
//! and writes [`BlockRange`]s of the owner's blocks (NIXL's `(addr, len)`
//! descriptors inside a registered region) from and into `(block, offset)`
//! places of a local pool, and sends notifications that move no byte.
//!
//! Every lane makes the checks it makes for whole blocks: the rights, the
//! expiry, each range inside its block and the grant, then, inside the
//! fence, the revocation and the generations of the blocks the ranges
//! name; the local blocks are taken from their pool as for blocks (each
//! once, however many ranges it holds).

use ferry_proto::grant::{check, ranges, BlockRange, GrantError, Rights};

use super::{Held, Lane, RemoteGrant, RING_PATIENCE};
use crate::grant::{copy, ipc, ring, Notification, NotificationKind};
use crate::{Pool, Result};

impl RemoteGrant {
    /// Reads the owner's byte ranges `remote` into `local` at `local_at`
    /// (`(block, offset)` pairs, one per range, each taking its range's
    /// length; no two overlapping), then, with `notify` (at most
    /// [`MAX_NOTIFICATION`](super::super::MAX_NOTIFICATION) bytes), queues
    /// a [`NotificationKind::Read`] notification for the owner once every
    /// byte was read (its first block: the first range's; its block
    /// count: the number of ranges). Refused, with nothing copied, if the
    /// grant is revoked or expired, gives no READ, a range is empty or
    /// outside its block, a block is out of range or at another
    /// generation than named, or a local place is outside its block.
    pub async fn read_ranges(
        &self,
        remote: &[BlockRange],
        local: &Pool,
        local_at: &[(u32, u64)],
        notify: Option<&[u8]>,
    ) -> Result<()> {
        if let Some(p) = notify {
            check::payload(p.len())?;
        }
        let total = self.range_precheck(Rights::READ, remote, local, local_at, true)?;
        let payload = notify.map(<[u8]>::to_vec);
        let inner = match &self.lane {
            Lane::Cma(h) => h.clone(),
            // Boxed: the TCP lane's future is kilobytes (see `read_blocks`).
            Lane::Tcp(t) => return Box::pin(t.read_ranges(remote, local, local_at, notify)).await,
            Lane::Ucx(u) => {
                let (u, remote, local) = (u.clone(), remote.to_vec(), local.clone());
                let at = local_at.to_vec();
                let op = move || u.read_ranges(&remote, &local, &at, payload);
                return self.run(total, op).await;
            }
        };
        let ids = ranges::local_blocks(local_at);
        let desc = local.blocks(&ids)?;
        let (remote, at) = (remote.to_vec(), local_at.to_vec());
        let op = move || -> Result<()> {
            let mut segs = Vec::with_capacity(desc.block_count());
            desc.raw_segments(&mut segs);
            let pieces = copy::pieces(&segs, &ids, &at, &remote);
            let _in = inner.enter(&ranges::refs(&remote))?;
            if let Some(m) = &inner.ipc {
                // SAFETY: `desc` holds the local blocks exclusively (taken
                // writable from their pool, on the mapping's GPU:
                // `range_precheck`) until it drops after the copy; each
                // piece lies within its block, and no two overlap
                // (`ranges::local`, disjoint).
                unsafe { m.copy_ranges(ipc::Dir::Read, &pieces, &remote) }
                    .map_err(|e| inner.ipc_failed(e))?;
            } else {
                let (l, r) = copy::pair(&pieces, &inner.range_addrs(&remote));
                let plan = copy::plan(&l, &r);
                copy::run(&plan, |l, r| {
                    // SAFETY: `desc` holds the local blocks exclusively
                    // (taken writable from their pool) until it drops
                    // after the copy; each piece lies within its block and
                    // no two overlap (`ranges::local`, disjoint), so no two
                    // threads write one byte; lengths equal pairwise.
                    unsafe { copy::read(&inner.owner, l, r) }
                })
                .map_err(|e| inner.copy_failed(e))?;
            }
            drop(desc);
            if let Some(payload) = payload {
                inner.note(NotificationKind::Read, &remote, payload)?;
            }
            Ok(())
        };
        self.run(total, op).await
    }

    /// Writes `local` at `local_at` (`(block, offset)` pairs, one per
    /// range, each giving its range's length) into the owner's byte ranges
    /// `remote`, then, with `notify`, queues a [`NotificationKind::Write`]
    /// notification for the owner before the operation leaves the fence.
    /// Refused, with nothing copied, as [`read_ranges`](Self::read_ranges)
    /// is (WRITE needed; local places may overlap).
    pub async fn write_ranges(
        &self,
        local: &Pool,
        local_at: &[(u32, u64)],
        remote: &[BlockRange],
        notify: Option<&[u8]>,
    ) -> Result<()> {
        if let Some(p) = notify {
            check::payload(p.len())?;
        }
        let total = self.range_precheck(Rights::WRITE, remote, local, local_at, false)?;
        let payload = notify.map(<[u8]>::to_vec);
        let inner = match &self.lane {
            Lane::Cma(h) => h.clone(),
            Lane::Tcp(t) => return Box::pin(t.write_ranges(local, local_at, remote, notify)).await,
            Lane::Ucx(u) => {
                let (u, remote, local) = (u.clone(), remote.to_vec(), local.clone());
                let at = local_at.to_vec();
                let op = move || u.write_ranges(&local, &at, &remote, payload);
                return self.run(total, op).await;
            }
        };
        let ids = ranges::local_blocks(local_at);
        let desc = local.shared_blocks(&ids)?;
        let (remote, at) = (remote.to_vec(), local_at.to_vec());
        let op = move || -> Result<()> {
            let mut segs = Vec::with_capacity(desc.block_count());
            desc.raw_segments(&mut segs);
            let pieces = copy::pieces(&segs, &ids, &at, &remote);
            let _in = inner.enter(&ranges::refs(&remote))?;
            if let Some(m) = &inner.ipc {
                // SAFETY: `desc` holds the local blocks shared (no writer)
                // until it drops after the copy; they are on the mapping's
                // GPU (`range_precheck`); each piece lies within its block.
                unsafe { m.copy_ranges(ipc::Dir::Write, &pieces, &remote) }
                    .map_err(|e| inner.ipc_failed(e))?;
            } else {
                let (l, r) = copy::pair(&pieces, &inner.range_addrs(&remote));
                let l: Vec<(*const u8, usize)> =
                    l.into_iter().map(|(p, n)| (p.cast_const(), n)).collect();
                let plan = copy::plan(&l, &r);
                // Never into a process that is not the owner (see `Liveness`).
                inner.owner_alive()?;
                let pid = inner.owner.pid();
                copy::run(&plan, |l, r| {
                    // SAFETY: `desc` holds the local blocks shared (no
                    // writer) until it drops after the copy, so each piece
                    // (within its block) is valid for reads; the plan
                    // keeps lengths equal pairwise.
                    unsafe { copy::write(pid, l, r) }
                })
                .map_err(|e| inner.copy_failed(e))?;
            }
            drop(desc);
            if let Some(payload) = payload {
                inner.note(NotificationKind::Write, &remote, payload)?;
            }
            Ok(())
        };
        self.run(total, op).await
    }

    /// Sends the owner a notification that moves no byte (NIXL's
    /// `send_notif`): a [`NotificationKind::Message`] with `payload` (at
    /// most [`MAX_NOTIFICATION`](super::super::MAX_NOTIFICATION) bytes),
    /// queued in order with the notifications of this holder's reads and
    /// writes. Any right sends one; refused if the grant is revoked or
    /// expired.
    pub async fn notify(&self, payload: &[u8]) -> Result<()> {
        check::payload(payload.len())?;
        let m = self.metadata();
        check::expiry(m.expires_at_ms, crate::grant::now_ms())?;
        match &self.lane {
            Lane::Cma(h) => {
                let _in = h.enter(&[])?;
                h.note(NotificationKind::Message, &[], payload.to_vec())
            }
            Lane::Tcp(t) => Box::pin(t.notify(payload)).await,
            Lane::Ucx(u) => {
                let (u, payload) = (u.clone(), payload.to_vec());
                self.run(0, move || u.notify_message(payload)).await
            }
        }
    }

    /// The checks of a range transfer that need no fence: its total bytes.
    fn range_precheck(
        &self,
        needed: Rights,
        remote: &[BlockRange],
        local: &Pool,
        local_at: &[(u32, u64)],
        disjoint: bool,
    ) -> Result<u64> {
        let m = self.metadata();
        check::rights(m.rights, needed)?;
        let held = match &self.lane {
            Lane::Cma(h) => Some(h),
            Lane::Tcp(_) | Lane::Ucx(_) => None,
        };
        check::expiry(m.expires_at_ms, crate::grant::now_ms()).inspect_err(|_| {
            if let Some(h) = held {
                h.unmap();
            }
        })?;
        let total = ranges::check(remote, m.block_size, m.block_count)?;
        ranges::local(
            local_at,
            remote,
            local.block_size() as u64,
            local.block_count() as u64,
            disjoint,
        )?;
        match held.and_then(|h| h.ipc.as_ref()) {
            Some(m) => m.check_local(local.device())?,
            None if !local.device().is_cpu() => {
                return Err(GrantError::NoLane(format!(
                    "the granted memory is host memory and the local pool is on {}: a grant \
                     copies host to host here, GPU to GPU by CUDA IPC",
                    local.device()
                ))
                .into())
            }
            None => {}
        }
        Ok(total)
    }
}

impl Held {
    /// The owner's address ranges of byte ranges `remote` (checked).
    fn range_addrs(&self, remote: &[BlockRange]) -> Vec<(u64, u64)> {
        let bs = self.meta.block_size;
        remote
            .iter()
            .map(|r| {
                let block = u64::from(r.block.index).saturating_mul(bs);
                (
                    self.base.saturating_add(block).saturating_add(r.offset),
                    r.len,
                )
            })
            .collect()
    }

    /// Pushes a notification of `kind` for the operation on `remote` into
    /// the owner's ring (inside the fence), under the process's producer
    /// lock: in order with this holder's other notifications.
    fn note(&self, kind: NotificationKind, remote: &[BlockRange], payload: Vec<u8>) -> Result<()> {
        let mut seq = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        *seq += 1;
        let n = Notification {
            seq: *seq,
            kind,
            first_block: remote.first().map_or(0, |r| r.block.index),
            block_count: remote.len() as u32,
            payload,
            holder: None,
        };
        ring::push(&self.page, &n, RING_PATIENCE).inspect_err(|_| *seq -= 1)?;
        Ok(())
    }
}
