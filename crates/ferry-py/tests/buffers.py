"""Buffers of every kind a Descriptor accepts, filled with reproducible bytes.

Shared by the tests and by helper.py (the other process).
"""

from __future__ import annotations

import random
from typing import Any, List, Optional

import ferry

try:
    import numpy
except ImportError:  # pragma: no cover - numpy is a test dependency
    numpy = None

try:
    import torch
except ImportError:
    torch = None

# Kinds usable as source and destination.
WRITABLE_KINDS = ["bytearray", "memoryview", "numpy", "numpy_tuple"]
if torch is not None:
    WRITABLE_KINDS.append("torch")
# Kinds usable only as a source.
READONLY_KINDS = ["bytes"]


def pattern(seed: int, index: int, size: int) -> bytes:
    """The bytes descriptor `index` of a transfer with `seed` carries."""
    if numpy is not None:
        rng = numpy.random.default_rng(seed * 1_000_003 + index)
        return rng.integers(0, 256, size, dtype=numpy.uint8).tobytes()
    r = random.Random(seed * 1_000_003 + index)
    chunk = 1 << 24  # randbytes takes at most 2**31 bits at once
    return b"".join(r.randbytes(min(chunk, size - i)) for i in range(0, size, chunk))


def new(kind: str, size: int, fill: Optional[bytes] = None) -> Any:
    """A buffer of `kind` holding `fill` (zeros if None)."""
    data = fill if fill is not None else bytes(size)
    assert len(data) == size
    if kind == "bytes":
        return bytes(data)
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(bytearray(data))
    if kind in ("numpy", "numpy_tuple"):
        # float32 when the size allows: the buffer's format is not bytes.
        raw = numpy.frombuffer(bytearray(data), dtype=numpy.uint8)
        return raw.view(numpy.float32) if size % 4 == 0 else raw
    if kind == "torch":
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone() if size else torch.zeros(0, dtype=torch.uint8)
    if kind == "cuda_sim":
        return HostCudaArray(data)
    raise ValueError(f"unknown buffer kind {kind!r}")


class HostCudaArray:
    """Host memory presenting the CUDA array interface (version 3, bytes):
    what a CuPy or Numba array on ``cuda:0`` looks like to Ferry. Only for
    processes that simulate a GPU (``FERRY_TEST_SIMULATED_GPU=1``), where
    device addresses are host memory."""

    def __init__(self, data: bytes) -> None:
        self.host = numpy.frombuffer(bytearray(data), dtype=numpy.uint8)
        self.__cuda_array_interface__ = {
            "version": 3,
            "data": (self.host.ctypes.data, False),
            "shape": (len(data),),
            "typestr": "|u1",
            "strides": None,
        }


def descriptor(kind: str, buf: Any) -> ferry.Descriptor:
    if kind == "numpy_tuple":
        return ferry.Descriptor((buf, "cpu"))
    return ferry.Descriptor(buf)


def contents(kind: str, buf: Any) -> bytes:
    if kind in ("bytes", "bytearray"):
        return bytes(buf)
    if kind == "memoryview":
        return buf.tobytes()
    if kind in ("numpy", "numpy_tuple"):
        return buf.tobytes()
    if kind == "torch":
        return buf.numpy().tobytes()
    if kind == "cuda_sim":
        return buf.host.tobytes()
    raise ValueError(kind)


def make(kind: str, sizes: List[int], seed: Optional[int]) -> List[Any]:
    """Buffers of `sizes`, holding `seed`'s pattern (or zeros)."""
    return [
        new(kind, s, pattern(seed, i, s) if seed is not None else None)
        for i, s in enumerate(sizes)
    ]


def verify(kind: str, bufs: List[Any], seed: int) -> bool:
    return all(contents(kind, b) == pattern(seed, i, len(contents(kind, b))) for i, b in enumerate(bufs))
