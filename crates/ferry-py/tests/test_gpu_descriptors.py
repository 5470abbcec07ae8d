"""CUDA memory: described from a torch tensor, an object with a
``__cuda_array_interface__`` or a raw tuple, never touched, and refused when
an operation is created, with an error that says why.

These run without a GPU: the objects are fakes whose addresses nothing ever
reads. Where this host has no CUDA the refusal is a CudaUnavailableError;
where it has CUDA, operations accept it (it moves by CUDA IPC or staged
through host memory), except mixed with host memory: a
NoDeviceTransportError, or a NotDeviceMemoryError where the driver is asked
about a fake address first. The torch test needs torch and a GPU, and skips
otherwise.
"""

from __future__ import annotations

import types
from typing import Any, Optional

import pytest
from conftest import no_libcuda_here, run

import ferry
from ferry import (
    Connector,
    CudaUnavailableError,
    Descriptor,
    DeviceMemoryError,
    Device,
    NoDeviceTransportError,
    NotDeviceMemoryError,
    Pool,
)

PTR = 0x7F00DEAD0000  # an address on a GPU, never read


class CudaArray:
    """A fake CuPy/Numba array: a 4x8 float32 array with the CUDA array
    interface (version 3), on the GPU ``device_id`` says if it is given."""

    def __init__(self, device_id: Any = None, drop: Optional[str] = None, **iface: Any) -> None:
        cai = {
            "version": 3,
            "data": (PTR, False),
            "shape": (4, 8),
            "typestr": "<f4",
            "strides": None,
            "stream": 1,
            **iface,
        }
        if drop is not None:
            del cai[drop]
        self.__cuda_array_interface__ = cai
        if device_id is not None:
            self.device = types.SimpleNamespace(id=device_id)


def check_refused(e: BaseException, index: int, device: str) -> None:
    """The error of an operation over CUDA memory, as this host gives it."""
    text = str(e)
    assert isinstance(e, DeviceMemoryError) and isinstance(e, ValueError), repr(e)
    if isinstance(e, NotDeviceMemoryError):
        # A host with CUDA asks its driver first, which does not know the
        # fake address as memory of that GPU.
        assert not no_libcuda_here()
        assert f"descriptor {index} says {device}, but the CUDA driver disagrees" in text, text
        return
    assert f"descriptor {index} is on {device}" in text, text
    if isinstance(e, CudaUnavailableError):
        assert "CUDA is not available on this host" in text, text
        assert "copy the data to host memory" in text, text
    else:
        assert isinstance(e, NoDeviceTransportError) and isinstance(e, NotImplementedError)
        assert "no transport of this connector carries it" in text, text
    if no_libcuda_here():
        assert isinstance(e, CudaUnavailableError), repr(e)
        # What ferry::cuda::status() says: what was tried, and what to do.
        assert "libcuda" in text and "install the NVIDIA driver" in text, text
        assert "FERRY_CUDA_LIB" in text, text


def test_error_classes():
    assert issubclass(CudaUnavailableError, DeviceMemoryError)
    assert issubclass(NoDeviceTransportError, DeviceMemoryError)
    assert issubclass(NoDeviceTransportError, NotImplementedError)
    assert issubclass(ferry.NotDeviceMemoryError, DeviceMemoryError)
    assert issubclass(DeviceMemoryError, ValueError)
    assert not issubclass(DeviceMemoryError, ferry.FerryError)
    for name in (
        "DeviceMemoryError",
        "CudaUnavailableError",
        "NoDeviceTransportError",
        "NotDeviceMemoryError",
    ):
        assert name in ferry.__all__


def cuda_here() -> bool:
    """Whether connectors move CUDA memory here (the driver loads and sees
    a device)."""
    return Connector(listen="127.0.0.1:0").is_cuda_available


def test_is_cuda_available_is_false_without_cuda():
    available = Connector(listen="127.0.0.1:0").is_cuda_available
    assert isinstance(available, bool)
    if no_libcuda_here():
        assert available is False


# ---- __cuda_array_interface__ ----


def test_cuda_array_interface_alone_is_cuda_memory():
    a = CudaArray()
    d = Descriptor(a)
    assert (d.ptr, d.size, d.device, d.readonly) == (PTR, 128, Device("cuda:0"), False)
    assert d._data_ref is a
    assert Descriptor(CudaArray(strides=(32, 4))).size == 128
    assert Descriptor(CudaArray(data=(PTR, True))).readonly
    # Every version of the interface.
    for version in range(4):
        assert Descriptor(CudaArray(version=version)).size == 128
    # Empty arrays, and any stride for an extent of 1.
    assert Descriptor(CudaArray(shape=(0, 8), data=(0, False))).size == 0
    assert Descriptor(CudaArray(shape=(1, 8), strides=(999, 4))).size == 32
    assert Descriptor(CudaArray(shape=(), typestr="<c16")).size == 16


def test_the_driver_is_asked_only_where_it_is():
    # A made-up address: no driver to ask here, and a real one does not
    # know it as device memory either.
    assert ferry._ferry.cuda_device_of(PTR) is None


def test_the_device_is_the_arrays_or_cuda_0():
    assert Descriptor(CudaArray()).device == Device("cuda:0")
    assert Descriptor(CudaArray(device_id=2)).device == Device("cuda:2")
    assert Descriptor((CudaArray(), "cuda:3")).device == Device("cuda:3")
    assert Descriptor((CudaArray(device_id=2), "cuda:2")).device == Device("cuda:2")
    with pytest.raises(ValueError, match=r"on cuda:2 \(its device.id\), not on cuda:1"):
        Descriptor((CudaArray(device_id=2), "cuda:1"))
    for bad in (-1, "1", True, 1.0):
        with pytest.raises(ValueError, match="device.id"):
            Descriptor(CudaArray(device_id=bad))
    # The interface says CUDA: it never describes host memory.
    with pytest.raises(ValueError, match="on cuda:0, not on cpu"):
        Descriptor((CudaArray(), "cpu"))


@pytest.mark.parametrize(
    "strides",
    [(64, 4), (4, 16), (32, 8), (32,), (32, 4, 1)],
    ids=["padded_rows", "fortran_order", "gaps", "too_few", "too_many"],
)
def test_only_c_contiguous_strides(strides):
    with pytest.raises(ValueError, match="not C-contiguous"):
        Descriptor(CudaArray(strides=strides))
    with pytest.raises(ValueError, match="not C-contiguous"):
        Descriptor((CudaArray(strides=strides), "cuda:1"))


@pytest.mark.parametrize("typestr", ["<f3x", "|O8", "f4", "<f0", "<t4", 4, None, b"<f4"])
def test_bad_typestr(typestr):
    with pytest.raises(ValueError, match="typestr"):
        Descriptor(CudaArray(typestr=typestr))


@pytest.mark.parametrize("key", ["version", "data", "shape", "typestr"])
def test_missing_keys(key):
    with pytest.raises(ValueError, match=f"has no '{key}'"):
        Descriptor(CudaArray(drop=key))


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"version": 4}, "version 4"),
        ({"version": "3"}, "version"),
        ({"data": (None, False)}, "data"),
        ({"data": (PTR, 0)}, "data"),
        ({"data": (-1, False)}, "data"),
        ({"data": [PTR, False]}, "data"),
        ({"data": (0, False)}, "null pointer"),
        ({"shape": (-1,)}, "negative"),
        ({"shape": [4, 8]}, "shape"),
        ({"strides": [32, 4]}, "strides"),
        ({"mask": object()}, "masked"),
        ({"data": ((1 << 64) - 8, False)}, "address space"),
    ],
)
def test_malformed_interfaces(fields, match):
    with pytest.raises(ValueError, match=match):
        Descriptor(CudaArray(**fields))


def test_an_interface_that_is_not_a_dict():
    class Odd:
        __cuda_array_interface__ = [("data", (PTR, False))]

    with pytest.raises(TypeError, match="must be a dict"):
        Descriptor(Odd())


# ---- operations refuse CUDA memory ----


def test_every_operation_refuses_cuda_memory():
    if cuda_here():
        pytest.skip("CUDA is here: operations accept CUDA memory (crates/ferry/tests/cuda_ipc.rs)")

    async def main():
        a, b = Connector(listen="127.0.0.1:0"), Connector(listen="127.0.0.1:0")
        with pytest.raises(DeviceMemoryError) as e:
            await a.create_readable(Descriptor(CudaArray()))
        check_refused(e.value, 0, "cuda:0")
        with pytest.raises(DeviceMemoryError) as e:
            await a.create_writable([Descriptor(bytearray(8)), Descriptor(CudaArray(device_id=1))])
        check_refused(e.value, 1, "cuda:1")

        readable = await b.create_readable(Descriptor(bytearray(128)))
        with pytest.raises(DeviceMemoryError) as e:
            await a.begin_read(readable.metadata(), Descriptor((CudaArray(), "cuda:2")))
        check_refused(e.value, 0, "cuda:2")
        writable = await b.create_writable(Descriptor(bytearray(128)))
        with pytest.raises(DeviceMemoryError) as e:
            await a.begin_write(Descriptor(CudaArray()), writable.metadata())
        check_refused(e.value, 0, "cuda:0")

        # The raw tuple form, with what owns the memory.
        owner = object()
        raw = Descriptor((PTR, 4096, "cuda:1", owner))
        assert (raw.device, raw.size, raw._data_ref) == (Device("cuda:1"), 4096, owner)
        with pytest.raises(DeviceMemoryError) as e:
            await a.create_readable(raw)
        check_refused(e.value, 0, "cuda:1")
        # Nothing was claimed: the same memory is refused the same way again.
        with pytest.raises(DeviceMemoryError):
            await a.create_writable(raw)
        readable.cancel()
        writable.cancel()

    run(main())


def test_read_only_cuda_memory_is_refused_as_read_only():
    async def main():
        a, b = Connector(listen="127.0.0.1:0"), Connector(listen="127.0.0.1:0")
        ro = Descriptor(CudaArray(data=(PTR, True)))
        with pytest.raises(ValueError, match="read-only") as e:
            await a.create_writable(ro)
        assert not isinstance(e.value, DeviceMemoryError)
        readable = await b.create_readable(Descriptor(bytearray(128)))
        with pytest.raises(ValueError, match="read-only"):
            await a.begin_read(readable.metadata(), ro)
        # As the source of a readable it is only refused for its device.
        with pytest.raises(DeviceMemoryError) as e2:
            await a.create_readable(ro)
        check_refused(e2.value, 0, "cuda:0")
        readable.cancel()

    run(main())


def test_blocks_of_a_cuda_pool_are_refused():
    async def main():
        a = Connector(listen="127.0.0.1:0")
        pool = Pool((PTR, 8 * 1024, "cuda:0", None), 1024)
        assert pool.device == Device("cuda:0")
        with pytest.raises(DeviceMemoryError) as e:
            await a.create_readable([Descriptor(bytearray(4)), pool.blocks([1, 5])])
        check_refused(e.value, 1, "cuda:0")

    run(main())


# ---- torch ----


def test_cuda_tensors_where_torch_and_a_gpu_are():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    t = torch.arange(64, dtype=torch.float32, device="cuda:0")
    d = Descriptor(t)
    assert (d.ptr, d.size, d.device) == (t.data_ptr(), 256, Device("cuda:0"))
    assert d._data_ref is t
    with pytest.raises(ValueError, match="not contiguous"):
        Descriptor(t.view(8, 8).t())

    async def main():
        a = Connector(listen="127.0.0.1:0")
        assert a.is_cuda_available is True
        # Accepted: it moves by CUDA IPC between processes of one host, or
        # staged through host memory over TCP.
        op = await a.create_readable(d)
        op.cancel()
        # Mixed with host memory in one operation: refused.
        with pytest.raises(NoDeviceTransportError) as e:
            await a.create_readable([Descriptor(bytearray(4)), d])
        check_refused(e.value, 1, "cuda:0")

    run(main())
