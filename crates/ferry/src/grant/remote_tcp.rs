//! The holder's side of a grant opened by TCP: each operation is one or
//! more requests (at most [`MAX_TCP_CHUNK`](super::MAX_TCP_CHUNK) bytes
//! each) that the owner's runtime checks and serves, one round trip each,
//! over this connector's authenticated connection to the owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use ferry_proto::grant::serve::{chunks, Chunk};
use ferry_proto::grant::{BlockRef, GrantError, GrantMetadata};
use ferry_proto::wire::{GrantAnswer, GrantRequest};
use ferry_proto::{DescriptorInfo, Device, OperationKind, RdmaMetadata};

use crate::transport::tcp::TcpTransport;
use crate::{Error, Pool, Result};

mod ranges;

/// A grant held over TCP.
pub(super) struct TcpHeld {
    meta: GrantMetadata,
    /// The owner as the TCP transport reaches it.
    owner: RdmaMetadata,
    tcp: Arc<TcpTransport>,
    /// Generations learned from the owner's refusals of stale ones.
    known: Mutex<HashMap<u32, u32>>,
    revoked: AtomicBool,
}

/// Local block memory as addresses (kept `Send` across awaits; the
/// descriptor that holds the blocks lives as long).
type Segs = Vec<(usize, usize)>;

impl TcpHeld {
    pub(super) fn new(meta: &GrantMetadata, tcp: Arc<TcpTransport>) -> Result<TcpHeld> {
        let Some(lane) = &meta.tcp else {
            return Err(GrantError::NoLane("the grant offers no TCP lane".into()).into());
        };
        let owner = RdmaMetadata::new(
            OperationKind::Read,
            meta.owner.clone(),
            meta.host_id.clone(),
            meta.host_id.clone(),
            lane.addresses.clone(),
            meta.grant.0,
            meta.token,
            vec![DescriptorInfo::new(Device::CPU, meta.block_size)],
        )
        .map_err(|e| GrantError::Malformed(e.to_string()))?;
        Ok(TcpHeld {
            meta: meta.clone(),
            owner,
            tcp,
            known: Mutex::new(HashMap::new()),
            revoked: AtomicBool::new(false),
        })
    }

    pub(super) fn metadata(&self) -> &GrantMetadata {
        &self.meta
    }

    pub(super) fn is_revoked(&self) -> bool {
        self.revoked.load(SeqCst)
    }

    pub(super) fn generation(&self, index: u32) -> Result<u32> {
        if index >= self.meta.block_count {
            return Err(GrantError::OutOfRange {
                index,
                count: self.meta.block_count,
            }
            .into());
        }
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        Ok(known.get(&index).copied().unwrap_or(0))
    }

    fn request(
        &self,
        kind: OperationKind,
        remote: &[BlockRef],
        c: &Chunk,
        last: bool,
    ) -> GrantRequest {
        GrantRequest {
            req: 0,
            grant: self.meta.grant.0,
            token: self.meta.token,
            kind,
            last,
            offset: c.offset,
            len: c.len,
            blocks: remote[c.first..c.first + c.count].to_vec(),
            notify: None,
            bytes: Vec::new(),
        }
    }

    /// Sends one request; a refusal is an error (and teaches this side
    /// what it says: a revocation, a block's generation).
    async fn call(&self, req: GrantRequest) -> Result<GrantAnswer> {
        match self.tcp.grant_call(&self.owner, req).await? {
            GrantAnswer::Refused(e) => {
                match &e {
                    GrantError::Revoked => self.revoked.store(true, SeqCst),
                    GrantError::StaleGeneration { index, current, .. } => {
                        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
                        known.insert(*index, *current);
                    }
                    _ => {}
                }
                Err(Error::Grant(e))
            }
            a => Ok(a),
        }
    }

    /// Reads (the caller checked shapes, rights and ranges).
    pub(super) async fn read_blocks(
        &self,
        remote: &[BlockRef],
        local: &Pool,
        local_blocks: &[u32],
    ) -> Result<()> {
        let desc = local.blocks(local_blocks)?;
        let segs = segments(&desc);
        let all = chunks(remote.len(), self.meta.block_size);
        let n = all.len();
        for (i, c) in all.iter().enumerate() {
            let req = self.request(OperationKind::Read, remote, c, i + 1 == n);
            match self.call(req).await? {
                GrantAnswer::Bytes(b) if b.len() == c.len as usize => {
                    // SAFETY: `desc` holds the local blocks exclusively
                    // (taken writable) until it drops below; `segs` are
                    // theirs, and `c.at + len` lies within their total.
                    unsafe { scatter(&segs, c.at, &b) };
                }
                other => {
                    return Err(GrantError::Copy(format!(
                        "the owner answered a read of {} bytes with {other:?}",
                        c.len
                    ))
                    .into())
                }
            }
        }
        drop(desc);
        Ok(())
    }

    /// Writes (the caller checked shapes, rights, ranges and the payload).
    pub(super) async fn write_blocks(
        &self,
        local: &Pool,
        local_blocks: &[u32],
        remote: &[BlockRef],
        notify: Option<&[u8]>,
    ) -> Result<()> {
        let desc = local.shared_blocks(local_blocks)?;
        let segs = segments(&desc);
        let all = chunks(remote.len(), self.meta.block_size);
        let n = all.len();
        for (i, c) in all.iter().enumerate() {
            let last = i + 1 == n;
            let mut req = self.request(OperationKind::Write, remote, c, last);
            // SAFETY: `desc` holds the local blocks shared (no writer)
            // until it drops below; the range lies within them.
            req.bytes = unsafe { gather(&segs, c.at, c.len as usize) };
            if last {
                req.notify = notify.map(<[u8]>::to_vec);
            }
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
}

fn segments(desc: &crate::Descriptor<'static>) -> Segs {
    let mut raw = Vec::with_capacity(desc.block_count());
    desc.raw_segments(&mut raw);
    raw.into_iter().map(|(p, n)| (p as usize, n)).collect()
}

/// Copies `bytes` into the flat range starting at `at` of `segs`.
///
/// # Safety
///
/// Every segment is valid for writes and touched by nothing else during
/// the call; `at + bytes.len()` is at most the segments' total.
unsafe fn scatter(segs: &Segs, at: u64, bytes: &[u8]) {
    let (mut pos, mut from) = (0u64, 0usize);
    for &(p, n) in segs {
        let end = pos + n as u64;
        if from < bytes.len() && end > at + from as u64 {
            let within = (at + from as u64 - pos) as usize;
            let k = (n - within).min(bytes.len() - from);
            // SAFETY: the caller's contract; `within + k <= n`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr().add(from),
                    (p as *mut u8).add(within),
                    k,
                )
            };
            from += k;
        }
        pos = end;
    }
}

/// The `len` bytes of the flat range starting at `at` of `segs`.
///
/// # Safety
///
/// Every segment is valid for reads and written by nothing during the
/// call; `at + len` is at most the segments' total.
unsafe fn gather(segs: &Segs, at: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut pos = 0u64;
    for &(p, n) in segs {
        let end = pos + n as u64;
        let have = out.len();
        if have < len && end > at + have as u64 {
            let within = (at + have as u64 - pos) as usize;
            let k = (n - within).min(len - have);
            // SAFETY: the caller's contract; `within + k <= n`.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts((p as *const u8).add(within), k)
            });
        }
        pos = end;
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn scatter_and_gather_walk_the_flat_range() {
        let mut a = [0u8; 10];
        let mut b = [0u8; 10];
        let segs = vec![(a.as_mut_ptr() as usize, 10), (b.as_mut_ptr() as usize, 10)];
        let bytes: Vec<u8> = (1..=8).collect();
        // SAFETY: both arrays live and are touched by nothing else.
        unsafe { super::scatter(&segs, 6, &bytes) };
        assert_eq!(a, [0, 0, 0, 0, 0, 0, 1, 2, 3, 4]);
        assert_eq!(b, [5, 6, 7, 8, 0, 0, 0, 0, 0, 0]);
        // SAFETY: as above.
        assert_eq!(unsafe { super::gather(&segs, 6, 8) }, bytes);
    }
}
