"""Registered pools and paged descriptors: :class:`Pool` (a KV cache, cut
into blocks) and :class:`PagedDescriptor` (blocks of it, by id)."""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Union

from . import _ferry
from ._descriptor import Descriptor, DescriptorSource, _describe, _int_arg
from ._errors import BlockIdTypeError, BlockRangeError, BlockSliceError, DeviceMemoryError
from ._registration import _Registrable
from ._types import Device, DeviceKind

__all__ = ["Pool", "PagedDescriptor", "AnyDescriptor"]

BlockIds = Any
"""What :meth:`Pool.blocks` takes: a NumPy integer array, or a sequence of
ints."""


class Pool:
    """A region of memory registered once and cut into blocks of one size
    (a KV cache: vLLM's is ``[num_blocks, ...]`` per layer), from which
    operations take blocks by id at no cost per block beyond four bytes.

    ``Pool(memory, block_size=None)`` takes what :class:`Descriptor` takes
    (a NumPy array, a ``torch.Tensor`` on the CPU, a ``bytearray``, any
    writable buffer, ``bytes`` or a read-only buffer for a read-only pool,
    or a raw ``(ptr, size, device, ref)`` tuple, whose ``size`` bytes must
    lie within one allocation), keeps it alive and its buffer exported. `block_size` defaults to the size of one item of the
    first dimension of an array or tensor (``memory.nbytes //
    memory.shape[0]``); a last partial block is not addressable.

    :meth:`blocks` and :meth:`shared_blocks` return a
    :class:`PagedDescriptor`: any number of blocks, in any order, described
    by their ids with no Python object per block; it is used like a
    :class:`Descriptor` in every operation, alone or in a list with others.
    The remote sees it as that many descriptors of the block size, and the
    metadata lists them as one entry with a count, so metadata stays a few
    hundred bytes however many blocks move. The two sides' block lists may
    differ; their sizes must match block for block.

    An operation takes its blocks when it is created and gives them back
    when it has ended and is done with them (rarely later than its end: a
    copy that a same-host peer stalls, or a peer that has not yet said it
    stopped reading what was lent to it, keeps them until then): one that
    writes into a block (a read, a writable) excludes
    every other operation on that block; ones that only read it share it.
    A block named twice by an operation that writes into it, or used by
    another operation in a conflicting way, raises :class:`BlockBusyError`.
    Any other :class:`Descriptor` over the pool's memory conflicts with
    operations on the pool as if it covered all of it. As with any
    descriptor, do not touch the blocks from Python while an operation that
    moves them is in progress.
    """

    __slots__ = ("_core", "_obj", "_device")

    def __init__(self, memory: DescriptorSource, block_size: Optional[int] = None) -> None:
        if memory is None:
            raise ValueError("Pool needs memory, not None")
        ptr, size, device, readonly, ref = _describe(memory)
        if block_size is None:
            block = _row_size(memory, size)
        else:
            n = _int_arg(block_size)
            if n is None:
                raise TypeError(f"block_size must be an int, not {type(block_size).__name__}")
            if n <= 0:
                raise ValueError(f"block_size must be > 0 (got {n})")
            block = n
        self._core = _ferry.Pool(ptr, size, block, str(device), not readonly, ref)
        self._obj = memory
        self._device = device

    @property
    def size(self) -> int:
        """The memory's size in bytes."""
        return self._core.size

    @property
    def block_size(self) -> int:
        """Bytes per block."""
        return self._core.block_size

    @property
    def block_count(self) -> int:
        """How many blocks the pool has (ids ``0`` to ``block_count - 1``)."""
        return self._core.block_count

    @property
    def device(self) -> Device:
        """Where the memory lives."""
        return self._device

    @property
    def readonly(self) -> bool:
        """Whether the memory may only be read (``bytes``, a read-only
        buffer): only :meth:`shared_blocks` can be taken."""
        return not self._core.writable

    @property
    def memory(self) -> Any:
        """The object the pool was made from."""
        return self._obj

    def blocks(self, ids: BlockIds, *, offset: int = 0, length: Optional[int] = None) -> PagedDescriptor:
        """A writable :class:`PagedDescriptor` over blocks `ids`, in that
        order: the destination of a read, the memory of a writable (or the
        source of a write, the memory of a readable).

        `ids` is a NumPy integer array (read in one go, no Python object per
        id) or a sequence of ints. With `offset` and `length`, only
        `length` bytes at `offset` of each block are taken (a slice of
        heads, where tensor parallelism differs between the two sides);
        `length` defaults to the rest of the block.

        Raises :class:`BlockRangeError` for an id that is negative or past
        the last block, :class:`BlockIdTypeError` for ids that are not
        integers, :class:`BlockSliceError` for a slice that does not fit a
        block, :class:`PoolError` for no ids or a read-only pool."""
        return self._paged(ids, offset, length, True)

    def shared_blocks(
        self, ids: BlockIds, *, offset: int = 0, length: Optional[int] = None
    ) -> PagedDescriptor:
        """A read-only :class:`PagedDescriptor` over blocks `ids`: the
        source of a write or the memory of a readable, never a destination
        (see :meth:`blocks`). A read-only pool gives only these."""
        return self._paged(ids, offset, length, False)

    def _paged(self, ids: BlockIds, offset: int, length: Optional[int], writable: bool) -> PagedDescriptor:
        off = _int_arg(offset)
        if off is None:
            raise TypeError(f"offset must be an int, not {type(offset).__name__}")
        n = None
        if length is not None:
            n = _int_arg(length)
            if n is None:
                raise TypeError(f"length must be an int or None, not {type(length).__name__}")
        if off < 0 or (n is not None and n < 0):
            raise _slice_error(off, n, self.block_size)
        if off >= 1 << 63 or (n is not None and n >= 1 << 63):
            raise _slice_error(off, n, self.block_size)
        core = self._core.blocks(_ids_arg(ids, self.block_count), off, n, writable)
        return PagedDescriptor._new(self, core)

    def __repr__(self) -> str:
        ro = ", readonly" if self.readonly else ""
        return (
            f"Pool(size={self.size}, block_size={self.block_size}, "
            f"block_count={self.block_count}, device={self._device}{ro})"
        )


def _slice_error(offset: int, length: Optional[int], block: int) -> BlockSliceError:
    what = "to the end of the block" if length is None else f"of {length} bytes"
    return BlockSliceError(f"a slice {what} at offset {offset} does not fit blocks of {block} bytes")


def _row_size(memory: Any, size: int) -> int:
    """The size of one item of the first dimension of `memory` (an array or
    a tensor), for a pool whose block size was not given."""
    shape: Any = None
    torch = sys.modules.get("torch")
    target = memory[0] if type(memory) is tuple and len(memory) == 2 else memory
    if torch is not None and type(target) in (torch.Tensor, torch.nn.Parameter):
        shape = tuple(torch.Tensor.size(target))
    elif type(target) is not tuple:
        try:
            shape = memoryview(target).shape
        except (TypeError, ValueError, BufferError):
            shape = None
    if not shape or shape[0] <= 0:
        raise TypeError(
            "block_size is needed: the memory is not an array or tensor with a first dimension "
            "of blocks (e.g. Pool(kv_cache) with kv_cache of shape [num_blocks, ...])"
        )
    return max(size // int(shape[0]), 1)


def _ids_arg(ids: Any, count: int) -> Any:
    """`ids` as the compiled core takes them: the native-endian uint32
    bytes of a NumPy integer array (checked here, in one go), or the
    sequence itself (checked by the core)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(ids, numpy.ndarray):
        if ids.dtype.kind not in "iu":
            raise BlockIdTypeError(
                f"block ids must be integers, not an array of {ids.dtype} "
                "(e.g. ids.astype(numpy.int64) if the values are whole)"
            )
        if ids.ndim != 1:
            ids = ids.reshape(-1)
        if ids.size and ids.dtype.kind == "i":
            if int(ids.min()) < 0:
                index = int(numpy.argmax(ids < 0))
                raise BlockRangeError(
                    f"block id {int(ids[index])} (entry {index}) is out of range: the pool has "
                    f"blocks 0 to {count - 1}"
                )
        if ids.size:
            high = int(ids.max())
            if high >= count:
                index = int(numpy.argmax(ids >= count))
                raise BlockRangeError(
                    f"block id {int(ids[index])} (entry {index}) is out of range: the pool has "
                    f"blocks 0 to {count - 1}"
                )
        return ids.astype(numpy.uint32, copy=False).tobytes()
    if isinstance(ids, (bytes, bytearray, memoryview, str)):
        raise BlockIdTypeError(
            f"block ids must be a sequence of ints or a NumPy integer array, not {type(ids).__name__}"
        )
    if isinstance(ids, range):
        return list(ids)
    if not isinstance(ids, Sequence):
        raise BlockIdTypeError(
            f"block ids must be a sequence of ints or a NumPy integer array, not {type(ids).__name__}"
        )
    for i, x in enumerate(ids):
        v = None if isinstance(x, bool) else _int_arg(x)
        if v is None and _is_numpy_int(x):
            v = int(x)
        if v is None:
            raise BlockIdTypeError(f"block ids must be ints: entry {i} is a {type(x).__name__}")
        if not 0 <= v < count:
            raise BlockRangeError(
                f"block id {v} (entry {i}) is out of range: the pool has blocks 0 to {count - 1}"
            )
    return ids


def _is_numpy_int(x: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(x, numpy.integer)


class PagedDescriptor(_Registrable):
    """Blocks of a :class:`Pool`, by id: what :meth:`Pool.blocks` and
    :meth:`Pool.shared_blocks` return. Used like a :class:`Descriptor` in
    every operation (alone, or in a list with others); it costs one object
    and four bytes per block, and a remote sees it as :attr:`block_count`
    descriptors of :attr:`length` bytes each.

    It holds no blocks itself: an operation takes them while it is in
    progress (see :class:`Pool`), so one paged descriptor can serve several
    operations, one after another, or at once where they only read.

    It cannot be subclassed, nor made other than by a pool.
    """

    __slots__ = ("_pool", "_core", "_ptr")

    _pool: Pool
    _core: _ferry.Blocks

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("ferry.PagedDescriptor cannot be subclassed")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a PagedDescriptor comes from pool.blocks(ids) or pool.shared_blocks(ids)")

    @classmethod
    def _new(cls, pool: Pool, core: _ferry.Blocks) -> PagedDescriptor:
        self = cls.__new__(cls)
        self._pool = pool
        self._core = core
        self._connection = None
        self._registration = None
        # For registration's null check: the pool's memory is never null.
        self._ptr = 1
        return self

    @property
    def _raw(self) -> _ferry.Blocks:
        """What the compiled core takes."""
        if self._pool.device.kind == DeviceKind.XPU:
            raise DeviceMemoryError(
                f"a paged descriptor is on {self._pool.device}: this version of Ferry moves host "
                "(cpu) memory only"
            )
        return self._core

    @property
    def pool(self) -> Pool:
        """The pool the blocks are taken from."""
        return self._pool

    @property
    def block_count(self) -> int:
        """How many blocks."""
        return self._core.block_count

    @property
    def ids(self) -> Any:
        """The block ids, in order: a NumPy ``uint32`` array (a list of
        ints without NumPy)."""
        data = self._core.ids_bytes()
        numpy = sys.modules.get("numpy")
        if numpy is None:
            import array

            a = array.array("I")
            a.frombytes(data)
            return a.tolist()
        return numpy.frombuffer(data, dtype=numpy.uint32)

    @property
    def offset(self) -> int:
        """Bytes skipped at the start of each block."""
        return self._core.offset

    @property
    def length(self) -> int:
        """Bytes taken from each block."""
        return self._core.length

    @property
    def size(self) -> int:
        """The bytes described: ``block_count * length``."""
        return self._core.block_count * self._core.length

    @property
    def device(self) -> Device:
        """Where the memory lives."""
        return self._pool.device

    @property
    def readonly(self) -> bool:
        """Whether the blocks may only be read (:meth:`Pool.shared_blocks`):
        they cannot receive data."""
        return not self._core.writable

    def __repr__(self) -> str:
        ro = ", readonly" if self.readonly else ""
        part = "" if self.length == self._pool.block_size else f", offset={self.offset}, length={self.length}"
        return f"PagedDescriptor(blocks={self.block_count}, block_size={self._pool.block_size}{part}{ro})"


AnyDescriptor = Union[Descriptor, PagedDescriptor]
"""A :class:`Descriptor` or a :class:`PagedDescriptor`."""
