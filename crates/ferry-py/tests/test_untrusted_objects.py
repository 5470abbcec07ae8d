"""Descriptors take sizes and addresses only from what the interpreter
guarantees (the buffer protocol, a `bytes` object's own length, a real
`torch.Tensor`), never from Python methods an arbitrary object can override.

Each case runs in a child process: on a binding that trusts such a method the
child reads or writes memory that is not the object's, and may die of it
(SIGSEGV), which must fail the test rather than kill pytest. The child
reports, as the last line of its output, either the error that refused the
object or the size it was described with and the bytes a real transfer
moved; the test checks that no byte beyond the object ever moved.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from typing import Any, Dict

import pytest

import ferry
from ferry import Connector, Descriptor, Device

CONTENT = b"0123456789abcdef"  # what every object under test really holds
LIE = 1 << 16  # the size the lying objects claim

# Run first in every child: two connectors in one process, over loopback TCP,
# and the three ways memory can be moved with a descriptor.
PRELUDE = f"""
import asyncio, json, sys
import ferry
from ferry import Connector, Descriptor

CONTENT = {CONTENT!r}
LIE = {LIE}

def report(**fields):
    print(json.dumps(fields), flush=True)

def refused(make):
    '''Calls make(); returns "Type: message" if it raised, else None.'''
    try:
        make()
    except Exception as e:
        return f"{{type(e).__name__}}: {{e}}"
    return None

def pair():
    return Connector(listen="127.0.0.1:0"), Connector(listen="127.0.0.1:0")

async def remote_reads(source):
    '''The bytes a remote READ of a readable over `source` gets.'''
    a, b = pair()
    with await a.create_readable(source) as readable:
        meta = readable.metadata()
        dst = bytearray(meta.total_size)
        async with b.begin_read(meta, Descriptor(dst)) as read:
            await read.wait_for_completion(timeout=20)
    return bytes(dst)

async def remote_receives(source):
    '''The bytes a remote writable gets from a WRITE of `source`.'''
    a, b = pair()
    dst = bytearray(source.size)
    with await b.create_writable(Descriptor(dst)) as writable:
        async with a.begin_write(source, writable.metadata()) as write:
            await write.wait_for_completion(timeout=20)
        await writable.wait_for_completion(timeout=20)
    return bytes(dst)

async def read_into(dest, data):
    '''A READ of `data` (exposed by a remote readable) into `dest`.'''
    a, b = pair()
    with await a.create_readable(Descriptor(bytearray(data))) as readable:
        async with b.begin_read(readable.metadata(), dest) as read:
            await read.wait_for_completion(timeout=20)

def moved(source, direction):
    '''Reports what `direction` moved out of the descriptor `source`.'''
    if direction == "read":
        got = asyncio.run(remote_reads(source))
    else:
        got = asyncio.run(remote_receives(source))
    report(size=source.size, got=got.hex())
"""


def run_child(body: str) -> Dict[str, Any]:
    """Runs PRELUDE + `body` in a fresh interpreter; its last output line, parsed."""
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        pytest.fail(f"the child process died of {name}: the binding touched memory it was not given\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    result: Dict[str, Any] = json.loads(lines[-1])
    return result


def assert_refused(result: Dict[str, Any], *types: str) -> None:
    assert "error" in result, f"accepted: described as {result.get('size')} bytes, moved {result.get('got', '')[:64]}..."
    assert result["error"].split(":")[0] in types, result["error"]


def assert_true_bytes_or_refused(result: Dict[str, Any]) -> None:
    """Either the object was refused, or exactly its own bytes moved."""
    if "error" in result:
        assert_refused(result, "TypeError", "ValueError")
        return
    assert result["size"] == len(CONTENT), f"described as {result['size']} bytes, holds {len(CONTENT)}"
    assert bytes.fromhex(result["got"]) == CONTENT


# ---------------------------------------------------------------------------
# Sizes: an object's own `__len__` / `nbytes` are not its size.
# ---------------------------------------------------------------------------

LYING_SOURCES = {
    "bytes": """
        class Liar(bytes):
            def __len__(self):
                return LIE
        obj = Liar(CONTENT)
    """,
    "bytearray": """
        class Liar(bytearray):
            def __len__(self):
                return LIE
        obj = Liar(CONTENT)
    """,
    "numpy_nbytes": """
        import numpy
        class Liar(numpy.ndarray):
            nbytes = LIE
            size = LIE
            @property
            def shape(self):
                return (LIE,)
        obj = numpy.frombuffer(bytearray(CONTENT), dtype=numpy.uint8).view(Liar)
    """,
    "numpy_array_interface": """
        import numpy
        # The interface points at a larger object elsewhere on the heap.
        elsewhere = bytearray(b"S" * LIE)
        class Liar(numpy.ndarray):
            @property
            def __array_interface__(self):
                address = numpy.frombuffer(elsewhere, dtype=numpy.uint8).ctypes.data
                return {"data": (address, False), "shape": (LIE,), "typestr": "|u1", "version": 3}
        obj = numpy.frombuffer(bytearray(CONTENT), dtype=numpy.uint8).view(Liar)
    """,
    "array_array": """
        import array
        class Liar(array.array):
            def __len__(self):
                return LIE
        obj = Liar("B", CONTENT)
    """,
}


@pytest.mark.parametrize("direction", ["read", "write"])
@pytest.mark.parametrize("kind", sorted(LYING_SOURCES))
def test_a_lying_size_never_moves_bytes_beyond_the_object(kind, direction):
    """Exposed to a remote READ, or the source of a WRITE: exactly the
    object's bytes move (a `bytes` subclass whose `__len__` says 64 KiB used
    to hand the remote 64 KiB of the interpreter's heap)."""
    if kind.startswith("numpy"):
        pytest.importorskip("numpy")
    result = run_child(
        LYING_SOURCES[kind]
        + f"""
        err = refused(lambda: Descriptor(obj))
        if err:
            report(error=err)
        else:
            moved(Descriptor(obj), {direction!r})
        """
    )
    assert_true_bytes_or_refused(result)


@pytest.mark.parametrize("kind", sorted(k for k in LYING_SOURCES if k != "bytes"))
def test_a_lying_size_never_receives_bytes_beyond_the_object(kind):
    """The destination of a READ: a remote offering 64 KiB cannot write past
    the object's 16 bytes; 16 bytes land where they belong."""
    if kind.startswith("numpy"):
        pytest.importorskip("numpy")
    result = run_child(
        LYING_SOURCES[kind]
        + """
        err = refused(lambda: Descriptor(obj))
        if err:
            report(error=err)
            sys.exit(0)
        d = Descriptor(obj)
        # As many bytes as the object claims: refused unless it claims the truth.
        overflow = refused(lambda: asyncio.run(read_into(d, b"X" * LIE)))
        del d
        asyncio.run(read_into(Descriptor(obj), CONTENT[::-1]))
        report(size=Descriptor(obj).size, overflow=overflow, got=bytes(memoryview(obj)).hex())
        """
    )
    if "error" in result:
        assert_refused(result, "TypeError", "ValueError")
        return
    assert result["size"] == len(CONTENT)
    assert result["overflow"] is not None and result["overflow"].startswith("ValueError"), result["overflow"]
    assert bytes.fromhex(result["got"]) == CONTENT[::-1]


# ---------------------------------------------------------------------------
# Addresses: no Python method of an arbitrary object gives one.
# ---------------------------------------------------------------------------

# An address nothing is mapped at (below the kernel's mmap_min_addr).
UNMAPPED = 0x1000

IMPOSTORS = {
    # What the binding used to take for a CPU torch.Tensor.
    "tensor_like": f"""
        import types
        class Impostor:
            device = types.SimpleNamespace(type="cpu", index=None)
            is_cuda = False
            dtype = "uint8"
            shape = (LIE,)
            def data_ptr(self):
                return {UNMAPPED}
            def numel(self):
                return LIE
            def element_size(self):
                return 1
            def is_contiguous(self):
                return True
            def __len__(self):
                return LIE
        obj = Impostor()
    """,
    "array_interface": f"""
        class Impostor:
            __array_interface__ = {{"data": ({UNMAPPED}, False), "shape": (LIE,), "typestr": "|u1", "version": 3}}
            nbytes = LIE
            itemsize = 1
        obj = Impostor()
    """,
    "array_interface_with_device": f"""
        class Impostor:
            __array_interface__ = {{"data": ({UNMAPPED}, False), "shape": (LIE,), "typestr": "|u1", "version": 3}}
            nbytes = LIE
        obj = (Impostor(), "cpu")
    """,
    "claims_to_be_bytes": f"""
        class Impostor:
            __class__ = property(lambda self: bytes)
            def __len__(self):
                return LIE
        obj = Impostor()
    """,
    "claims_to_be_a_descriptor": f"""
        class Impostor:
            __class__ = property(lambda self: Descriptor)
            _ptr = {UNMAPPED}
            _size = LIE
            _device = ferry.Device("cpu")
            _readonly = False
            _ref = None
            _raw = ({UNMAPPED}, LIE, "cpu", True, None)
            ptr, size, device, readonly = _ptr, _size, _device, _readonly
        obj = Impostor()
    """,
    "object_dtype_array": """
        import numpy
        # Its bytes are pointers to Python objects: moving them in or out
        # would let a remote forge objects or learn the heap's layout.
        obj = numpy.array([object(), object()], dtype=object)
    """,
}


@pytest.mark.parametrize("kind", sorted(IMPOSTORS))
def test_an_object_that_is_not_memory_is_a_type_error(kind):
    """An object that only looks like a tensor, an array or a descriptor is
    refused with a TypeError (such an object used to make the process read
    an address of its choosing: SIGSEGV)."""
    if "numpy" in IMPOSTORS[kind]:
        pytest.importorskip("numpy")
    result = run_child(
        IMPOSTORS[kind]
        + """
        err = refused(lambda: Descriptor(obj))
        if err:
            report(error=err)
            sys.exit(0)
        # Accepted: show what that means. Exposed to a remote READ ...
        moved(Descriptor(obj), "read")
        """
    )
    assert_refused(result, "TypeError")


def test_a_descriptor_list_takes_only_real_descriptors():
    """The connector's methods check each descriptor's real type: an object
    whose `__class__` says Descriptor carries an address of its choosing."""
    result = run_child(
        IMPOSTORS["claims_to_be_a_descriptor"]
        + """
        a, b = pair()
        async def main():
            with await a.create_readable([obj]) as readable:
                dst = bytearray(LIE)
                async with b.begin_read(readable.metadata(), Descriptor(dst)) as read:
                    await read.wait_for_completion(timeout=20)
        err = refused(lambda: asyncio.run(main()))
        report(error=err) if err else report(size=LIE, got="")
        """
    )
    assert_refused(result, "TypeError")


def test_a_descriptor_cannot_be_subclassed():
    with pytest.raises(TypeError, match="subclass"):

        class Mine(ferry.Descriptor):  # noqa: F841
            pass


# ---------------------------------------------------------------------------
# CUDA memory: described from a checked interface, never touched.
# ---------------------------------------------------------------------------


class CudaArray:
    """An object with the CUDA array interface (as CuPy's arrays have)."""

    def __init__(self, **iface: Any) -> None:
        self.__cuda_array_interface__ = {
            "data": (0xDEAD0000, False),
            "shape": (4, 8),
            "typestr": "<f4",
            "strides": None,
            "version": 3,
            **iface,
        }


def test_cuda_array_interface_is_checked_and_never_touched():
    d = Descriptor((CudaArray(), "cuda:1"))
    assert (d.ptr, d.size, d.device, d.readonly) == (0xDEAD0000, 128, Device("cuda:1"), False)
    assert Descriptor((CudaArray(strides=(32, 4)), "cuda")).size == 128
    assert Descriptor((CudaArray(data=(0xDEAD0000, True)), "cuda")).readonly
    with pytest.raises(ValueError, match="not C-contiguous"):
        Descriptor((CudaArray(strides=(64, 4)), "cuda"))
    with pytest.raises(ValueError):
        Descriptor((CudaArray(shape=(-1,)), "cuda"))
    with pytest.raises(ValueError):
        Descriptor((CudaArray(typestr="<f3x"), "cuda"))
    with pytest.raises(ValueError):
        Descriptor((CudaArray(typestr="|O8"), "cuda"))
    with pytest.raises(ValueError):
        Descriptor((CudaArray(data=(None, False)), "cuda"))
    with pytest.raises(TypeError):
        Descriptor((object(), "cuda"))
    # The interface says CUDA: it never describes host memory.
    with pytest.raises(ValueError, match="not on cpu"):
        Descriptor((CudaArray(), "cpu"))
    assert Descriptor(CudaArray()).device == Device("cuda:0")
    # And CUDA memory is refused when an operation would use it (see
    # test_gpu_descriptors.py).
    with pytest.raises(ferry.DeviceMemoryError, match="descriptor 0 is on cuda:1"):
        Connector(listen="127.0.0.1:0").create_readable(d).__enter__()


# ---------------------------------------------------------------------------
# torch: a real tensor is read through torch's own C methods.
# ---------------------------------------------------------------------------

TORCH_CHILD = """
try:
    import torch
except ImportError:
    report(skip="torch is not installed")
    sys.exit(0)
"""


def run_torch_child(body: str) -> Dict[str, Any]:
    result = run_child(TORCH_CHILD + textwrap.dedent(body))
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def test_real_tensors_and_parameters_are_accepted():
    result = run_torch_child(
        """
        t = torch.arange(4, dtype=torch.int32)
        p = torch.nn.Parameter(torch.arange(4, dtype=torch.float32))
        dt, dp = Descriptor(t), Descriptor(p)
        # An attribute of the instance does not change what is read.
        t.data_ptr = lambda: 0x1000
        t.numel = lambda: LIE
        assert (Descriptor(t).ptr, Descriptor(t).size) == (dt.ptr, 16)
        got = asyncio.run(remote_reads(Descriptor(t)))
        dst = torch.zeros(4, dtype=torch.float32)
        asyncio.run(read_into(Descriptor(dst), p.detach().numpy().tobytes()))
        report(sizes=[dt.size, dp.size], got=got.hex(), read=dst.tolist(),
               refused=refused(lambda: Descriptor(torch.zeros(4, 4)[:, 1])))
        """
    )
    assert result["sizes"] == [16, 16]
    assert bytes.fromhex(result["got"]) == b"".join(i.to_bytes(4, "little") for i in range(4))
    assert result["read"] == [0.0, 1.0, 2.0, 3.0]
    assert result["refused"].startswith("ValueError")


@pytest.mark.parametrize(
    "impostor",
    [
        # A subclass whose methods lie.
        """
        class Impostor(torch.Tensor):
            def data_ptr(self):
                return 0x1000
            def numel(self):
                return LIE
        obj = torch.zeros(16, dtype=torch.uint8).as_subclass(Impostor)
        """,
        # A subclass that intercepts every torch call.
        """
        class Impostor(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return {"data_ptr": 0x1000, "numel": LIE}.get(getattr(func, "__name__", ""), 1)
        obj = torch.zeros(16, dtype=torch.uint8).as_subclass(Impostor)
        """,
        # Not a tensor at all, but says it is.
        """
        class Impostor:
            __class__ = property(lambda self: torch.Tensor)
            device = torch.device("cpu")
            def data_ptr(self):
                return 0x1000
            def numel(self):
                return LIE
            def element_size(self):
                return 1
            def is_contiguous(self):
                return True
        obj = Impostor()
        """,
    ],
    ids=["overriding_subclass", "torch_function_subclass", "claims_to_be_a_tensor"],
)
def test_a_tensor_impostor_is_a_type_error(impostor):
    result = run_torch_child(
        impostor
        + """
        err = refused(lambda: Descriptor(obj))
        if err:
            report(error=err)
            sys.exit(0)
        moved(Descriptor(obj), "read")
        """
    )
    assert_refused(result, "TypeError")
