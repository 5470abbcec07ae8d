"""NIXL's test helpers (``nixl._utils``), which its examples use to get
host memory by address: :func:`malloc_passthru`, :func:`free_passthru`,
:func:`ba_buf` and :func:`verify_transfer`."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Set

__all__ = ["malloc_passthru", "free_passthru", "ba_buf", "verify_transfer"]

_ALIGN = 4096
_libc: Any = ctypes.CDLL(ctypes.util.find_library("c") or None)
_libc.aligned_alloc.restype = ctypes.c_void_p
_libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]

# What malloc_passthru handed out and free_passthru has not taken back:
# a free of anything else is refused, not undefined behaviour.
_live: Set[int] = set()


def _size(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"a size is an int, not {type(n).__name__}")
    if n < 0:
        raise ValueError(f"a size is >= 0, not {n}")
    return n


def malloc_passthru(size: int) -> int:
    """`size` bytes of host memory aligned to 4 KiB; returns the address
    (``MemoryError`` if there is none)."""
    n = _size(size)
    rounded = max(_ALIGN, (n + _ALIGN - 1) // _ALIGN * _ALIGN)
    addr = _libc.aligned_alloc(_ALIGN, rounded)
    if not addr:
        raise MemoryError(f"aligned_alloc of {rounded} bytes failed")
    _live.add(int(addr))
    return int(addr)


def free_passthru(addr: int) -> None:
    """Frees memory from :func:`malloc_passthru` (``ValueError`` for any
    other address, instead of NIXL's undefined behaviour)."""
    if addr not in _live:
        raise ValueError(f"{addr:#x} did not come from malloc_passthru (or was freed)")
    _live.discard(addr)
    _libc.free(addr)


def ba_buf(addr: int, size: int) -> None:
    """Fills `size` bytes at `addr` with ``0xba``."""
    ctypes.memset(addr, 0xBA, _size(size))


def verify_transfer(addr1: int, addr2: int, size: int) -> None:
    """Asserts that `size` bytes at `addr1` and at `addr2` are equal."""
    n = _size(size)
    if ctypes.string_at(addr1, n) != ctypes.string_at(addr2, n):
        raise AssertionError(f"{n} bytes at {addr1:#x} and {addr2:#x} differ")
