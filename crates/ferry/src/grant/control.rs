//! A grant's control page: a `memfd` the owner creates per grant and maps
//! shared, which the holder maps through `/proc/<owner pid>/fd/<fd>`
//! (opening it takes the same ptrace permission cross-memory attach
//! takes). It holds what the owner and the holder agree on while the grant
//! lives: the grant's identity (cookie, a hash of its token, its shape and
//! rights), the fence (state, in-flight counters), the generation of each
//! block, and the notification ring.
//!
//! Layout (little endian; every field is only ever accessed as an atomic,
//! so a hostile peer scribbling on the page cannot cause undefined
//! behaviour here, only wrong values, which the readers check):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `u64` |
//! | 8 | layout version `u32`, 12: block count `u32` |
//! | 16 | cookie, 16 bytes |
//! | 32 | SHA-256 of the token, 32 bytes |
//! | 64 | grant id `u64`, 72: base `u64`, 80: block size `u64`, 88: expiry (unix ms, 0 never) `u64` |
//! | 96 | rights `u32`, 100: ring capacity `u32` |
//! | 104 | state `u32` (0 live, 1 revoked), 108: phase `u32` |
//! | 112 | in flight, per phase: two `u32` |
//! | 120 | drain waiters `u32`, 124: holder pid `u32`, 128: holder start time `u64` |
//! | 136 | ring head `u32` (owner), 140: ring tail `u32` (holder), 144: owner parked `u32` |
//! | 148 | the owner's notification thread's id `u32` (0 unknown) |
//! | 192 | `generation[block count]`: `u32` each |
//! | then, 64-aligned | ring: capacity × [`ENTRY`] bytes |

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use ferry_proto::grant::{GrantError, GrantId, Rights};

use super::sys::{self, Shared};

const MAGIC: u64 = u64::from_le_bytes(*b"FERRYGNT");
const LAYOUT: u32 = 1;
/// Where the generation table starts.
pub(super) const GENERATIONS: usize = 192;
/// Where the state word is.
pub(super) const STATE_AT: usize = 104;
/// The size of one ring entry: 36 words of 8 bytes (sequence, what and
/// length, first block and count, 256 bytes of payload, one spare).
pub(super) const ENTRY: usize = 288;
/// The ring's capacity (notifications queued and not yet taken by the
/// owner's notification thread).
pub(super) const RING: u32 = 256;

/// Grant state word values.
pub(super) const LIVE: u32 = 0;
pub(super) const REVOKED: u32 = 1;

/// What the owner writes into a fresh page.
pub(super) struct Header {
    pub(super) block_count: u32,
    pub(super) cookie: [u8; 16],
    pub(super) token_hash: [u8; 32],
    pub(super) grant: GrantId,
    pub(super) base: u64,
    pub(super) block_size: u64,
    pub(super) expires_at_ms: u64,
    pub(super) rights: Rights,
}

/// A mapped control page.
pub(crate) struct ControlPage {
    map: Shared,
    fd: OwnedFd,
    block_count: u32,
    ring_at: usize,
    ring_cap: u32,
}

fn ring_offset(block_count: u32) -> usize {
    (GENERATIONS + 4 * block_count as usize).next_multiple_of(64)
}

fn page_len(block_count: u32, ring_cap: u32) -> usize {
    ring_offset(block_count) + ring_cap as usize * ENTRY
}

impl ControlPage {
    /// The owner's fresh page, its header written.
    pub(super) fn create(h: &Header) -> io::Result<ControlPage> {
        let len = page_len(h.block_count, RING);
        let fd = sys::memfd(len)?;
        let map = Shared::map(&fd, len)?;
        let page = ControlPage {
            map,
            fd,
            block_count: h.block_count,
            ring_at: ring_offset(h.block_count),
            ring_cap: RING,
        };
        page.u64(0).store(MAGIC, SeqCst);
        page.u32(8).store(LAYOUT, SeqCst);
        page.u32(12).store(h.block_count, SeqCst);
        page.put_bytes(16, &h.cookie);
        page.put_bytes(32, &h.token_hash);
        page.u64(64).store(h.grant.0, SeqCst);
        page.u64(72).store(h.base, SeqCst);
        page.u64(80).store(h.block_size, SeqCst);
        page.u64(88).store(h.expires_at_ms, SeqCst);
        page.u32(96).store(u32::from(h.rights.bits()), SeqCst);
        page.u32(100).store(RING, SeqCst);
        Ok(page)
    }

    /// The holder's view of a page opened from the owner: checks that it
    /// is a control page of the shape `expected` describes (the cookie,
    /// the token's hash, and every field the metadata repeats), so that a
    /// reused descriptor number, forged or tampered metadata fail here.
    pub(super) fn open(fd: OwnedFd, expected: &Header) -> Result<ControlPage, GrantError> {
        let forged = |what| GrantError::Forged { what };
        let file = sys::file_len(&fd).map_err(|e| GrantError::NoLane(e.to_string()))?;
        let Some(file) = file.filter(|&n| n >= GENERATIONS) else {
            return Err(forged("control page"));
        };
        let want = page_len(expected.block_count, RING);
        if file != want {
            return Err(forged("control page size"));
        }
        if !sys::size_sealed(&fd) {
            return Err(forged("control page seals"));
        }
        let map = Shared::map(&fd, want).map_err(|e| GrantError::NoLane(e.to_string()))?;
        let page = ControlPage {
            map,
            fd,
            block_count: expected.block_count,
            ring_at: ring_offset(expected.block_count),
            ring_cap: RING,
        };
        if page.u64(0).load(SeqCst) != MAGIC || page.u32(8).load(SeqCst) != LAYOUT {
            return Err(forged("control page"));
        }
        if page.get_bytes::<16>(16) != expected.cookie {
            return Err(forged("cookie"));
        }
        if page.get_bytes::<32>(32) != expected.token_hash {
            return Err(forged("token"));
        }
        let same = page.u32(12).load(SeqCst) == expected.block_count
            && page.u64(64).load(SeqCst) == expected.grant.0
            && page.u64(72).load(SeqCst) == expected.base
            && page.u64(80).load(SeqCst) == expected.block_size
            && page.u64(88).load(SeqCst) == expected.expires_at_ms
            && page.u32(96).load(SeqCst) == u32::from(expected.rights.bits())
            && page.u32(100).load(SeqCst) == RING;
        if !same {
            return Err(forged("shape, rights or expiry"));
        }
        Ok(page)
    }

    /// The address and length of the page's header and generation table
    /// (what the UCX lane lets its holder read: `grant/ucx.rs`).
    pub(super) fn control_words(&self) -> (u64, u64) {
        (
            self.map.ptr().as_ptr() as usize as u64,
            (GENERATIONS + 4 * self.block_count as usize) as u64,
        )
    }

    /// The page's descriptor number in this process.
    pub(super) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The word at byte `off` (a multiple of 4 within the mapping).
    fn u32(&self, off: usize) -> &AtomicU32 {
        assert!(
            off % 4 == 0 && off + 4 <= self.map.len(),
            "control page word {off}"
        );
        // SAFETY: the mapping is `map.len()` bytes, page-aligned, alive for
        // the borrow of `self`; `off` is 4-aligned and in bounds (asserted).
        // The word is only ever accessed atomically, here and in the peer.
        unsafe { &*self.map.ptr().as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// The double word at byte `off` (a multiple of 8 within the mapping).
    fn u64(&self, off: usize) -> &AtomicU64 {
        assert!(
            off % 8 == 0 && off + 8 <= self.map.len(),
            "control page word {off}"
        );
        // SAFETY: as in `u32`, 8-aligned.
        unsafe { &*self.map.ptr().as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn put_bytes(&self, off: usize, b: &[u8]) {
        for (i, w) in b.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..w.len()].copy_from_slice(w);
            self.u64(off + 8 * i)
                .store(u64::from_le_bytes(word), SeqCst);
        }
    }

    fn get_bytes<const N: usize>(&self, off: usize) -> [u8; N] {
        let mut out = [0u8; N];
        for (i, w) in out.chunks_mut(8).enumerate() {
            let word = self.u64(off + 8 * i).load(SeqCst).to_le_bytes();
            w.copy_from_slice(&word[..w.len()]);
        }
        out
    }

    pub(super) fn state(&self) -> &AtomicU32 {
        self.u32(104)
    }
    pub(super) fn phase(&self) -> &AtomicU32 {
        self.u32(108)
    }
    pub(super) fn inflight(&self, phase: u32) -> &AtomicU32 {
        self.u32(112 + 4 * (phase as usize & 1))
    }
    pub(super) fn drain_waiters(&self) -> &AtomicU32 {
        self.u32(120)
    }
    pub(super) fn holder_pid(&self) -> &AtomicU32 {
        self.u32(124)
    }
    pub(super) fn holder_start(&self) -> &AtomicU64 {
        self.u64(128)
    }
    pub(super) fn ring_head(&self) -> &AtomicU32 {
        self.u32(136)
    }
    pub(super) fn ring_tail(&self) -> &AtomicU32 {
        self.u32(140)
    }
    pub(super) fn owner_parked(&self) -> &AtomicU32 {
        self.u32(144)
    }
    /// The thread id of the owner's notification thread, which lives as
    /// long as the grant in the owner process (see `holder::Liveness`).
    pub(super) fn owner_tid(&self) -> &AtomicU32 {
        self.u32(148)
    }

    pub(super) fn block_count(&self) -> u32 {
        self.block_count
    }

    /// Block `index`'s generation word; `None` past the blocks.
    pub(super) fn generation(&self, index: u32) -> Option<&AtomicU32> {
        (index < self.block_count).then(|| self.u32(GENERATIONS + 4 * index as usize))
    }

    pub(super) fn ring_cap(&self) -> u32 {
        self.ring_cap
    }

    /// Word `w` (0 to 35) of ring slot `slot` (taken modulo the capacity).
    pub(super) fn entry_word(&self, slot: u32, w: usize) -> &AtomicU64 {
        let at = self.ring_at + (slot % self.ring_cap) as usize * ENTRY + 8 * w.min(ENTRY / 8 - 1);
        self.u64(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(blocks: u32) -> Header {
        Header {
            block_count: blocks,
            cookie: [7; 16],
            token_hash: [9; 32],
            grant: GrantId(3),
            base: 0x1000,
            block_size: 4096,
            expires_at_ms: 0,
            rights: Rights::READ_WRITE,
        }
    }

    #[test]
    fn a_page_opens_only_with_its_own_identity() {
        let page = ControlPage::create(&header(5)).unwrap();
        page.generation(4).unwrap().store(11, SeqCst);
        assert!(page.generation(5).is_none());
        let path = format!("/proc/self/fd/{}", page.raw_fd());
        let reopen = || -> OwnedFd {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
                .into()
        };
        let seen = ControlPage::open(reopen(), &header(5)).unwrap();
        assert_eq!(seen.generation(4).unwrap().load(SeqCst), 11);
        seen.entry_word(RING + 1, 3).store(5, SeqCst);
        assert_eq!(page.entry_word(1, 3).load(SeqCst), 5);
        let mut h = header(5);
        h.cookie[0] ^= 1;
        assert_eq!(
            ControlPage::open(reopen(), &h).err(),
            Some(GrantError::Forged { what: "cookie" })
        );
        let mut h = header(5);
        h.token_hash[31] ^= 1;
        assert_eq!(
            ControlPage::open(reopen(), &h).err(),
            Some(GrantError::Forged { what: "token" })
        );
        let mut h = header(5);
        h.rights = Rights::READ;
        assert!(matches!(
            ControlPage::open(reopen(), &h),
            Err(GrantError::Forged { .. })
        ));
        assert!(matches!(
            ControlPage::open(reopen(), &header(6)),
            Err(GrantError::Forged { .. })
        ));
    }

    #[test]
    fn only_a_sealed_file_of_the_right_size_is_mapped() {
        // A file the other side could shrink under the mapping (SIGBUS).
        let path = std::env::temp_dir().join(format!("ferry-grant-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(page_len(5, RING) as u64).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            ControlPage::open(f.into(), &header(5)).err(),
            Some(GrantError::Forged {
                what: "control page seals"
            })
        );
        // Not a file at all.
        let (r, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(
            ControlPage::open(r.into(), &header(5)).err(),
            Some(GrantError::Forged {
                what: "control page"
            })
        );
    }
}
