"""Buffers of every kind a Descriptor accepts, filled with reproducible bytes.

Shared by the tests and by helper.py (the other process).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
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


class CudaDriver:
    """The few calls of the CUDA driver (``libcuda``, through ctypes) that
    make, fill, read back and free device memory on ``cuda:0``: GPU memory
    for the tests without CuPy or torch (neither need be installed on a GPU
    machine). Its primary context is made current on the thread that
    loads it."""

    def __init__(self) -> None:
        path = os.environ.get("FERRY_CUDA_LIB") or ctypes.util.find_library("cuda") or "libcuda.so.1"
        self.lib = ctypes.CDLL(path)
        self.check("cuInit", self.lib.cuInit(0))
        count = ctypes.c_int(0)
        self.check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(count)))
        if count.value < 1:
            raise OSError("the CUDA driver sees no device")
        dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), 0))
        self.check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.ctx = ctx
        self.enter()

    def enter(self) -> None:
        """Makes cuda:0's primary context current on the calling thread
        (a buffer may be freed on any thread)."""
        self.check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(self.ctx))

    @staticmethod
    def check(call: str, code: int) -> None:
        if code != 0:
            raise OSError(f"{call} failed: CUDA error {code}")

    def alloc(self, size: int) -> int:
        self.enter()
        ptr = ctypes.c_uint64(0)
        self.check("cuMemAlloc_v2", self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(size, 1))))
        return ptr.value

    def to_device(self, ptr: int, data: bytes) -> None:
        self.enter()
        if data:
            self.check("cuMemcpyHtoD_v2", self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), data, ctypes.c_size_t(len(data))))

    def to_host(self, ptr: int, size: int) -> bytes:
        self.enter()
        out = ctypes.create_string_buffer(size)
        if size:
            self.check("cuMemcpyDtoH_v2", self.lib.cuMemcpyDtoH_v2(out, ctypes.c_uint64(ptr), ctypes.c_size_t(size)))
        return out.raw

    def free(self, ptr: int) -> None:
        self.lib.cuCtxSetCurrent(self.ctx)
        self.lib.cuMemFree_v2(ctypes.c_uint64(ptr))


def _cuda_driver() -> Optional[CudaDriver]:
    """The driver, where it loads and sees a GPU, and this process does not
    simulate one."""
    if os.environ.get("FERRY_TEST_SIMULATED_GPU") == "1":
        return None
    try:
        return CudaDriver()
    except OSError:
        return None


cuda = _cuda_driver()

# Kinds of GPU memory this process can make: device memory behind
# ``__cuda_array_interface__`` (as a CuPy or Numba array) where the driver
# is, and CUDA tensors where torch has a GPU.
CUDA_KINDS = (["cuda_cai"] if cuda is not None else []) + (
    ["torch_cuda"] if torch is not None and torch.cuda.is_available() else []
)


def cuda_array_interface(ptr: int, size: int) -> dict:
    """The CUDA array interface (version 3) of `size` bytes at `ptr`."""
    return {
        "version": 3,
        "data": (ptr, False),
        "shape": (size,),
        "typestr": "|u1",
        "strides": None,
    }


class DeviceArray:
    """Device memory of ``cuda:0`` (allocated through :class:`CudaDriver`)
    presenting the CUDA array interface, version 3, as bytes: what a CuPy
    or Numba array looks like to Ferry. Freed when collected."""

    def __init__(self, data: bytes) -> None:
        assert cuda is not None, "no CUDA driver here"
        self.size = len(data)
        self.ptr = cuda.alloc(self.size)
        cuda.to_device(self.ptr, data)
        self.__cuda_array_interface__ = cuda_array_interface(self.ptr, self.size)

    def tobytes(self) -> bytes:
        assert cuda is not None
        return cuda.to_host(self.ptr, self.size)

    def __del__(self) -> None:
        if cuda is not None:
            cuda.free(self.ptr)


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
    if kind == "cuda_cai":
        return DeviceArray(data)
    if kind == "torch_cuda":
        return new("torch", size, fill).to("cuda:0")
    raise ValueError(f"unknown buffer kind {kind!r}")


class HostCudaArray:
    """Host memory presenting the CUDA array interface (version 3, bytes):
    what a CuPy or Numba array on ``cuda:0`` looks like to Ferry. Only for
    processes that simulate a GPU (``FERRY_TEST_SIMULATED_GPU=1``), where
    device addresses are host memory."""

    def __init__(self, data: bytes) -> None:
        self.host = numpy.frombuffer(bytearray(data), dtype=numpy.uint8)
        self.__cuda_array_interface__ = cuda_array_interface(self.host.ctypes.data, len(data))


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
    if kind == "cuda_cai":
        return buf.tobytes()
    if kind == "torch_cuda":
        return buf.cpu().numpy().tobytes()
    raise ValueError(kind)


def make(kind: str, sizes: List[int], seed: Optional[int]) -> List[Any]:
    """Buffers of `sizes`, holding `seed`'s pattern (or zeros)."""
    return [
        new(kind, s, pattern(seed, i, s) if seed is not None else None)
        for i, s in enumerate(sizes)
    ]


def verify(kind: str, bufs: List[Any], seed: int) -> bool:
    return all(contents(kind, b) == pattern(seed, i, len(contents(kind, b))) for i, b in enumerate(bufs))
