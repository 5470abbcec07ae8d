"""Enums, :class:`Device` and :class:`Descriptor`."""

from __future__ import annotations

import ctypes
import re
from enum import IntEnum
from typing import Any, Dict, Optional, Tuple, Union

from . import _ferry

__all__ = [
    "DeviceKind",
    "OperationKind",
    "OperationStatus",
    "Device",
    "Descriptor",
]


class DeviceKind(IntEnum):
    """The kind of memory a :class:`Device` names (the reference's numbers)."""

    UNSPECIFIED = 0
    HOST = 1
    """System (CPU) memory."""
    CUDA = 2
    """CUDA device (GPU) memory."""

    def __str__(self) -> str:
        return _DEVICE_KIND_NAMES.get(self.value, "<invalid>")

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


_DEVICE_KIND_NAMES = {1: "cpu", 2: "cuda"}


class OperationKind(IntEnum):
    """What a readable or writable lets its remote do: 1 READ, 2 WRITE."""

    UNSPECIFIED = 0
    READ = 1
    WRITE = 2

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class OperationStatus(IntEnum):
    """The state of an operation (the reference's six states and numbers)."""

    UNINITIALIZED = 0
    """Not set up yet."""
    INITIALIZED = 1
    """Set up; no transfer has started."""
    IN_PROGRESS = 2
    """Bytes are moving."""
    COMPLETE = 3
    """Every byte arrived and both sides know it."""
    CANCELLED = 4
    """Cancelled by this side or by the remote."""
    ERRORED = 5
    """Failed; waiting for it raises the cause."""

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class Device:
    """Where memory lives: ``"cpu"``, ``"cuda"`` (= ``"cuda:0"``) or
    ``"cuda:N"``, or a ``(DeviceKind, id)`` pair.

    This version of Ferry moves host memory only; descriptors on a CUDA
    device are refused (``ValueError``) when an operation is created.
    """

    __slots__ = ("_kind", "_id")

    def __init__(self, metadata: Union[str, Tuple[DeviceKind, int], Device]) -> None:
        if isinstance(metadata, Device):
            kind, ident = metadata._kind, metadata._id
        elif isinstance(metadata, str):
            k, ident = _ferry.parse_device(metadata)
            kind = DeviceKind(k)
        elif isinstance(metadata, tuple) and len(metadata) == 2:
            k, ident = metadata
            if not isinstance(k, int) or isinstance(k, bool):
                raise TypeError(f"device kind must be a DeviceKind, not {type(k).__name__}")
            if k not in (DeviceKind.HOST, DeviceKind.CUDA):
                raise ValueError(f"device kind must be DeviceKind.HOST or DeviceKind.CUDA, not {k!r}")
            kind = DeviceKind(k)
            if not isinstance(ident, int) or isinstance(ident, bool):
                raise TypeError(f"device id must be an int, not {type(ident).__name__}")
            if ident < 0 or ident >= 1_000_000_000:
                raise ValueError(f"device id {ident} is out of range")
            if kind == DeviceKind.HOST and ident != 0:
                raise ValueError(f"host memory has no device number (got {ident})")
        else:
            raise TypeError(
                "Device takes 'cpu', 'cuda', 'cuda:N' or a (DeviceKind, id) pair, "
                f"not {type(metadata).__name__}"
            )
        self._kind: DeviceKind = kind
        self._id: int = int(ident)

    @property
    def kind(self) -> DeviceKind:
        """The kind of memory."""
        return self._kind

    @property
    def id(self) -> int:
        """The device ordinal (0 for host memory)."""
        return self._id

    def __str__(self) -> str:
        return "cpu" if self._kind == DeviceKind.HOST else f"cuda:{self._id}"

    def __repr__(self) -> str:
        return f"Device({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self._kind, self._id) == (other._kind, other._id)

    def __hash__(self) -> int:
        return hash((self._kind, self._id))


CPU = Device("cpu")

_TYPE_MESSAGE = (
    "Descriptor takes a torch.Tensor, a (ndarray, device) tuple, bytes, a bytearray, "
    "any buffer (memoryview, NumPy array, array.array) or a (ptr, size, device, ref) tuple"
)

DescriptorSource = Any
"""What :class:`Descriptor` accepts (see its documentation)."""


class Descriptor:
    """One contiguous buffer that an operation moves data from or into.

    Accepts:

    - a ``torch.Tensor`` (contiguous; duck-typed through ``data_ptr()``,
      ``numel()``, ``element_size()``, ``is_contiguous()`` and ``device``, so
      torch is not a dependency);
    - a tuple ``(ndarray, device)``: a NumPy array (or any object with the
      ``__array_interface__``; ``__cuda_array_interface__`` for CUDA arrays)
      and a :class:`Device` or device string;
    - ``bytes``: read-only, so only the source of a write or the memory of a
      readable;
    - a ``bytearray``, or any buffer: ``memoryview``, a NumPy array,
      ``array.array``, ``mmap``... (read-only buffers are read-only
      descriptors; a buffer must be contiguous);
    - a tuple ``(ptr, size, device, ref)``: raw memory. Nothing checks it:
      the memory must stay valid while an operation uses it, ``ref`` (kept
      alive by the descriptor) is typically what owns it.

    The descriptor keeps the object alive, and a buffer exported (a
    ``bytearray`` cannot be resized while a descriptor holds it). Do not read
    or write the memory while an operation that uses it is in progress, and
    do not resize a tensor that a descriptor describes.
    """

    __slots__ = ("_ptr", "_size", "_device", "_readonly", "_ref", "_raw")

    def __init__(self, data: DescriptorSource) -> None:
        if data is None:
            raise ValueError("Descriptor needs data, not None")
        if isinstance(data, Descriptor):
            ptr, size, device, readonly, ref = (
                data._ptr,
                data._size,
                data._device,
                data._readonly,
                data._ref,
            )
        else:
            ptr, size, device, readonly, ref = _describe(data)
        self._ptr: int = ptr
        self._size: int = size
        self._device: Device = device
        self._readonly: bool = readonly
        self._ref: Any = ref
        # What the compiled core takes.
        self._raw = (ptr, size, str(device), not readonly, ref)

    @property
    def ptr(self) -> int:
        """The address of the first byte."""
        return self._ptr

    @property
    def size(self) -> int:
        """The length in bytes."""
        return self._size

    @property
    def device(self) -> Device:
        """Where the memory lives."""
        return self._device

    @property
    def readonly(self) -> bool:
        """Whether the memory may only be read (``bytes``, read-only buffers):
        such a descriptor cannot receive data."""
        return self._readonly

    def __repr__(self) -> str:
        ro = ", readonly" if self._readonly else ""
        return f"Descriptor(ptr={self._ptr:#x}, size={self._size}, device={self._device}{ro})"


def _describe(data: Any) -> Tuple[int, int, Device, bool, Any]:
    """``(ptr, size, device, readonly, ref)`` of `data`."""
    if isinstance(data, bytes):
        return _ferry.bytes_address(data), len(data), CPU, True, data
    if isinstance(data, bytearray):
        # The export first: from then on the bytearray can be neither
        # resized nor freed, so its address holds.
        pin = memoryview(data)
        ptr, size = _ferry.bytearray_address(data)
        return ptr, size, CPU, False, (data, pin)
    if isinstance(data, tuple):
        return _describe_tuple(data)
    if _is_tensor(data):
        return _describe_tensor(data)
    if _has_array_interface(data):
        return _describe_array(data, None)
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"{_TYPE_MESSAGE}; got {type(data).__name__}") from None
    return _describe_buffer(data, view)


def _device_arg(d: Any) -> Device:
    if isinstance(d, (Device, str)):
        return Device(d)
    raise TypeError(f"a device must be a ferry.Device or a string such as 'cpu', not {type(d).__name__}")


def _describe_tuple(data: Tuple[Any, ...]) -> Tuple[int, int, Device, bool, Any]:
    if (
        2 <= len(data) <= 4
        and isinstance(data[0], int)
        and isinstance(data[1], int)
        and not isinstance(data[0], bool)
    ):
        # (ptr, size[, device[, ref]]): raw memory, the caller's promise.
        ptr, size = data[0], data[1]
        device = _device_arg(data[2]) if len(data) >= 3 else CPU
        ref = data[3] if len(data) == 4 else None
        if ptr < 0 or size < 0:
            raise ValueError(f"ptr and size must be >= 0 (got {ptr}, {size})")
        if ptr == 0 and size > 0:
            raise ValueError("ptr is null")
        return ptr, size, device, False, ref
    if len(data) == 2 and isinstance(data[1], (Device, str)):
        array, device = data[0], _device_arg(data[1])
        if _has_array_interface(array) or hasattr(array, "__cuda_array_interface__"):
            return _describe_array(array, device)
        ptr, size, found, readonly, ref = _describe(array)
        if found != device:
            raise ValueError(f"the memory is on {found}, not on {device}")
        return ptr, size, device, readonly, ref
    raise TypeError(f"{_TYPE_MESSAGE}; got a tuple of {len(data)} that is neither")


def _is_tensor(x: Any) -> bool:
    return all(
        callable(getattr(x, name, None))
        for name in ("data_ptr", "numel", "element_size", "is_contiguous")
    )


def _describe_tensor(t: Any) -> Tuple[int, int, Device, bool, Any]:
    if not t.is_contiguous():
        raise ValueError("the tensor is not contiguous: pass tensor.contiguous() (a copy)")
    device = _tensor_device(getattr(t, "device", None))
    size = int(t.numel()) * int(t.element_size())
    return int(t.data_ptr()), size, device, False, t


def _tensor_device(d: Any) -> Device:
    if d is None:
        return CPU
    kind = getattr(d, "type", None)
    if kind == "cpu":
        return CPU
    if kind == "cuda":
        index = getattr(d, "index", None)
        return Device((DeviceKind.CUDA, 0 if index is None else int(index)))
    if isinstance(d, str):
        return Device(d)
    raise ValueError(f"tensors on {d} are not supported: only cpu and cuda")


def _has_array_interface(x: Any) -> bool:
    try:
        return isinstance(x.__array_interface__, dict)
    except Exception:
        return False


def _describe_array(a: Any, device: Optional[Device]) -> Tuple[int, int, Device, bool, Any]:
    host = a.__array_interface__ if _has_array_interface(a) else None
    if host is not None:
        iface = host
        if device is not None and device.kind != DeviceKind.HOST:
            raise ValueError(f"this array is in host memory, not on {device}")
        device = CPU
    else:
        iface = getattr(a, "__cuda_array_interface__", None)
        if not isinstance(iface, dict):
            raise TypeError("an array needs __array_interface__ or __cuda_array_interface__")
        if device is None:
            dev = getattr(a, "device", None)
            device = Device((DeviceKind.CUDA, int(getattr(dev, "id", 0) or 0)))
        elif device.kind != DeviceKind.CUDA:
            raise ValueError(f"this array is in CUDA memory, not on {device}")
    data = iface.get("data")
    if not isinstance(data, tuple) or len(data) != 2:
        # An array whose memory is another object's buffer.
        return _describe_buffer(a, memoryview(a))
    ptr, readonly = int(data[0]), bool(data[1])
    shape = tuple(int(n) for n in iface.get("shape", ()))
    itemsize = _itemsize(a, iface)
    count = 1
    for n in shape:
        count *= n
    nbytes = getattr(a, "nbytes", None)
    size = int(nbytes) if isinstance(nbytes, int) else count * itemsize
    strides = iface.get("strides")
    if strides is not None and not _contiguous(shape, tuple(strides), itemsize):
        raise ValueError(
            "the array is not contiguous: pass numpy.ascontiguousarray(array) (a copy)"
        )
    return ptr, size, device, readonly, a


def _itemsize(a: Any, iface: Dict[str, Any]) -> int:
    n = getattr(a, "itemsize", None)
    if isinstance(n, int):
        return n
    m = re.match(r"^[<>|=]?[a-zA-Z](\d+)", str(iface.get("typestr", "")))
    if m is None:
        raise TypeError(f"cannot tell the item size of {iface.get('typestr')!r}")
    return int(m.group(1))


def _contiguous(shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int) -> bool:
    if any(n == 0 for n in shape):
        return True

    def dense(dims: Any) -> bool:
        expected = itemsize
        for n, stride in dims:
            if n != 1 and stride != expected:
                return False
            expected *= n
        return True

    pairs = list(zip(shape, strides))
    return dense(reversed(pairs)) or dense(pairs)


def _describe_buffer(data: Any, view: memoryview) -> Tuple[int, int, Device, bool, Any]:
    if not view.contiguous:
        raise ValueError("the buffer is not contiguous")
    size = view.nbytes
    if view.readonly:
        if isinstance(view.obj, bytes) and view.c_contiguous and size == len(view.obj):
            return _describe(view.obj)
        # A read-only buffer does not export a writable pointer; NumPy can
        # tell its address without copying.
        try:
            import numpy
        except ImportError:
            raise TypeError(
                "a read-only buffer other than bytes needs NumPy to be described: "
                "pass bytes(buffer), or install numpy"
            ) from None
        array = numpy.frombuffer(view, dtype=numpy.uint8)
        return int(array.__array_interface__["data"][0]), size, CPU, True, (data, array)
    try:
        # Exports the buffer for as long as `pinned` lives: the memory can
        # then be neither resized nor freed.
        pinned = (ctypes.c_char * size).from_buffer(view)
    except (TypeError, ValueError, BufferError) as e:
        raise ValueError(f"cannot describe this buffer: {e}") from None
    return ctypes.addressof(pinned), size, CPU, False, (data, pinned)
