//! Registered pools and paged descriptors: `ferry.Pool` and the blocks it
//! hands out (`ferry.PagedDescriptor`), with no Python object per block.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry::{BlockView, Device, PoolError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::claims::{Claim, Range, Table};
use crate::errors::{named_error, pool_error_to_py};

/// Numbers pools, so that claims (`claims.rs`) can tell the descriptors of
/// one pool (whose blocks the pool itself keeps apart) from other memory.
static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// A registered region of memory cut into blocks of one size.
///
/// Each operation takes its blocks from the pool's [`Table`] when it is
/// created, and they are free again as soon as it has ended (or is
/// dropped), as Ferry's claims on other memory lapse: not when its Python
/// object goes, which may be much later. The Rust descriptor of an
/// operation comes from a `ferry::Pool` of its own over the same memory,
/// which only builds it.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct Pool {
    pub(crate) id: u64,
    pub(crate) ptr: usize,
    size: usize,
    block: usize,
    device: Device,
    writable: bool,
    /// The one Rust pool over this memory that builds every operation's
    /// descriptor (its registrations are made once); it holds what keeps
    /// the memory alive (the `owner` given to `new`).
    inner: ferry::Pool,
    table: Arc<Table>,
}

/// Blocks of a pool, by id, and the part of each block taken: what an
/// operation takes from the pool when it is created.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct Blocks {
    pub(crate) pool: Py<Pool>,
    pub(crate) ids: Arc<[u32]>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    writable: bool,
}

impl Blocks {
    /// The descriptor of these blocks for an operation that `writes` into
    /// them (blocks taken exclusively) or only reads them (shared), whose
    /// claim is `claim`: the blocks are held until it lapses.
    #[allow(unsafe_code)]
    pub(crate) fn take(
        &self,
        py: Python<'_>,
        writes: bool,
        claim: &mut Claim,
    ) -> PyResult<ferry::Descriptor<'static>> {
        if writes && !self.writable {
            return Err(PyValueError::new_err(
                "these blocks are read-only (shared_blocks, or a read-only pool), but the \
                 operation writes into them: use pool.blocks(ids)",
            ));
        }
        let p = self.pool.get();
        p.table.take(py, &self.ids, !writes, claim.owner())?;
        claim.hold(p.table.clone());
        let view = BlockView {
            offset: self.offset,
            len: Some(self.len),
            shared: !writes,
        };
        // SAFETY: `blocks_unclaimed` needs this pool's descriptors in use
        // never to conflict on a block. The pool's `Table` took these blocks
        // (shared, or exclusively for an operation that writes) for the
        // operation behind `claim`, and frees them only once that operation
        // has ended (its status is terminal, so it no longer touches its
        // memory) or was never made; every descriptor of this pool comes
        // from here, so every one in use holds its blocks in the table.
        unsafe { p.inner.blocks_unclaimed(&self.ids, view) }.map_err(|e| pool_error_to_py(py, e))
    }

    /// `(pool number, start, end)` of the pool's memory, for claims.
    pub(crate) fn span(&self) -> (u64, usize, usize) {
        let p = self.pool.get();
        (p.id, p.ptr, p.ptr.saturating_add(p.size))
    }

    /// Whether the memory is host memory (the only kind that is claimed).
    pub(crate) fn is_host(&self) -> bool {
        self.pool.get().device == Device::CPU
    }
}

impl Pool {
    /// The Rust pool over this memory (a grant is made over it, and a
    /// grant's transfers copy from and into it).
    pub(crate) fn rust(&self) -> &ferry::Pool {
        &self.inner
    }

    /// Takes blocks `ids` for a grant's one-sided transfer that `writes`
    /// into them (exclusively) or only reads them (shared), as an
    /// operation takes its blocks (`Blocks::take`), until the returned
    /// claim is dropped: the transfer holds it until its copy is over.
    pub(crate) fn hold_blocks(&self, py: Python<'_>, ids: &[u32], writes: bool) -> PyResult<Claim> {
        self.hold_block_ids(py, &ids.into(), writes)
    }

    /// [`hold_blocks`](Self::hold_blocks), with the ids already shared
    /// (a prepared transfer holds the same blocks at every post).
    pub(crate) fn hold_block_ids(
        &self,
        py: Python<'_>,
        ids: &Arc<[u32]>,
        writes: bool,
    ) -> PyResult<Claim> {
        if writes && !self.writable {
            return Err(pool_error_to_py(py, PoolError::ReadOnly));
        }
        if ids.is_empty() {
            return Err(pool_error_to_py(py, PoolError::BadCount(0)));
        }
        let ranges = if self.device == Device::CPU {
            vec![Range {
                index: 0,
                start: self.ptr,
                end: self.ptr.saturating_add(self.size),
                pool: self.id,
            }]
        } else {
            Vec::new()
        };
        let mut claim = Claim::new(ranges, writes)?;
        self.table.take(py, ids, !writes, claim.owner())?;
        claim.hold(self.table.clone());
        Ok(claim)
    }
}

/// Block ids from `ids`: the native-endian `u32`s of a `bytes` (what
/// `numpy.ndarray.astype(uint32).tobytes()` gives: no Python object per
/// id), or a sequence of ints.
pub(crate) fn read_ids(ids: &Bound<'_, PyAny>, count: usize) -> PyResult<Vec<u32>> {
    let out: Vec<u32> = if let Ok(b) = ids.cast::<PyBytes>() {
        let b = b.as_bytes();
        if b.len() % 4 != 0 {
            let message = format!(
                "block ids as bytes must be 4-byte unsigned ints, not {} bytes",
                b.len()
            );
            return Err(named_error(ids.py(), "BlockIdTypeError", message));
        }
        b.chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else if ids.cast::<PyByteArray>().is_ok() || ids.is_instance_of::<pyo3::types::PyString>() {
        let message = "block ids must be ints (a sequence or a NumPy integer array), not a \
                       str or bytearray";
        return Err(named_error(ids.py(), "BlockIdTypeError", message.into()));
    } else {
        let wide: Vec<i64> = ids.extract().map_err(|_| {
            let message = format!(
                "block ids must be a sequence of ints or a NumPy integer array, not {}",
                ids.get_type().name().map_or("?".into(), |n| n.to_string())
            );
            named_error(ids.py(), "BlockIdTypeError", message)
        })?;
        let mut v = Vec::with_capacity(wide.len());
        for (index, id) in wide.into_iter().enumerate() {
            match u32::try_from(id) {
                Ok(id) => v.push(id),
                Err(_) => return Err(bad_id(ids.py(), index, id, count)),
            }
        }
        v
    };
    if let Some((index, &id)) = out.iter().enumerate().find(|(_, &id)| id as usize >= count) {
        return Err(bad_id(ids.py(), index, i64::from(id), count));
    }
    Ok(out)
}

/// The error for block id `id` (entry `index`) of a pool of `count` blocks.
fn bad_id(py: Python<'_>, index: usize, id: i64, count: usize) -> PyErr {
    if id < 0 || id > i64::from(u32::MAX) {
        let message = format!(
            "block id {id} (entry {index}) is out of range: the pool has blocks 0 to {}",
            count.saturating_sub(1)
        );
        return named_error(py, "BlockRangeError", message);
    }
    pool_error_to_py(
        py,
        PoolError::OutOfRange {
            index,
            id: id as u32,
            last: count.saturating_sub(1) as u64,
        },
    )
}

#[pymethods]
impl Pool {
    /// A pool over `size` bytes at `ptr` on `device`, cut into blocks of
    /// `block_size` bytes, kept alive by `owner` (see `ferry/_pool.py`).
    #[new]
    fn new(
        py: Python<'_>,
        ptr: usize,
        size: usize,
        block_size: usize,
        device: &str,
        writable: bool,
        owner: Py<PyAny>,
    ) -> PyResult<Self> {
        let device: Device = device
            .parse()
            .map_err(|e: ferry::ParseDeviceError| PyValueError::new_err(e.to_string()))?;
        if ptr == 0 && size > 0 {
            return Err(PyValueError::new_err("a pool's memory has a null pointer"));
        }
        if isize::try_from(size).is_err() || ptr.checked_add(size).is_none() {
            return Err(PyValueError::new_err(format!(
                "{size} bytes at {ptr:#x} wrap around the address space"
            )));
        }
        if block_size == 0 || block_size > size {
            let e = PoolError::BadBlockSize {
                block: block_size,
                size,
            };
            return Err(pool_error_to_py(py, e));
        }
        // SAFETY: `from_raw_parts` needs the memory valid (and writable if
        // `writable`) while `owner` lives, and used by nothing but Ferry
        // while a descriptor of the pool (or its operation) is in use. The
        // argument is that of `memory::descriptors`: the Python layer
        // (`ferry/_pool.py`, through `_descriptor._describe`) takes `ptr`
        // and `size` only from a buffer export (kept in `owner`, so the
        // memory can be neither resized nor freed), a `bytes` object's
        // storage, or torch's own C methods of an exact `torch.Tensor`, and
        // marks read-only memory not writable; the raw `(ptr, size, device,
        // ref)` form is the caller's promise. The Rust pool holds `owner`,
        // and each of its descriptors holds the pool's memory (the last one
        // dropped after its operation's region is closed, see
        // `memory::descriptors`). Other operations of this process keep off
        // the blocks an operation writes, and it off those they write: the
        // `Table` refuses such blocks (see `Blocks::take`), and claims
        // refuse other descriptors over the pool's memory. Python code must
        // not use the blocks while the operation is in progress
        // (documented). Device memory is never dereferenced: operations
        // refuse it.
        #[allow(unsafe_code)]
        let inner = unsafe {
            ferry::Pool::from_raw_parts(ptr as *mut u8, size, block_size, device, writable, owner)
        }
        .map_err(|e| pool_error_to_py(py, e))?;
        Ok(Pool {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            ptr,
            size,
            block: block_size,
            device,
            writable,
            inner,
            table: Arc::new(Table::new(size / block_size)),
        })
    }

    /// The pool's size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Bytes per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.block
    }

    /// How many blocks the pool has.
    #[getter]
    fn block_count(&self) -> usize {
        self.size / self.block
    }

    /// Where the memory lives ("cpu", "cuda:0"...).
    #[getter]
    fn device(&self) -> String {
        self.device.to_string()
    }

    /// Whether operations may write into the pool.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// Blocks `ids` (see `read_ids`), `length` bytes at `offset` of each
    /// (`None`: to the end of the block); `writable` unless only read.
    #[pyo3(signature = (ids, offset=0, length=None, writable=true))]
    fn blocks(
        slf: &Bound<'_, Self>,
        ids: &Bound<'_, PyAny>,
        offset: usize,
        length: Option<usize>,
        writable: bool,
    ) -> PyResult<Blocks> {
        let py = slf.py();
        let p = slf.get();
        if writable && !p.writable {
            return Err(pool_error_to_py(py, PoolError::ReadOnly));
        }
        let block = p.block;
        let len = length.unwrap_or(block.saturating_sub(offset));
        if offset.checked_add(len).is_none_or(|end| end > block) {
            return Err(pool_error_to_py(
                py,
                PoolError::BadSlice { offset, len, block },
            ));
        }
        let ids = read_ids(ids, p.size / p.block)?;
        // Too many ids is refused when an operation takes them (`blocks_with`).
        if ids.is_empty() {
            return Err(pool_error_to_py(py, PoolError::BadCount(ids.len())));
        }
        Ok(Blocks {
            pool: slf.clone().unbind(),
            ids: ids.into(),
            offset,
            len,
            writable,
        })
    }
}

#[pymethods]
impl Blocks {
    /// The pool.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<Pool> {
        self.pool.clone_ref(py)
    }

    /// How many blocks.
    #[getter]
    fn block_count(&self) -> usize {
        self.ids.len()
    }

    /// Bytes skipped at the start of each block.
    #[getter]
    fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes taken from each block.
    #[getter]
    fn length(&self) -> usize {
        self.len
    }

    /// Whether operations may write into the blocks.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// The block ids, as native-endian `u32` bytes (`numpy.frombuffer(b,
    /// numpy.uint32)` reads them back without a Python object per id).
    fn ids_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let mut out = Vec::with_capacity(self.ids.len() * 4);
        for id in self.ids.iter() {
            out.extend_from_slice(&id.to_ne_bytes());
        }
        PyBytes::new(py, &out)
    }
}
