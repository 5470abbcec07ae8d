//! The fence between exposed memory and the transports.
//!
//! A [`Region`] is the list of `(pointer, length)` segments of one
//! operation's descriptors. Transports touch that memory only inside
//! [`Region::write_at`] / [`Region::read_at`], which hold the region's lock
//! for the duration of one non-blocking copy or system call. [`Region::close`]
//! takes the same lock and marks the region closed: once it returns, no
//! transport is inside the memory and none will enter it again. Operations
//! close their region before they give their descriptors back or drop them,
//! which is what makes late writes after a cancel impossible.

use std::any::Any;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::Descriptor;

struct Seg {
    ptr: *mut u8,
    len: usize,
}

pub(crate) struct Region {
    open: Mutex<bool>,
    /// Set by `close` before it waits for the lock, so that a transport in
    /// a tight loop of accesses stops at its next one instead of starving
    /// the close (std's mutex is not fair).
    closing: AtomicBool,
    segs: Vec<Seg>,
    writable: bool,
    /// Source memory lent to a peer's cross-memory attach (see `lend`).
    lent: Mutex<Lent>,
    returned: Condvar,
}

/// Leases of a source region to peers that copy from it by cross-memory
/// attach, and the storage kept alive for them.
#[derive(Default)]
struct Lent {
    count: usize,
    kept: Vec<Box<dyn Any + Send>>,
}

// SAFETY: the raw pointers are only dereferenced inside `read_at`/`write_at`,
// or handed to a callback by `write_segments` for the duration of one call,
// while holding `open`'s lock and only while the region is open (`segments`
// gives out addresses, never access); the creator of the region guarantees
// (see `Region::new`) that the memory is valid and unaliased until `close`
// is called. Sharing the region between threads therefore shares nothing
// but access serialized by the mutex.
unsafe impl Send for Region {}
// SAFETY: see `Send`.
unsafe impl Sync for Region {}

/// Why an access did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// The region was closed: the operation ended.
    Closed,
    /// Outside the segment, or a write into read-only memory.
    OutOfBounds,
}

impl Region {
    /// A region over `descs`.
    ///
    /// # Safety
    ///
    /// Until `close` has been called (and has returned), the memory of every
    /// descriptor must stay valid (readable, and writable if `writable`); if
    /// `writable`, nothing but this region may access it, otherwise nothing
    /// but this region may write it (shared readers are fine). Operations
    /// guarantee that by owning or exclusively borrowing the descriptors and
    /// calling `close` before releasing them.
    pub(crate) unsafe fn new(descs: &[Descriptor<'_>], writable: bool) -> Self {
        Region {
            open: Mutex::new(true),
            closing: AtomicBool::new(false),
            segs: descs
                .iter()
                .map(|d| {
                    let (ptr, len) = d.raw();
                    Seg { ptr, len }
                })
                .collect(),
            writable,
            lent: Mutex::new(Lent::default()),
            returned: Condvar::new(),
        }
    }

    /// `(address, length)` of every segment, for a cross-memory lease.
    pub(crate) fn segments(&self) -> Vec<(u64, u64)> {
        self.segs
            .iter()
            .map(|s| (s.ptr as usize as u64, s.len as u64))
            .collect()
    }

    /// The sizes of the segments.
    pub(crate) fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.segs.iter().map(|s| s.len as u64)
    }

    fn lent(&self) -> std::sync::MutexGuard<'_, Lent> {
        self.lent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A peer may now read this memory by cross-memory attach, until the
    /// matching [`give_back`](Self::give_back).
    pub(crate) fn lend(&self) {
        self.lent().count += 1;
    }

    /// The peer stopped reading (it said so, or the connection ended):
    /// storage kept for it is released.
    pub(crate) fn give_back(&self) {
        let kept = {
            let mut l = self.lent();
            l.count = l.count.saturating_sub(1);
            if l.count > 0 {
                return;
            }
            std::mem::take(&mut l.kept)
        };
        self.returned.notify_all();
        drop(kept);
    }

    /// Whether a peer may still be reading this memory.
    pub(crate) fn is_lent(&self) -> bool {
        self.lent().count > 0
    }

    /// Keeps `owner` (the storage behind a segment) alive while the memory
    /// is lent; gives it back if it is not lent (the caller drops it).
    pub(crate) fn keep_while_lent(
        &self,
        owner: Box<dyn Any + Send>,
    ) -> Option<Box<dyn Any + Send>> {
        let mut l = self.lent();
        if l.count == 0 {
            return Some(owner);
        }
        l.kept.push(owner);
        None
    }

    /// Blocks until no peer may read this memory, at most `timeout`; true
    /// if none may.
    pub(crate) fn wait_returned(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut l = self.lent();
        while l.count > 0 {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            l = self
                .returned
                .wait_timeout(l, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    fn range(&self, seg: usize, off: u64, len: usize) -> Result<(&Seg, Range<usize>), Denied> {
        let s = self.segs.get(seg).ok_or(Denied::OutOfBounds)?;
        let start = usize::try_from(off).map_err(|_| Denied::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(Denied::OutOfBounds)?;
        if end > s.len {
            return Err(Denied::OutOfBounds);
        }
        Ok((s, start..end))
    }

    /// Runs `f` on `len` bytes of segment `seg` at `off`, for writing.
    /// `f` must not block: one memcpy or one non-blocking system call.
    pub(crate) fn write_at<R>(
        &self,
        seg: usize,
        off: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, Denied> {
        if !self.writable {
            return Err(Denied::OutOfBounds);
        }
        let (s, r) = self.range(seg, off, len)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if !*open {
            return Err(Denied::Closed);
        }
        // SAFETY: the region is open (checked under the lock, which we hold
        // until `f` returns, so `close` cannot complete meanwhile); by
        // `Region::new`'s contract the segment is valid, writable and accessed
        // by no one else; `r` lies within the segment (checked by `range`); the
        // lock serializes all accesses through this region, so this `&mut` is
        // unique.
        let slice = unsafe { std::slice::from_raw_parts_mut(s.ptr.add(r.start), r.len()) };
        Ok(f(slice))
    }

    /// Runs `f` with the raw `(pointer, length)` of whole segments
    /// `first..first + count`, for writing, under the lock like
    /// [`write_at`](Self::write_at): one system call that fills several
    /// segments (a vectored cross-memory copy). `f` gets pointers, not
    /// slices, so that segments that overlap (possible with raw descriptors)
    /// never become two `&mut` at once; it must not block beyond one call.
    pub(crate) fn write_segments<R>(
        &self,
        first: usize,
        count: usize,
        f: impl FnOnce(&[(*mut u8, usize)]) -> R,
    ) -> Result<R, Denied> {
        if !self.writable {
            return Err(Denied::OutOfBounds);
        }
        let end = first.checked_add(count).ok_or(Denied::OutOfBounds)?;
        let segs = self.segs.get(first..end).ok_or(Denied::OutOfBounds)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let raw: Vec<(*mut u8, usize)> = segs.iter().map(|s| (s.ptr, s.len)).collect();
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if !*open {
            return Err(Denied::Closed);
        }
        // The region is open and stays open while we hold the lock, so by
        // `Region::new`'s contract every pointer is valid for writes of its
        // length and nothing else accesses that memory until `f` returns.
        Ok(f(&raw))
    }

    /// Runs `f` on `len` bytes of segment `seg` at `off`, for reading.
    pub(crate) fn read_at<R>(
        &self,
        seg: usize,
        off: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, Denied> {
        let (s, r) = self.range(seg, off, len)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if !*open {
            return Err(Denied::Closed);
        }
        // SAFETY: as in `write_at`, for a shared slice; the lock excludes any
        // concurrent writer through this region.
        let slice = unsafe { std::slice::from_raw_parts(s.ptr.add(r.start), r.len()) };
        Ok(f(slice))
    }

    /// Runs `f` if the region is still open, under its lock, so that `f`
    /// happens either entirely before or entirely after a `close`.
    pub(crate) fn seal_if_open(&self, f: impl FnOnce()) -> bool {
        if self.closing.load(Ordering::Acquire) {
            return false;
        }
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if *open {
            f();
        }
        *open
    }

    /// Closes the region unless it is already closed or closing; true if
    /// every access so far found it open (nothing was dropped).
    pub(crate) fn close_if_intact(&self) -> bool {
        if self.closing.load(Ordering::Acquire) {
            return false;
        }
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let intact = *open && !self.closing.swap(true, Ordering::AcqRel);
        *open = false;
        intact
    }

    /// Ends all access. When this returns, no transport is touching the
    /// memory and none will again.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }

    /// Whether the region is open and nobody has begun to close it.
    pub(crate) fn is_open(&self) -> bool {
        !self.closing.load(Ordering::Acquire)
            && *self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_close_are_enforced() {
        let descs = vec![
            Descriptor::from_vec(vec![0; 8]),
            Descriptor::from_vec(vec![0; 4]),
        ];
        // SAFETY: the descriptors outlive the region and are not touched elsewhere.
        let r = unsafe { Region::new(&descs, true) };
        assert_eq!(r.write_at(0, 4, 4, |s| s.fill(7)), Ok(()));
        assert_eq!(r.write_at(0, 5, 4, |_| ()), Err(Denied::OutOfBounds));
        assert_eq!(r.write_at(1, u64::MAX, 2, |_| ()), Err(Denied::OutOfBounds));
        assert_eq!(r.write_at(2, 0, 0, |_| ()), Err(Denied::OutOfBounds));
        assert_eq!(
            r.read_at(0, 0, 8, |s| s.to_vec()),
            Ok(vec![0, 0, 0, 0, 7, 7, 7, 7])
        );
        r.close();
        assert_eq!(r.read_at(0, 0, 1, |_| ()), Err(Denied::Closed));
        assert_eq!(r.write_at(0, 0, 1, |_| ()), Err(Denied::Closed));
        // SAFETY: as above.
        let ro = unsafe { Region::new(&descs, false) };
        assert_eq!(ro.write_at(0, 0, 1, |_| ()), Err(Denied::OutOfBounds));
        assert_eq!(ro.write_segments(0, 1, |_| ()), Err(Denied::OutOfBounds));
    }

    #[test]
    fn lent_storage_lives_until_every_lease_is_given_back() {
        let descs = vec![
            Descriptor::from_vec(vec![0; 8]),
            Descriptor::from_vec(vec![0; 4]),
        ];
        // SAFETY: the descriptors outlive the region and are not touched elsewhere.
        let r = std::sync::Arc::new(unsafe { Region::new(&descs, true) });
        assert_eq!(r.write_segments(0, 2, |raw| raw.len()), Ok(2));
        assert_eq!(r.write_segments(1, 2, |_| ()), Err(Denied::OutOfBounds));
        // Not lent: the storage is handed back to be dropped at once.
        assert!(r.keep_while_lent(Box::new(1u8)).is_some());
        r.lend();
        r.lend();
        let storage = std::sync::Arc::new(());
        assert!(r.keep_while_lent(Box::new(storage.clone())).is_none());
        assert!(r.is_lent());
        assert!(!r.wait_returned(Duration::from_millis(10)));
        r.give_back();
        // One lease is still out: the storage stays.
        assert_eq!(std::sync::Arc::strong_count(&storage), 2);
        let waiter = std::thread::spawn({
            let r = r.clone();
            move || r.wait_returned(Duration::from_secs(10))
        });
        r.give_back();
        assert!(
            waiter.join().unwrap(),
            "the waiter woke when the last lease ended"
        );
        assert_eq!(
            std::sync::Arc::strong_count(&storage),
            1,
            "kept storage released"
        );
        assert!(!r.is_lent());
        r.close();
        assert_eq!(r.write_segments(0, 1, |_| ()), Err(Denied::Closed));
    }
}
