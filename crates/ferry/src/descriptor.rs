use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use bytes::{Bytes, BytesMut};
use ferry_proto::Device;

/// One contiguous buffer that an operation moves data from or into.
///
/// Build it from memory the descriptor owns (`Vec<u8>`, `Box<[u8]>`,
/// `BytesMut`, `Bytes`) — then it is `Descriptor<'static>` and works with every
/// operation — or from a borrowed slice, which ties it to the slice's lifetime
/// and is accepted by [`Scope`](crate::Scope) operations. Raw memory goes
/// through the `unsafe` [`from_raw_parts`](Self::from_raw_parts).
///
/// An operation owns its descriptors until it ends; take them back with the
/// operation's `into_descriptors`.
///
/// ```
/// use ferry::{Descriptor, Device};
/// let d = Descriptor::from_vec(vec![0u8; 4096]);
/// assert_eq!(d.size(), 4096);
/// assert_eq!(d.device(), Device::CPU);
/// assert!(d.is_writable());
/// let back: Vec<u8> = d.into_vec().unwrap();
/// assert_eq!(back.len(), 4096);
/// ```
pub struct Descriptor<'a> {
    ptr: NonNull<u8>,
    len: usize,
    device: Device,
    writable: bool,
    owner: Option<Box<dyn Any + Send>>,
    /// Blocks of a [`Pool`](crate::Pool) (then `ptr` is the pool's start
    /// and `len` the bytes of all blocks).
    blocks: Option<Blocks>,
    _borrow: PhantomData<&'a mut [u8]>,
}

/// Which bytes of a pool a paged descriptor covers: `len` bytes at
/// `id * stride + offset` for each id, in order.
#[derive(Clone)]
pub(crate) struct Blocks {
    pub(crate) stride: usize,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) ids: std::sync::Arc<[u32]>,
    /// The pool's registrations (see `regcache.rs`).
    pub(crate) regs: std::sync::Arc<crate::regcache::RegCache>,
}

// SAFETY: a descriptor is a pointer plus the thing that keeps the memory
// alive. Owned storage is `Send` (checked by the `Box<dyn Any + Send>`);
// borrowed storage is a `&mut [u8]` or `&[u8]`, both `Send`; raw memory is the
// caller's promise in `from_raw_parts`. Moving a descriptor to another thread
// therefore moves only what may be moved.
unsafe impl Send for Descriptor<'_> {}
// SAFETY: through `&Descriptor` only `&[u8]` can be obtained (never `&mut`),
// and `[u8]` is `Sync`.
unsafe impl Sync for Descriptor<'_> {}

impl Descriptor<'static> {
    fn owned<T: Any + Send>(
        mut owner: T,
        get: impl FnOnce(&mut T) -> (*mut u8, usize),
        writable: bool,
    ) -> Self {
        let (ptr, len) = get(&mut owner);
        Descriptor {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            device: Device::CPU,
            writable,
            owner: Some(Box::new(owner)),
            blocks: None,
            _borrow: PhantomData,
        }
    }

    /// Blocks of a pool starting at `base` (see `Pool::blocks_with`, which
    /// checked every block against the pool and took it for this
    /// descriptor, until `taken` is dropped).
    pub(crate) fn paged(
        base: NonNull<u8>,
        device: Device,
        writable: bool,
        blocks: Blocks,
        taken: Box<dyn Any + Send>,
    ) -> Self {
        Descriptor {
            ptr: base,
            len: blocks.ids.len() * blocks.len,
            device,
            writable,
            owner: Some(taken),
            blocks: Some(blocks),
            _borrow: PhantomData,
        }
    }

    /// Owns a vector; its bytes may be read and written by operations.
    pub fn from_vec(v: Vec<u8>) -> Self {
        // The heap buffer of a Vec does not move when the Vec is moved.
        Self::owned(v, |v| (v.as_mut_ptr(), v.len()), true)
    }

    /// `size` bytes of fresh zeroed host memory that it owns, allocated as
    /// NumPy allocates large arrays on Linux: an anonymous mapping,
    /// page-aligned, with the kernel asked for transparent huge pages
    /// (`madvise(MADV_HUGEPAGE)`), which roughly halves the cost per byte
    /// of a cross-memory copy from or into it (elsewhere: a zeroed heap
    /// buffer). Writable; [`as_mut_slice`](Self::as_mut_slice) fills it.
    ///
    /// ```
    /// let mut d = ferry::Descriptor::allocate(1 << 20)?;
    /// d.as_mut_slice().unwrap().fill(7);
    /// assert_eq!((d.size(), d.as_slice().unwrap()[0]), (1 << 20, 7));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn allocate(size: usize) -> std::io::Result<Self> {
        let m = crate::hugemem::Mapping::new(size)?;
        Ok(Self::owned(m, |m| (m.ptr(), size), true))
    }

    /// Owns a boxed slice.
    pub fn from_boxed_slice(b: Box<[u8]>) -> Self {
        // Stored as a Vec: moving a Box would re-assert its uniqueness and
        // invalidate the pointer taken from it; a Vec's buffer is not
        // affected by moving the Vec.
        Self::from_vec(b.into_vec())
    }

    /// Owns a `BytesMut`.
    pub fn from_bytes_mut(b: BytesMut) -> Self {
        Self::owned(b, |b| (b.as_mut_ptr(), b.len()), true)
    }

    /// Owns a `Bytes`. It is read-only: usable as the source of a write or
    /// the memory of a readable, never as a destination.
    pub fn from_bytes(b: Bytes) -> Self {
        Self::owned(b, |b| (b.as_ptr() as *mut u8, b.len()), false)
    }

    /// Describes memory by address (for device memory,
    /// [`from_cuda_ptr`](Self::from_cuda_ptr) says what it needs).
    ///
    /// # Safety
    ///
    /// For as long as this descriptor, or any operation it is given to,
    /// exists: `ptr` must be valid for reads of `size` bytes (and for writes
    /// if `writable`), on `device`; nothing else may write to that memory,
    /// nor (if `writable`) read it; and the memory must not be freed. An
    /// operation stops touching the memory when it is dropped or its
    /// `into_descriptors` returns (both wait, if need be, for a copy into
    /// the memory that a same-host peer stalled) — with one exception that concerns
    /// confidentiality, not soundness: as the *source* of a cross-memory
    /// attach transfer cancelled half-way, the peer process may still read
    /// (never write) the memory until it has seen the cancel (see
    /// `docs/transports.md`). Keep such memory alive and unchanged a moment
    /// longer if that matters; owned descriptors are kept alive for you.
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        size: usize,
        device: Device,
        writable: bool,
    ) -> Self {
        Descriptor {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len: size,
            device,
            writable,
            owner: None,
            blocks: None,
            _borrow: PhantomData,
        }
    }
}

impl Descriptor<'static> {
    /// Describes `size` bytes of memory on the GPU `cuda:ordinal`, by its
    /// device address (a `CUdeviceptr`: what `cudaMalloc`, `cuMemAlloc`,
    /// `torch.Tensor.data_ptr()` of a CUDA tensor or a CuPy array's
    /// `data.ptr` give).
    ///
    /// Ferry never dereferences device memory on the host:
    /// [`as_slice`](Self::as_slice) and [`as_mut_slice`](Self::as_mut_slice)
    /// are `None` for it, and pools and regions of host memory never take
    /// it: it moves by CUDA IPC or through the driver's copies to and from
    /// host memory. Without CUDA on this host, creating an operation over
    /// this descriptor is refused with
    /// [`Error::CudaUnavailable`](crate::Error::CudaUnavailable); mixed
    /// with host memory in one operation, with
    /// [`Error::NoDeviceTransport`](crate::Error::NoDeviceTransport); see
    /// `docs/gpu.md`. An owned buffer to test with is
    /// [`cuda::CudaBuffer`](crate::cuda::CudaBuffer).
    ///
    /// ```
    /// use ferry::{Descriptor, Device};
    /// // SAFETY: the address is never used: the descriptor is only inspected.
    /// let d = unsafe { Descriptor::from_cuda_ptr(0x7f00_0000_0000, 4096, 1, true) };
    /// assert_eq!(d.device(), Device::cuda(1));
    /// assert_eq!(d.device_ptr(), Some(0x7f00_0000_0000));
    /// assert!(d.as_slice().is_none());
    /// ```
    ///
    /// # Safety
    ///
    /// For as long as this descriptor, or any operation it is given to,
    /// exists: `ptr` must be the address of at least `size` bytes of one
    /// live device allocation (or a part of one) of the GPU `cuda:ordinal`
    /// — not host memory, not memory of another device — valid for reads
    /// (and for writes if `writable`); nothing else may write that memory
    /// (nor, if `writable`, read it) while an operation uses it: no kernel
    /// and no copy on any stream; and it must not be freed. The same
    /// promises as [`from_raw_parts`](Self::from_raw_parts), for device
    /// memory.
    pub unsafe fn from_cuda_ptr(ptr: u64, size: usize, ordinal: u32, writable: bool) -> Self {
        Self::on_device(ptr, size, Device::cuda(ordinal), writable, None)
    }

    /// A device descriptor that `owner` (e.g. a `DeviceBuffer`) keeps
    /// valid: the `owner` is given back by
    /// [`into_owner`](Self::into_owner).
    pub(crate) fn on_device(
        ptr: u64,
        size: usize,
        device: Device,
        writable: bool,
        owner: Option<Box<dyn Any + Send>>,
    ) -> Self {
        debug_assert!(!device.is_cpu());
        Descriptor {
            // The device address, kept in the pointer field and never
            // dereferenced (every host access checks `device` first). CUDA
            // exists only for 64-bit hosts, where the cast is lossless.
            ptr: NonNull::new(ptr as usize as *mut u8).unwrap_or(NonNull::dangling()),
            len: size,
            device,
            writable,
            owner,
            blocks: None,
            _borrow: PhantomData,
        }
    }

    /// Like [`from_raw_parts`](Self::from_raw_parts), with an `owner` that
    /// keeps the memory valid: Ferry holds it until it no longer touches the
    /// memory, which, after a copy into it that a same-host peer stalled,
    /// may be after the operation was dropped (dropping the operation then
    /// never waits for that copy, as it must for memory without an owner).
    /// Bindings whose memory belongs to a garbage-collected object pass that
    /// object here.
    ///
    /// # Safety
    ///
    /// As for [`from_raw_parts`](Self::from_raw_parts), with "must not be
    /// freed" meaning: not while `owner` lives.
    pub unsafe fn from_raw_parts_with_owner<T: Any + Send>(
        ptr: *mut u8,
        size: usize,
        device: Device,
        writable: bool,
        owner: T,
    ) -> Self {
        // SAFETY: the caller's promise, as documented above.
        let mut d = unsafe { Self::from_raw_parts(ptr, size, device, writable) };
        d.owner = Some(Box::new(owner));
        d
    }
}

impl<'a> Descriptor<'a> {
    /// Borrows a mutable slice for `'a`; usable as source or destination.
    pub fn from_mut_slice(s: &'a mut [u8]) -> Self {
        Descriptor {
            ptr: NonNull::new(s.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len: s.len(),
            device: Device::CPU,
            writable: true,
            owner: None,
            blocks: None,
            _borrow: PhantomData,
        }
    }

    /// Borrows a shared slice for `'a`; usable only as a source.
    pub fn from_slice(s: &'a [u8]) -> Self {
        Descriptor {
            ptr: NonNull::new(s.as_ptr() as *mut u8).unwrap_or(NonNull::dangling()),
            len: s.len(),
            device: Device::CPU,
            writable: false,
            owner: None,
            blocks: None,
            _borrow: PhantomData,
        }
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Its length in bytes (for a paged descriptor: of all its blocks).
    pub fn size(&self) -> usize {
        self.len
    }

    /// How many descriptors the remote sees this one as: the blocks of a
    /// paged descriptor (see [`Pool`](crate::Pool)), else 1.
    pub fn block_count(&self) -> usize {
        self.blocks.as_ref().map_or(1, |b| b.ids.len())
    }

    /// Whether it names blocks of a [`Pool`](crate::Pool).
    pub fn is_paged(&self) -> bool {
        self.blocks.is_some()
    }

    /// Whether bytes may be written into it.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The device address of device memory (`cuda:N`); `None` for host
    /// memory (whose bytes are [`as_slice`](Self::as_slice)) and for a
    /// paged descriptor.
    pub fn device_ptr(&self) -> Option<u64> {
        if self.device.is_cpu() || self.blocks.is_some() {
            return None;
        }
        if self.ptr == NonNull::dangling() {
            // What a null address became (no device allocation is at 1).
            return Some(0);
        }
        Some(self.ptr.as_ptr() as usize as u64)
    }

    /// The bytes, for host memory; `None` for device memory and for a
    /// paged descriptor (its blocks are not contiguous).
    pub fn as_slice(&self) -> Option<&[u8]> {
        if !self.device.is_cpu() || self.blocks.is_some() {
            return None;
        }
        // SAFETY: host memory valid for `len` bytes for as long as `self`
        // (owned: kept by `owner`; borrowed: by `'a`; raw: the caller's
        // promise). While an operation holds the descriptor no `&self` is
        // handed out, so the transport is not writing concurrently.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes, mutably, for writable host memory.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if !self.device.is_cpu() || !self.writable || self.blocks.is_some() {
            return None;
        }
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access;
        // the memory is writable (checked above).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Gives back the owned storage if it is a `T` (e.g. `Vec<u8>`).
    pub fn into_owner<T: Any>(mut self) -> Result<T, Self> {
        match self.owner.take() {
            Some(b) if b.is::<T>() => Ok(*b.downcast::<T>().expect("type checked")),
            other => {
                self.owner = other;
                Err(self)
            }
        }
    }

    /// Gives back the vector this descriptor was built from.
    pub fn into_vec(self) -> Result<Vec<u8>, Self> {
        self.into_owner::<Vec<u8>>()
    }

    /// Takes the storage that keeps the memory alive (owned descriptors
    /// only), for a descriptor about to be dropped whose memory a peer may
    /// still read (see `Region::keep_while_used`).
    pub(crate) fn take_owner(&mut self) -> Option<Box<dyn Any + Send>> {
        self.owner.take()
    }

    /// `(pointer, length)` of block `i` of a paged descriptor (the whole
    /// memory of a plain one).
    pub(crate) fn block_ptr(&self, i: usize) -> (*mut u8, usize) {
        match &self.blocks {
            None => (self.ptr.as_ptr(), self.len),
            Some(b) => {
                // In bounds: `Pool::blocks_with` checked that every block
                // id, and `offset + len` within a block, lie in the pool.
                let at = b.ids[i] as usize * b.stride + b.offset;
                (self.ptr.as_ptr().wrapping_add(at), b.len)
            }
        }
    }

    /// The registrations of the pool this descriptor's blocks belong to.
    pub(crate) fn reg_cache(&self) -> Option<&std::sync::Arc<crate::regcache::RegCache>> {
        self.blocks.as_ref().map(|b| &b.regs)
    }

    /// `(pointer, length)` of each block (one for a plain descriptor).
    pub(crate) fn raw_segments(&self, out: &mut Vec<(*mut u8, usize)>) {
        out.extend((0..self.block_count()).map(|i| self.block_ptr(i)));
    }
}

impl From<Vec<u8>> for Descriptor<'static> {
    fn from(v: Vec<u8>) -> Self {
        Descriptor::from_vec(v)
    }
}

impl From<BytesMut> for Descriptor<'static> {
    fn from(b: BytesMut) -> Self {
        Descriptor::from_bytes_mut(b)
    }
}

impl From<Bytes> for Descriptor<'static> {
    fn from(b: Bytes) -> Self {
        Descriptor::from_bytes(b)
    }
}

impl<'a> From<&'a mut [u8]> for Descriptor<'a> {
    fn from(s: &'a mut [u8]) -> Self {
        Descriptor::from_mut_slice(s)
    }
}

impl fmt::Debug for Descriptor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("device", &self.device)
            .field("size", &self.len)
            .field("writable", &self.writable)
            .field("blocks", &self.block_count())
            .finish()
    }
}
