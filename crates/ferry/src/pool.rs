//! Registered pools and paged descriptors: blocks of one region of memory
//! (a KV cache) named by id, with no object per block.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use ferry_proto::{Device, MAX_DESCRIPTORS};

use crate::descriptor::Blocks;
use crate::descriptor::Descriptor;
use crate::regcache::RegCache;

/// Why a pool or a paged descriptor was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The block size is zero or larger than the pool.
    #[error("block size {block} does not fit a pool of {size} bytes (it must be 1 to {size})")]
    BadBlockSize {
        /// The block size asked for.
        block: usize,
        /// The pool's size.
        size: usize,
    },
    /// A block id past the end of the pool.
    #[error("block id {id} (entry {index}) is out of range: the pool has blocks 0 to {last}")]
    OutOfRange {
        /// Where in the list.
        index: usize,
        /// The id.
        id: u32,
        /// The last valid id.
        last: u64,
    },
    /// A slice of a block that does not lie within the block.
    #[error("a slice of {len} bytes at offset {offset} does not fit blocks of {block} bytes")]
    BadSlice {
        /// Offset within each block.
        offset: usize,
        /// Bytes taken from each block.
        len: usize,
        /// The block size.
        block: usize,
    },
    /// No block ids, or more than an operation may have.
    #[error("{0} block ids given: a paged descriptor takes 1 to {max}", max = MAX_DESCRIPTORS)]
    BadCount(usize),
    /// A block already taken by another live descriptor in a way that
    /// conflicts (a writable descriptor excludes every other; read-only
    /// ones share), or named twice by one writable descriptor.
    #[error("block {id} is in use by another descriptor of this pool (or named twice): drop that descriptor or its operation first")]
    Busy {
        /// The block.
        id: u32,
    },
    /// A writable view of a read-only pool.
    #[error("the pool is read-only: ask for shared (read-only) blocks")]
    ReadOnly,
    /// The memory of [`Pool::allocate`] could not be had.
    #[error("could not allocate the pool: {0}")]
    Alloc(String),
    /// Host access ([`Pool::with_block`]) to a pool that is not in host
    /// memory: device memory is never read or written on the host.
    #[error("the pool is on {0}, not in host memory: its blocks cannot be read or written here")]
    NotHostMemory(Device),
}

/// A registered region of memory cut into blocks of one size: a KV cache
/// (vLLM: one pool per layer, `[num_blocks, block_bytes]`), from which
/// operations take blocks by id at no cost per block beyond eight bytes.
///
/// A descriptor over blocks of a pool ([`blocks`](Self::blocks),
/// [`shared_blocks`](Self::shared_blocks), [`blocks_with`](Self::blocks_with))
/// moves like any other in every operation; the remote sees it as that
/// many descriptors of the block size (metadata lists them as one entry
/// with a count). Source and destination block lists may differ; their
/// sizes must match block for block. Blocks that follow each other in
/// memory on both sides move as one copy.
///
/// A pool hands out each block to one writable descriptor at a time, or to
/// any number of read-only ones, until that descriptor is dropped (or
/// given back by its operation's `into_descriptors` and dropped), so that
/// operations in flight on one pool never touch the same bytes in
/// conflicting ways.
///
/// ```
/// use ferry::{Descriptor, Pool};
/// let pool = Pool::from_vec(vec![0u8; 16 * 4096], 4096)?;
/// assert_eq!(pool.block_count(), 16);
/// let d: Descriptor = pool.blocks(&[3, 1, 7])?;
/// assert_eq!((d.size(), d.block_count()), (3 * 4096, 3));
/// assert!(pool.blocks(&[7]).is_err(), "block 7 is taken");
/// drop(d);
/// assert!(pool.blocks(&[7]).is_ok());
/// # Ok::<(), ferry::PoolError>(())
/// ```
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

pub(crate) struct PoolInner {
    ptr: NonNull<u8>,
    size: usize,
    block: usize,
    device: Device,
    writable: bool,
    /// Per block: 0 free, n > 0 shared by n read-only descriptors,
    /// -1 taken by a writable one.
    taken: Mutex<Vec<i32>>,
    /// What backends registered for the whole pool (UCX), released when
    /// the pool is dropped, before its memory is.
    regs: Arc<RegCache>,
    _owner: Box<dyn Any + Send>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Before the fields drop: `_owner` frees the memory after this.
        self.regs.release();
    }
}

// SAFETY: the pool is a pointer plus what keeps the memory alive (`Send`,
// checked by the box's type). Its memory is only touched through the
// descriptors it hands out, which the `taken` table keeps from conflicting;
// the table itself is behind a mutex.
unsafe impl Send for PoolInner {}
// SAFETY: see `Send`; `&PoolInner` gives access to nothing but the table.
unsafe impl Sync for PoolInner {}

/// Blocks of a pool taken by one descriptor: given back when the
/// descriptor's storage is dropped (which the operation delays while a
/// peer may still read the memory).
pub(crate) struct Taken {
    pool: Arc<PoolInner>,
    ids: Arc<[u32]>,
    shared: bool,
}

impl Drop for Taken {
    fn drop(&mut self) {
        undo(&mut self.pool.table(), &self.ids, self.shared);
    }
}

impl PoolInner {
    fn table(&self) -> std::sync::MutexGuard<'_, Vec<i32>> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Which part of each block a paged descriptor covers, and how it holds
/// the blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockView {
    /// Bytes to skip at the start of each block (a slice of heads of a
    /// KV block, for tensor parallelism that differs between the sides).
    pub offset: usize,
    /// Bytes taken from each block; `None`: to the end of the block.
    pub len: Option<usize>,
    /// Read-only and shared with other read-only descriptors (a source),
    /// rather than writable and exclusive.
    pub shared: bool,
}

impl Pool {
    /// A pool that owns `memory`, cut into blocks of `block` bytes (a last
    /// partial block is not addressable).
    pub fn from_vec(mut memory: Vec<u8>, block: usize) -> Result<Pool, PoolError> {
        let (ptr, size) = (memory.as_mut_ptr(), memory.len());
        // SAFETY: the vector's buffer is valid for reads and writes of `size`
        // bytes for as long as the vector lives (moving the vector does not
        // move its buffer), and the pool owns it and touches it only through
        // its descriptors.
        unsafe { Self::from_raw_parts(ptr, size, block, Device::CPU, true, memory) }
    }

    /// A pool over memory given by address (a tensor's storage), kept alive
    /// by `owner`.
    ///
    /// # Safety
    ///
    /// While `owner` lives, `ptr` must be valid for reads of `size` bytes
    /// (and for writes if `writable`) on `device`, all of them within one
    /// allocation (one mapping, one tensor's storage: not two neighbouring
    /// ones described as one, since blocks that follow each other may be
    /// copied as one slice); and while any descriptor
    /// of this pool, or an operation it was given to, exists, nothing but
    /// Ferry may write to the blocks it covers, nor read them if it is
    /// writable. The memory is freed only with `owner`, which the pool and
    /// its descriptors hold.
    ///
    /// A pool of device memory (`cuda:N`) is never read or written on the
    /// host: [`with_block`](Self::with_block) refuses it, and its
    /// descriptors are device descriptors, which operations refuse in this
    /// version (see [`Descriptor::from_cuda_ptr`]).
    pub unsafe fn from_raw_parts<T: Any + Send>(
        ptr: *mut u8,
        size: usize,
        block: usize,
        device: Device,
        writable: bool,
        owner: T,
    ) -> Result<Pool, PoolError> {
        if block == 0 || block > size {
            return Err(PoolError::BadBlockSize { block, size });
        }
        let blocks = size / block;
        Ok(Pool {
            inner: Arc::new(PoolInner {
                ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
                size,
                block,
                device,
                writable,
                taken: Mutex::new(vec![0; blocks]),
                regs: RegCache::new(ptr as usize as u64, size as u64),
                _owner: Box::new(owner),
            }),
        })
    }

    /// A pool of `size` bytes of fresh zeroed host memory, allocated as
    /// NumPy allocates large arrays on Linux: page-aligned, with the kernel
    /// asked for transparent huge pages (`madvise(MADV_HUGEPAGE)`), which
    /// halves the cost of cross-memory attach per byte. Memory that
    /// frameworks hand you (a torch or NumPy KV cache) is better wrapped
    /// with [`from_raw_parts`](Self::from_raw_parts).
    pub fn allocate(size: usize, block: usize) -> Result<Pool, PoolError> {
        if block == 0 || block > size {
            return Err(PoolError::BadBlockSize { block, size });
        }
        let m = crate::hugemem::Mapping::new(size).map_err(|e| PoolError::Alloc(e.to_string()))?;
        let ptr = m.ptr();
        // SAFETY: the mapping is valid for reads and writes of `size` bytes
        // until it is dropped, which only the pool (its owner) does, and
        // nothing else knows its address.
        unsafe { Self::from_raw_parts(ptr, size, block, Device::CPU, true, m) }
    }

    /// Runs `f` on the bytes of block `id`, taken as a shared (read-only)
    /// descriptor would take it: refused while a writable descriptor holds
    /// it.
    ///
    /// [`PoolError::NotHostMemory`] for a pool of device memory.
    pub fn with_block<R>(&self, id: u32, f: impl FnOnce(&[u8]) -> R) -> Result<R, PoolError> {
        self.check_host()?;
        let d = self.shared_blocks(&[id])?;
        let (ptr, len) = d.block_ptr(0);
        // SAFETY: `d` holds block `id` shared until it is dropped after `f`:
        // no writer touches it meanwhile, and the pool keeps the memory
        // valid; the range lies within the pool (checked by `blocks_with`).
        Ok(f(unsafe { std::slice::from_raw_parts(ptr, len) }))
    }

    /// Runs `f` on the bytes of block `id`, mutably, taken as a writable
    /// descriptor would take it: refused while any descriptor holds it.
    ///
    /// [`PoolError::NotHostMemory`] for a pool of device memory.
    pub fn with_block_mut<R>(
        &self,
        id: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, PoolError> {
        self.check_host()?;
        let d = self.blocks(&[id])?;
        let (ptr, len) = d.block_ptr(0);
        // SAFETY: `d` holds block `id` exclusively until it is dropped after
        // `f`, so this is the only access; the pool is writable (checked by
        // `blocks`) and keeps the memory valid.
        Ok(f(unsafe { std::slice::from_raw_parts_mut(ptr, len) }))
    }

    /// Refuses host access to device memory.
    fn check_host(&self) -> Result<(), PoolError> {
        if self.inner.device.is_cpu() {
            Ok(())
        } else {
            Err(PoolError::NotHostMemory(self.inner.device))
        }
    }

    /// The pool's size in bytes.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        self.inner.block
    }

    /// How many blocks the pool has.
    pub fn block_count(&self) -> usize {
        self.inner.size / self.inner.block
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// The address of block 0 (for a grant, which hands it to its holder).
    pub(crate) fn base(&self) -> *mut u8 {
        self.inner.ptr.as_ptr()
    }

    /// Whether the pool's memory may be written.
    pub(crate) fn is_writable(&self) -> bool {
        self.inner.writable
    }

    /// A writable descriptor over blocks `ids`, in that order, each taken
    /// exclusively until the descriptor is dropped.
    pub fn blocks(&self, ids: &[u32]) -> Result<Descriptor<'static>, PoolError> {
        self.blocks_with(ids, BlockView::default())
    }

    /// A read-only descriptor over blocks `ids` (the source of a WRITE or
    /// the memory of a READABLE), shared with other read-only descriptors.
    pub fn shared_blocks(&self, ids: &[u32]) -> Result<Descriptor<'static>, PoolError> {
        self.blocks_with(
            ids,
            BlockView {
                shared: true,
                ..BlockView::default()
            },
        )
    }

    /// A descriptor over part of each of blocks `ids` (see [`BlockView`]).
    pub fn blocks_with(
        &self,
        ids: &[u32],
        view: BlockView,
    ) -> Result<Descriptor<'static>, PoolError> {
        let len = self.check_view(ids, view)?;
        let p = &self.inner;
        let count = self.block_count();
        {
            let mut t = p.table();
            for (index, &id) in ids.iter().enumerate() {
                let ok = match t.get(id as usize) {
                    None => {
                        undo(&mut t, &ids[..index], view.shared);
                        return Err(PoolError::OutOfRange {
                            index,
                            id,
                            last: count as u64 - 1,
                        });
                    }
                    Some(&v) => {
                        if view.shared {
                            (0..i32::MAX).contains(&v)
                        } else {
                            v == 0
                        }
                    }
                };
                if !ok {
                    undo(&mut t, &ids[..index], view.shared);
                    return Err(PoolError::Busy { id });
                }
                let v = &mut t[id as usize];
                *v = if view.shared { *v + 1 } else { -1 };
            }
        }
        let ids: Arc<[u32]> = ids.into();
        let taken = Taken {
            pool: p.clone(),
            ids: ids.clone(),
            shared: view.shared,
        };
        Ok(self.paged(ids, view, len, Box::new(taken)))
    }

    /// [`blocks_with`](Self::blocks_with) without this pool's record of
    /// which descriptors hold which blocks: for a caller that keeps its own
    /// (the Python binding's `ferry.Pool` frees an operation's blocks when
    /// the operation ends, not when its descriptor is dropped). The same
    /// checks otherwise, and a writable view that names a block twice is
    /// still refused ([`PoolError::Busy`]). Costs nothing per block
    /// beyond the checks: one pool serves every operation, with its
    /// registrations (UCX) made once.
    ///
    /// # Safety
    ///
    /// What the pool's own record enforces for
    /// [`blocks_with`](Self::blocks_with), the caller enforces: while the
    /// returned descriptor is in use (until it is dropped or the operation
    /// it was given to has ended: an ended operation no longer touches its
    /// memory), no other descriptor of this pool in use may write a block
    /// it names, and if `view` is writable, none in use may name one of its
    /// blocks at all.
    pub unsafe fn blocks_unclaimed(
        &self,
        ids: &[u32],
        view: BlockView,
    ) -> Result<Descriptor<'static>, PoolError> {
        let len = self.check_view(ids, view)?;
        let count = self.block_count();
        if let Some((index, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= count) {
            return Err(PoolError::OutOfRange {
                index,
                id,
                last: count as u64 - 1,
            });
        }
        if !view.shared {
            // Two segments over one block of a destination would be two
            // writers of the same bytes in one copy.
            let mut seen = vec![0u64; count.div_ceil(64)];
            for &id in ids {
                let (w, b) = (id as usize / 64, 1u64 << (id % 64));
                if seen[w] & b != 0 {
                    return Err(PoolError::Busy { id });
                }
                seen[w] |= b;
            }
        }
        let keep = self.inner.clone();
        Ok(self.paged(ids.into(), view, len, Box::new(keep)))
    }

    /// Checks a view of blocks `ids` before any is taken: its length per
    /// block.
    fn check_view(&self, ids: &[u32], view: BlockView) -> Result<usize, PoolError> {
        let p = &self.inner;
        if ids.is_empty() || ids.len() > MAX_DESCRIPTORS {
            return Err(PoolError::BadCount(ids.len()));
        }
        if !view.shared && !p.writable {
            return Err(PoolError::ReadOnly);
        }
        let len = view.len.unwrap_or(p.block.saturating_sub(view.offset));
        if view
            .offset
            .checked_add(len)
            .map_or(true, |end| end > p.block)
        {
            return Err(PoolError::BadSlice {
                offset: view.offset,
                len,
                block: p.block,
            });
        }
        if ids.len().checked_mul(len).is_none() {
            return Err(PoolError::BadCount(ids.len()));
        }
        Ok(len)
    }

    /// The descriptor of blocks `ids` (checked), keeping `keep` (what
    /// holds the blocks, and the pool's memory) until it is dropped.
    fn paged(
        &self,
        ids: Arc<[u32]>,
        view: BlockView,
        len: usize,
        keep: Box<dyn Any + Send>,
    ) -> Descriptor<'static> {
        let p = &self.inner;
        let blocks = Blocks {
            stride: p.block,
            offset: view.offset,
            len,
            ids,
            regs: p.regs.clone(),
        };
        Descriptor::paged(p.ptr, p.device, !view.shared, blocks, keep)
    }
}

/// Gives back blocks `ids` (a refused request's so far, or a dropped
/// descriptor's).
fn undo(t: &mut [i32], ids: &[u32], shared: bool) {
    for &id in ids {
        let v = &mut t[id as usize];
        *v = if shared { *v - 1 } else { 0 };
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("device", &self.inner.device)
            .field("size", &self.inner.size)
            .field("block_size", &self.inner.block)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unclaimed_blocks_keep_the_checks_and_the_registrations() {
        let pool = Pool::allocate(8 * 4096, 4096).unwrap();
        let view = BlockView::default();
        let shared = BlockView {
            shared: true,
            ..view
        };
        // SAFETY (each call below): no descriptor of the pool is given to an
        // operation, and none is read or written: only inspected.
        let a = unsafe { pool.blocks_unclaimed(&[3, 1], view) }.unwrap();
        assert_eq!((a.size(), a.block_count()), (8192, 2));
        assert!(
            pool.blocks(&[3]).is_ok(),
            "the pool's own record is not taken"
        );
        let b = unsafe { pool.blocks_unclaimed(&[0, 0], shared) }.unwrap();
        assert!(
            Arc::ptr_eq(a.reg_cache().unwrap(), b.reg_cache().unwrap()),
            "one pool, one registration cache"
        );
        assert_eq!(
            unsafe { pool.blocks_unclaimed(&[2, 5, 2], view) }.err(),
            Some(PoolError::Busy { id: 2 }),
            "a block twice in one destination"
        );
        assert_eq!(
            unsafe { pool.blocks_unclaimed(&[1, 8], shared) }.err(),
            Some(PoolError::OutOfRange {
                index: 1,
                id: 8,
                last: 7
            })
        );
        assert_eq!(
            unsafe { pool.blocks_unclaimed(&[], shared) }.err(),
            Some(PoolError::BadCount(0))
        );
        let slice = BlockView {
            offset: 4000,
            len: Some(200),
            ..view
        };
        assert!(matches!(
            unsafe { pool.blocks_unclaimed(&[1], slice) },
            Err(PoolError::BadSlice { .. })
        ));
        // The descriptors keep the memory (and its registrations) alive.
        drop(pool);
        assert_eq!(a.block_count(), 2);
    }

    #[test]
    fn allocated_pools_are_zeroed_and_blocks_are_readable() {
        let pool = Pool::allocate(4 << 20, 1 << 20).unwrap();
        assert_eq!(pool.block_count(), 4);
        pool.with_block_mut(2, |b| b.fill(7)).unwrap();
        assert_eq!(pool.with_block(2, |b| b.iter().all(|&x| x == 7)), Ok(true));
        assert_eq!(pool.with_block(1, |b| b.iter().all(|&x| x == 0)), Ok(true));
        let held = pool.blocks(&[1]).unwrap();
        assert_eq!(pool.with_block(1, |_| ()), Err(PoolError::Busy { id: 1 }));
        drop(held);
        assert!(pool.with_block(4, |_| ()).is_err());
    }

    #[test]
    fn device_pools_are_never_read_on_the_host() {
        let cuda = Device::cuda(1);
        // SAFETY: the address is never dereferenced: host access to a
        // device pool is refused, and its descriptors are only inspected.
        let pool = unsafe {
            Pool::from_raw_parts(0x7f00_0000_0000 as *mut u8, 4096, 1024, cuda, true, ())
        }
        .unwrap();
        assert_eq!(pool.device(), cuda);
        let refused = PoolError::NotHostMemory(cuda);
        assert_eq!(pool.with_block(0, |_| ()), Err(refused.clone()));
        assert_eq!(pool.with_block_mut(0, |_| ()), Err(refused.clone()));
        assert!(refused.to_string().contains("cuda:1"));
        let mut d = pool.blocks(&[2, 0]).unwrap();
        assert_eq!((d.device(), d.size(), d.block_count()), (cuda, 2048, 2));
        assert!(d.as_slice().is_none() && d.as_mut_slice().is_none());
        assert!(
            d.device_ptr().is_none(),
            "a paged descriptor has no one address"
        );
    }

    #[test]
    fn blocks_are_taken_and_given_back() {
        let pool = Pool::from_vec((0..64u8).collect(), 16).unwrap();
        assert_eq!(pool.block_count(), 4);
        let a = pool.blocks(&[2, 0]).unwrap();
        assert_eq!(a.size(), 32);
        assert_eq!(pool.blocks(&[1, 2]).unwrap_err(), PoolError::Busy { id: 2 });
        // The refused request gave block 1 back.
        let b = pool.blocks(&[1]).unwrap();
        assert_eq!(
            pool.shared_blocks(&[0]).unwrap_err(),
            PoolError::Busy { id: 0 }
        );
        drop(a);
        let s1 = pool.shared_blocks(&[0, 2, 2]).unwrap();
        let s2 = pool.shared_blocks(&[2]).unwrap();
        assert_eq!(pool.blocks(&[2]).unwrap_err(), PoolError::Busy { id: 2 });
        drop((s1, s2, b));
        assert!(pool.blocks(&[0, 1, 2, 3]).is_ok());
        assert_eq!(pool.blocks(&[3, 3]).unwrap_err(), PoolError::Busy { id: 3 });
    }

    #[test]
    fn bad_requests_are_refused() {
        let pool = Pool::from_vec(vec![0; 100], 16).unwrap();
        assert_eq!(pool.block_count(), 6);
        assert!(matches!(
            pool.blocks(&[0, 6]),
            Err(PoolError::OutOfRange {
                index: 1,
                id: 6,
                last: 5
            })
        ));
        assert!(
            pool.blocks(&[0]).is_ok(),
            "the refused request gave block 0 back"
        );
        assert_eq!(pool.blocks(&[]).unwrap_err(), PoolError::BadCount(0));
        let view = |offset, len| BlockView {
            offset,
            len,
            shared: true,
        };
        assert!(matches!(
            pool.blocks_with(&[1], view(8, Some(9))),
            Err(PoolError::BadSlice { .. })
        ));
        assert!(matches!(
            pool.blocks_with(&[1], view(usize::MAX, Some(2))),
            Err(PoolError::BadSlice { .. })
        ));
        assert!(matches!(
            pool.blocks_with(&[1], view(17, None)),
            Err(PoolError::BadSlice { .. })
        ));
        let d = pool.blocks_with(&[1, 3], view(4, Some(8))).unwrap();
        assert_eq!((d.size(), d.block_count(), d.is_writable()), (16, 2, false));
        assert!(matches!(
            Pool::from_vec(vec![0; 8], 9),
            Err(PoolError::BadBlockSize { .. })
        ));
        assert!(matches!(
            Pool::from_vec(vec![0; 8], 0),
            Err(PoolError::BadBlockSize { .. })
        ));
    }
}
