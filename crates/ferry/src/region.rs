//! The fence between exposed memory and the transports.
//!
//! A [`Region`] is the list of `(pointer, length)` segments of one
//! operation's descriptors. Transports touch that memory only inside
//! [`Region::write_at`] / [`Region::read_at`], which hold the region's lock
//! for the duration of one non-blocking copy or system call, or inside
//! [`Region::copy_into`] (or [`Region::copy_into_each`]), a copy that a
//! peer may stall (a cross-memory copy
//! from pages that never arrive), which runs *outside* the lock.
//! [`Region::close`] takes the lock and marks the region closed: once it
//! returns, no locked access is inside the memory and none will enter it
//! again, and it never waits for a stalled copy. A copy still in flight is
//! counted ([`Region::is_quiet`]): the operation keeps its memory away from
//! its user until it returns (owned storage is kept alive by the region,
//! see [`Region::keep_while_used`]; borrowed memory is waited for). That is
//! what makes late writes after a cancel impossible to observe, and a
//! stalled peer unable to block anything but the one thread doing its copy.

use std::any::Any;
use std::io::{IoSlice, IoSliceMut};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::lane::Mem;
use ferry_proto::Device;

use crate::cuda::CudaError;
use crate::descriptor::Descriptor;
use crate::regcache::RegCache;
use crate::transport::pull::registration::Registration;

/// How long [`Region::close`] waits for an unlocked copy in flight before it
/// leaves it behind: far longer than an ordinary chunk takes, far shorter
/// than anything a caller would notice.
pub(crate) const COPY_GRACE: Duration = Duration::from_millis(20);

/// The most slices [`Region::write_span`] and [`Region::read_span`] hand
/// out at once: one system call's worth (Linux's `IOV_MAX`, less one for a
/// frame header).
pub(crate) const SPAN_SLICES: usize = 1023;

struct Seg {
    ptr: *mut u8,
    len: usize,
}

pub(crate) struct Region {
    open: Mutex<bool>,
    /// Copies running outside the lock (see `copy_into`); counted up under
    /// the lock.
    copying: AtomicUsize,
    /// Set by `close` before it waits for the lock, so that a transport in
    /// a tight loop of accesses stops at its next one instead of starving
    /// the close (std's mutex is not fair).
    closing: AtomicBool,
    segs: Vec<Seg>,
    /// Segments `[start, start + count)` that are blocks of a pool, with
    /// the pool's registrations (see `regcache.rs`).
    pools: Vec<(usize, usize, Arc<RegCache>)>,
    writable: bool,
    /// `None`: host memory (every descriptor on the CPU), which the locked
    /// accesses may dereference. `Some`: the device of the first descriptor
    /// that is not (device memory), which no access here dereferences:
    /// only [`copy_into`](Region::copy_into) hands its addresses out (to a
    /// puller that copies with the device's own engine), and
    /// [`stage_in`](Region::stage_in)/[`stage_out`](Region::stage_out)
    /// give them to the driver's copies.
    device: Option<Device>,
    /// Source memory lent to a peer's cross-memory attach (see `lend`), and
    /// destination memory that an unlocked copy still targets.
    lent: Mutex<Lent>,
    returned: Condvar,
}

/// Who may still touch the memory outside the lock, and the storage kept
/// alive for them.
#[derive(Default)]
struct Lent {
    /// Leases of a source region to peers that copy from it by cross-memory
    /// attach.
    count: usize,
    /// What the lane that lends it keeps while the memory is lent (UCX: its
    /// registrations), dropped when the last lease ends. Declared before
    /// `kept` so that, dropped with the region, it ends before the storage
    /// it describes is freed.
    lease_state: Option<Registration>,
    kept: Vec<Box<dyn Any + Send>>,
}

// SAFETY: the raw pointers are only dereferenced inside `read_at`/`write_at`,
// while holding `open`'s lock and only while the region is open, or handed
// to `copy_into`'s (or `copy_into_each`'s) callback, which the region
// counts as in flight from
// before the lock is released until after it returns, and which excludes
// every locked access meanwhile (`segments` gives out addresses, never
// access); the creator of the region guarantees (see `Region::new`) that the
// memory is valid and unaliased until `close` is called and no copy is in
// flight. Sharing the region between threads therefore shares nothing but
// access serialized by the mutex and its in-flight count.
unsafe impl Send for Region {}
// SAFETY: see `Send`.
unsafe impl Sync for Region {}

/// Why an access did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// The region was closed: the operation ended.
    Closed,
    /// Outside the segment, or a write into read-only memory, or into
    /// memory that an unlocked copy is filling.
    OutOfBounds,
    /// The region is device memory (GPU): the host must not dereference
    /// it, so no locked access (which builds slices) is made. Only a
    /// puller's [`copy_into`](Region::copy_into) and the driver's staged
    /// copies ([`stage_in`](Region::stage_in)) reach it.
    NotHostMemory,
}

impl Region {
    /// A region over `descs`: one segment per descriptor, or per block of
    /// a paged one.
    ///
    /// # Safety
    ///
    /// Until `close` has been called (and has returned) and no copy is in
    /// flight ([`is_quiet`](Self::is_quiet)), the memory of every
    /// descriptor must stay valid (readable, and writable if `writable`); if
    /// `writable`, nothing but this region may access it, otherwise nothing
    /// but this region may write it (shared readers are fine). Operations
    /// guarantee that by owning or exclusively borrowing the descriptors,
    /// calling `close` before releasing them, and handing owned storage to
    /// [`keep_while_used`](Self::keep_while_used) (or waiting with
    /// [`wait_quiet`](Self::wait_quiet) for borrowed memory).
    pub(crate) unsafe fn new(descs: &[Descriptor<'_>], writable: bool) -> Self {
        Region {
            open: Mutex::new(true),
            copying: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            segs: {
                let mut raw = Vec::with_capacity(descs.iter().map(|d| d.block_count()).sum());
                for d in descs {
                    d.raw_segments(&mut raw);
                }
                raw.into_iter().map(|(ptr, len)| Seg { ptr, len }).collect()
            },
            pools: {
                let mut at = 0;
                let mut pools = Vec::new();
                for d in descs {
                    if let Some(c) = d.reg_cache() {
                        pools.push((at, d.block_count(), c.clone()));
                    }
                    at += d.block_count();
                }
                pools
            },
            writable,
            device: descs.iter().map(|d| d.device()).find(|d| !d.is_cpu()),
            lent: Mutex::new(Lent::default()),
            returned: Condvar::new(),
        }
    }

    /// Whether this is a destination (bytes may be written into it).
    pub(crate) fn is_writable(&self) -> bool {
        self.writable
    }

    /// Whether this is host memory (every descriptor on the CPU): only then
    /// do the locked accesses (`write_at`, `read_at`, `write_span`,
    /// `read_span`) dereference it; otherwise they are
    /// [`Denied::NotHostMemory`].
    pub(crate) fn is_host(&self) -> bool {
        self.device.is_none()
    }

    /// The kind of its memory, as the lane planner sees it
    /// (`ferry_proto::session::lane_for`).
    pub(crate) fn mem(&self) -> Mem {
        Mem::of(self.device.is_some())
    }

    /// The device of device memory (the first descriptor not on the CPU);
    /// `None` for host memory.
    pub(crate) fn device(&self) -> Option<Device> {
        self.device
    }

    /// `Err(NotHostMemory)` for device memory: the first check of every
    /// access that dereferences the memory on the host.
    fn host_only(&self) -> Result<(), Denied> {
        if self.is_host() {
            Ok(())
        } else {
            Err(Denied::NotHostMemory)
        }
    }

    /// The sizes of the segments.
    pub(crate) fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.segs.iter().map(|s| s.len as u64)
    }

    /// `(address, length)` of every segment, for a cross-memory lease.
    pub(crate) fn segments(&self) -> Vec<(u64, u64)> {
        self.segs
            .iter()
            .map(|s| (s.ptr as usize as u64, s.len as u64))
            .collect()
    }

    /// The runs of segments that are blocks of a pool: `(first segment,
    /// count, the pool's registrations)`.
    pub(crate) fn pools(&self) -> &[(usize, usize, Arc<RegCache>)] {
        &self.pools
    }

    /// Whether segment `b` starts where segment `a` ends (two blocks that
    /// one copy can fill). Addresses only: touches no memory.
    pub(crate) fn follows(&self, a: usize, b: usize) -> bool {
        match (self.segs.get(a), self.segs.get(b)) {
            (Some(a), Some(b)) => a.ptr.wrapping_add(a.len) == b.ptr,
            _ => false,
        }
    }

    /// Whether segments `a` and `b` are blocks of one pool (one paged
    /// descriptor).
    pub(crate) fn same_pool(&self, a: usize, b: usize) -> bool {
        // `pools` is in segment order: the last one starting at or before `a`.
        let i = self.pools.partition_point(|&(first, _, _)| first <= a);
        i > 0 && {
            let (first, count, _) = self.pools[i - 1];
            (first..first + count).contains(&a) && (first..first + count).contains(&b)
        }
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
    /// storage kept for it is released, and what a backend kept for the
    /// leases (after which no remote key of this region works).
    pub(crate) fn give_back(&self) {
        let (kept, state) = {
            let mut l = self.lent();
            l.count = l.count.saturating_sub(1);
            let state = if l.count == 0 {
                l.lease_state.take()
            } else {
                None
            };
            if self.in_use(&l) {
                drop(l);
                drop(state);
                return;
            }
            (std::mem::take(&mut l.kept), state)
        };
        self.returned.notify_all();
        drop(state);
        drop(kept);
    }

    /// Runs `f` on the state a lane keeps while this memory is lent
    /// (see [`give_back`](Self::give_back)).
    pub(crate) fn lease_state<R>(&self, f: impl FnOnce(&mut Option<Registration>) -> R) -> R {
        f(&mut self.lent().lease_state)
    }

    /// Whether no unlocked copy into this region is in flight.
    pub(crate) fn is_quiet(&self) -> bool {
        self.copying.load(Ordering::Acquire) == 0
    }

    /// Blocks until no unlocked copy into this region is in flight, at most
    /// `timeout`; true if none is.
    pub(crate) fn wait_quiet(&self, timeout: Duration) -> bool {
        self.wait_while(timeout, |_| !self.is_quiet())
    }

    /// Whether a peer may still be reading this memory.
    pub(crate) fn is_lent(&self) -> bool {
        self.lent().count > 0
    }

    /// Whether a peer may still read this memory, or a copy still fills it.
    pub(crate) fn is_in_use(&self) -> bool {
        self.in_use(&self.lent())
    }

    /// With the `lent` lock held (so that a copy ending meanwhile finds
    /// whatever was kept).
    fn in_use(&self, l: &Lent) -> bool {
        l.count > 0 || !self.is_quiet()
    }

    /// Keeps `owner` (the storage behind a segment) alive while the memory
    /// is lent or an unlocked copy still targets it; gives it back if
    /// neither (the caller drops it).
    pub(crate) fn keep_while_used(
        &self,
        owner: Box<dyn Any + Send>,
    ) -> Option<Box<dyn Any + Send>> {
        let mut l = self.lent();
        if !self.in_use(&l) {
            return Some(owner);
        }
        l.kept.push(owner);
        None
    }

    /// Blocks until no peer may read this memory, at most `timeout`; true
    /// if none may.
    pub(crate) fn wait_returned(&self, timeout: Duration) -> bool {
        self.wait_while(timeout, |l| l.count > 0)
    }

    fn wait_while(&self, timeout: Duration, busy: impl Fn(&Lent) -> bool) -> bool {
        let end = Instant::now() + timeout;
        let mut l = self.lent();
        while busy(&l) {
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

    fn state(&self) -> std::sync::MutexGuard<'_, bool> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock, for an access under it: refused once closed, and while an
    /// unlocked copy fills the memory (no transport does both at once for
    /// one operation; refusing keeps every `&mut` unique regardless).
    fn access(&self) -> Result<std::sync::MutexGuard<'_, bool>, Denied> {
        let open = self.state();
        if !*open {
            return Err(Denied::Closed);
        }
        if !self.is_quiet() {
            return Err(Denied::OutOfBounds);
        }
        Ok(open)
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
        self.host_only()?;
        if !self.writable {
            return Err(Denied::OutOfBounds);
        }
        let (s, r) = self.range(seg, off, len)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let _held = self.access()?;
        // SAFETY: the region is open (checked under the lock, which we hold
        // until `f` returns, so `close` cannot complete meanwhile); by
        // `Region::new`'s contract the segment is valid, writable and accessed
        // by no one else; `r` lies within the segment (checked by `range`); the
        // lock serializes all accesses through this region, so this `&mut` is
        // unique.
        let slice = unsafe { std::slice::from_raw_parts_mut(s.ptr.add(r.start), r.len()) };
        Ok(f(slice))
    }

    /// Where the byte `n` bytes after `off` of segment `seg` lies, the
    /// segments' bytes taken as one flat sequence: `(segment, offset)`,
    /// past full and empty segments (the end: `(segment count, 0)`).
    pub(crate) fn advance(&self, mut seg: usize, mut off: u64, n: usize) -> (usize, u64) {
        let mut rest = n as u64;
        while let Some(s) = self.segs.get(seg) {
            let room = (s.len as u64).saturating_sub(off);
            if rest < room {
                return (seg, off + rest);
            }
            rest -= room;
            seg += 1;
            off = 0;
        }
        (seg, 0)
    }

    /// The pieces of a span: up to `len` bytes from `off` of segment `seg`
    /// on, into the segments that follow, at most [`SPAN_SLICES`] pieces
    /// (empty ones left out); fewer bytes only for that limit, else
    /// `OutOfBounds`.
    fn span(&self, seg: usize, off: u64, len: usize) -> Result<Vec<(*mut u8, usize)>, Denied> {
        let mut out: Vec<(*mut u8, usize)> = Vec::new();
        // The segment of the last piece.
        let mut last = None;
        let (mut seg, mut off, mut left) = (seg, off, len);
        while left > 0 && out.len() < SPAN_SLICES {
            let s = self.segs.get(seg).ok_or(Denied::OutOfBounds)?;
            let start = usize::try_from(off).map_err(|_| Denied::OutOfBounds)?;
            if start > s.len {
                return Err(Denied::OutOfBounds);
            }
            let n = (s.len - start).min(left);
            if n > 0 {
                // In bounds: `start + n <= s.len`.
                let p = s.ptr.wrapping_add(start);
                match (out.last_mut(), last) {
                    // Blocks of one pool that follow each other are one
                    // slice: fewer pieces per system call, more bytes per
                    // frame. Only within a pool, whose blocks are one
                    // allocation (a slice may not span two).
                    (Some((q, m)), Some(l))
                        if q.wrapping_add(*m) == p && self.same_pool(l, seg) =>
                    {
                        *m += n
                    }
                    _ => out.push((p, n)),
                }
                last = Some(seg);
                left -= n;
            }
            seg += 1;
            off = 0;
        }
        Ok(out)
    }

    /// Runs `f` on the bytes of a span (see [`advance`](Self::advance)): up
    /// to `len` bytes from `off` of segment `seg` on, running into the
    /// segments that follow, as at most [`SPAN_SLICES`] slices, for
    /// writing, under the lock. `f` must not block: copies, or one
    /// non-blocking system call (a vectored read).
    pub(crate) fn write_span<R>(
        &self,
        seg: usize,
        off: u64,
        len: usize,
        f: impl FnOnce(&mut [IoSliceMut<'_>]) -> R,
    ) -> Result<R, Denied> {
        self.host_only()?;
        if !self.writable {
            return Err(Denied::OutOfBounds);
        }
        let raw = self.span(seg, off, len)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let _held = self.access()?;
        let mut slices: Vec<IoSliceMut<'_>> = raw
            .into_iter()
            // SAFETY: as in `write_at`, for each piece: the region is open
            // and locked until `f` returns; each piece lies within one
            // segment, or within blocks of one pool that follow each other
            // (`span` checked it), so within one allocation (a pool's
            // memory is one: `Pool::from_raw_parts`); the pieces of distinct
            // segments do not overlap (segments of one writable region
            // never do: the pool hands a block to one writable descriptor
            // at a time, and a writable descriptor names a block once).
            .map(|(p, n)| IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(p, n) }))
            .collect();
        Ok(f(&mut slices))
    }

    /// [`write_span`](Self::write_span) for reading: the slices of a span,
    /// under the lock.
    pub(crate) fn read_span<R>(
        &self,
        seg: usize,
        off: u64,
        len: usize,
        f: impl FnOnce(&[IoSlice<'_>]) -> R,
    ) -> Result<R, Denied> {
        self.host_only()?;
        let raw = self.span(seg, off, len)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let _held = self.access()?;
        let slices: Vec<IoSlice<'_>> = raw
            .into_iter()
            // SAFETY: as in `read_at`, for each piece: open and locked until
            // `f` returns, each piece within one segment or within blocks
            // of one pool that follow each other (checked by `span`): one
            // allocation either way.
            .map(|(p, n)| IoSlice::new(unsafe { std::slice::from_raw_parts(p, n) }))
            .collect();
        Ok(f(&slices))
    }

    /// For *device* memory, what [`write_span`](Self::write_span) is for
    /// host memory: copies `src` into the span from `off` of segment `seg`
    /// on (into the segments that follow) through the device's copy engine
    /// (`cuda::stage`), under the lock, and returns how many bytes went
    /// (all of `src`, unless the span needed more than [`SPAN_SLICES`]
    /// pieces) once they are on the device: a [`close`](Self::close), which
    /// waits for the lock, is never followed by a staged byte.
    /// `OutOfBounds` for host memory (the locked host accesses serve it),
    /// for read-only memory, and past the segments; the engine's failure is
    /// the inner error.
    pub(crate) fn stage_in(
        &self,
        seg: usize,
        off: u64,
        src: &[u8],
    ) -> Result<Result<usize, CudaError>, Denied> {
        if !self.writable {
            return Err(Denied::OutOfBounds);
        }
        self.device_span(seg, off, src.len(), |device, pieces| {
            let n: usize = pieces.iter().map(|p| p.1).sum();
            // SAFETY: the pieces lie within the region's segments (`span`
            // checked them), which `Region::new`'s contract keeps valid,
            // writable and unaliased while the region is open, and it is
            // open and locked until the copy returns (`device_span`); the
            // region's segments are device memory of `device` (every
            // descriptor of a device region is on one device:
            // `policy::one_memory`), or host memory in a simulated process.
            unsafe { crate::cuda::stage::to_device(device, pieces, &src[..n]) }.map(|()| n)
        })
    }

    /// [`stage_in`](Self::stage_in) the other way: copies from the span
    /// into `dst`, returning how many bytes came.
    pub(crate) fn stage_out(
        &self,
        seg: usize,
        off: u64,
        dst: &mut [u8],
    ) -> Result<Result<usize, CudaError>, Denied> {
        let len = dst.len();
        self.device_span(seg, off, len, |device, pieces| {
            let n: usize = pieces.iter().map(|p| p.1).sum();
            // SAFETY: as in `stage_in`, for reads: nothing writes the
            // region's memory but the region (its contract), and every
            // access through it is excluded while the lock is held.
            unsafe { crate::cuda::stage::from_device(device, pieces, &mut dst[..n]) }.map(|()| n)
        })
    }

    /// The device addresses and lengths of up to `len` bytes from `off` of
    /// segment `seg` on (at most [`SPAN_SLICES`] pieces), handed to `f`
    /// with the device's ordinal under the lock. Nothing here dereferences
    /// them.
    fn device_span<R>(
        &self,
        seg: usize,
        off: u64,
        len: usize,
        f: impl FnOnce(u32, &[(u64, usize)]) -> R,
    ) -> Result<R, Denied> {
        let Some(device) = self.device else {
            return Err(Denied::OutOfBounds);
        };
        let raw = self.span(seg, off, len)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let _held = self.access()?;
        let pieces: Vec<(u64, usize)> = raw.into_iter().map(|(p, n)| (p as u64, n)).collect();
        Ok(f(device.id(), &pieces))
    }

    /// Runs `f` with the raw `(pointer, length)` of the bytes `off..off +
    /// len` of each segment `first..first + count` (`off`/`len` apply to
    /// every segment; `None`: whole segments), for writing, *without*
    /// holding the lock: for one copy that a peer may stall (a cross-memory
    /// copy from pages that never arrive). The copy is counted as in flight
    /// from before the lock is released until `f` returns, so that a
    /// [`close`](Self::close) meanwhile returns at once while the memory
    /// stays reserved for the copy (locked accesses are refused, owned
    /// storage is kept, see [`keep_while_used`](Self::keep_while_used)).
    /// `Err(Closed)` if the region was closed before `f` started or while
    /// it ran (whatever `f` wrote then belongs to an ended operation).
    pub(crate) fn copy_into<R>(
        &self,
        first: usize,
        count: usize,
        part: Option<(u64, usize)>,
        f: impl FnOnce(&[(*mut u8, usize)]) -> R,
    ) -> Result<R, Denied> {
        if !self.writable {
            return Err(Denied::OutOfBounds);
        }
        let end = first.checked_add(count).ok_or(Denied::OutOfBounds)?;
        let segs = self.segs.get(first..end).ok_or(Denied::OutOfBounds)?;
        let mut raw = Vec::with_capacity(segs.len());
        for (i, s) in segs.iter().enumerate() {
            raw.push(match part {
                None => (s.ptr, s.len),
                Some((off, len)) => {
                    let (s, r) = self.range(first + i, off, len)?;
                    // `range` checked that `r` lies within the segment. An
                    // address computation only (device memory's addresses
                    // are not the host's), so no dereference here.
                    (s.ptr.wrapping_add(r.start), r.len())
                }
            });
        }
        self.copy_counted(&raw, f)
    }

    /// [`copy_into`](Self::copy_into) for the whole segments listed in
    /// `which`, in that order (any order, each at most once: a pull that
    /// copies in the source's address order). `Err(OutOfBounds)` if one is
    /// not a segment of the region or is listed twice.
    pub(crate) fn copy_into_each<R>(
        &self,
        which: &[usize],
        f: impl FnOnce(&[(*mut u8, usize)]) -> R,
    ) -> Result<R, Denied> {
        if !self.writable {
            return Err(Denied::OutOfBounds);
        }
        let mut raw = Vec::with_capacity(which.len());
        for &i in which {
            let s = self.segs.get(i).ok_or(Denied::OutOfBounds)?;
            raw.push((s.ptr, s.len));
        }
        // Listed twice, two ranges of one call would alias: refused. Sorted
        // copies of short lists are cheap next to the copy itself.
        let mut seen = which.to_vec();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(Denied::OutOfBounds);
        }
        self.copy_counted(&raw, f)
    }

    /// The counted, unlocked part of [`copy_into`](Self::copy_into): `raw`
    /// lies within the region's segments (the callers checked).
    fn copy_counted<R>(
        &self,
        raw: &[(*mut u8, usize)],
        f: impl FnOnce(&[(*mut u8, usize)]) -> R,
    ) -> Result<R, Denied> {
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        {
            // Counted under the lock, so that no locked access is in the
            // memory now and none enters it until the count goes down.
            let open = self.state();
            if !*open {
                return Err(Denied::Closed);
            }
            self.copying.fetch_add(1, Ordering::AcqRel);
        }
        // The copy is counted as in flight: until it is uncounted below, no
        // locked access touches this memory, and the operation neither
        // frees nor hands back its storage (`Region::new`'s contract), so
        // every pointer stays valid for writes of its length and nothing
        // else accesses that memory until `f` returns.
        let r = f(raw);
        self.copying.fetch_sub(1, Ordering::AcqRel);
        let open = self.is_open();
        let kept = {
            let mut l = self.lent();
            if self.in_use(&l) {
                Vec::new()
            } else {
                std::mem::take(&mut l.kept)
            }
        };
        self.returned.notify_all();
        drop(kept);
        if open {
            Ok(r)
        } else {
            Err(Denied::Closed)
        }
    }

    /// Runs `f` on `len` bytes of segment `seg` at `off`, for reading.
    pub(crate) fn read_at<R>(
        &self,
        seg: usize,
        off: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, Denied> {
        self.host_only()?;
        let (s, r) = self.range(seg, off, len)?;
        if self.closing.load(Ordering::Acquire) {
            return Err(Denied::Closed);
        }
        let _held = self.access()?;
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
        let open = self.state();
        if *open {
            f();
        }
        *open
    }

    /// Closes the region unless it is already closed or closing, and if
    /// every access so far found it open (nothing was dropped) runs `f`
    /// under its lock, so that a `close` that follows finds what `f` did
    /// (a destination's seal); true if it did.
    pub(crate) fn close_if_intact(&self, f: impl FnOnce()) -> bool {
        if self.closing.load(Ordering::Acquire) {
            return false;
        }
        let mut open = self.state();
        let intact = *open && !self.closing.swap(true, Ordering::AcqRel);
        *open = false;
        if intact {
            f();
        }
        intact
    }

    /// Ends all access. When this returns, no locked access is touching the
    /// memory and none will again. An unlocked copy in flight is given
    /// [`COPY_GRACE`] to return (an ordinary chunk takes a millisecond or
    /// so); one that a peer stalled may still be in flight after
    /// that (see [`is_quiet`](Self::is_quiet)).
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        *self.state() = false;
        if !self.is_quiet() {
            self.wait_quiet(COPY_GRACE);
        }
    }

    /// Whether the region is open and nobody has begun to close it.
    pub(crate) fn is_open(&self) -> bool {
        !self.closing.load(Ordering::Acquire) && *self.state()
    }
}

#[cfg(test)]
mod tests;
