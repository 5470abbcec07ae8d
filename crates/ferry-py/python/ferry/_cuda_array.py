"""Memory behind a ``__cuda_array_interface__`` (CuPy, Numba, JAX...): how
:class:`Descriptor` reads and checks the interface, and which GPU the
memory is on."""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

from . import _ferry
from ._types import Device, DeviceKind

# numpy's type string: byte order, kind, item size. Kinds: boolean, signed and
# unsigned integer, float, complex, timedelta, datetime, bytes, unicode,
# void. Not 'O' (Python objects) nor 't' (bit fields).
_TYPESTR = re.compile(r"[<>|=][biufcmMSUV][1-9][0-9]{0,5}")


def _cuda_array_interface(array: Any) -> Optional[Dict[str, Any]]:
    """The ``__cuda_array_interface__`` of `array` if it has one (a dict)."""
    try:
        iface = array.__cuda_array_interface__
    except AttributeError:
        return None
    if type(iface) is not dict:
        raise TypeError(f"__cuda_array_interface__ must be a dict, not {type(iface).__name__}")
    return iface


CUDA0 = Device((DeviceKind.CUDA, 0))
"""Where an object with a ``__cuda_array_interface__`` that does not say
its device is taken to be, where the CUDA driver cannot say either."""


def _cuda_pointer_device(iface: Dict[str, Any]) -> Optional[Device]:
    """The GPU the CUDA driver says the interface's pointer is on, or None
    (no driver to ask, or no well-formed pointer: the interface's checks
    say what is wrong)."""
    data = iface.get("data")
    if type(data) is not tuple or len(data) != 2 or type(data[0]) is not int:
        return None
    if not 0 < data[0] < 1 << 64:
        return None
    index = _ferry.cuda_device_of(data[0])
    return None if index is None else Device((DeviceKind.CUDA, index))


def _cuda_array_device(array: Any) -> Optional[Device]:
    """The GPU an object with a ``__cuda_array_interface__`` says it is on:
    ``cuda:N`` for an int ``array.device.id`` (CuPy's ``cupy.cuda.Device``,
    JAX's device), None where it has none. The interface itself does not
    say, and without CUDA the pointer cannot be asked."""
    try:
        index = array.device.id
    except AttributeError:
        return None
    if type(index) is not int or index < 0:
        raise ValueError(
            f"the array's device.id is {index!r}, not a GPU number: pass (array, 'cuda:N') "
            "to say which GPU it is on"
        )
    return Device((DeviceKind.CUDA, index))


# The versions of the interface this module reads (the fields it checks
# have kept their meaning since version 0; 3 added 'stream').
_CAI_VERSIONS = range(0, 4)


def _cai_field(iface: Dict[str, Any], key: str) -> Any:
    """``iface[key]``, which the interface requires."""
    if key not in iface:
        raise ValueError(
            f"__cuda_array_interface__ has no {key!r}: it needs 'version', 'data', 'shape' "
            "and 'typestr'"
        )
    return iface[key]


def _describe_cuda_array(array: Any, iface: Dict[str, Any], device: Device) -> Tuple[int, int, Device, bool, Any]:
    """CUDA memory, from a ``__cuda_array_interface__`` that is checked: a
    known version, a well-formed, C-contiguous array of plain data. Its
    address cannot be verified from the host; Ferry never touches CUDA
    memory in this version (an operation refuses it)."""
    version = _cai_field(iface, "version")
    if type(version) is not int or version not in _CAI_VERSIONS:
        raise ValueError(
            f"__cuda_array_interface__ version {version!r} is not one this version of Ferry "
            f"reads (0 to {_CAI_VERSIONS[-1]})"
        )
    data = _cai_field(iface, "data")
    if type(data) is not tuple or len(data) != 2:
        raise ValueError("__cuda_array_interface__['data'] must be a (ptr, readonly) tuple")
    ptr, readonly = data
    if type(ptr) is not int or not 0 <= ptr < 1 << 64 or type(readonly) is not bool:
        raise ValueError(f"__cuda_array_interface__['data'] must be (int >= 0, bool), not {data!r}")
    typestr = _cai_field(iface, "typestr")
    if type(typestr) is not str or _TYPESTR.fullmatch(typestr) is None:
        raise ValueError(f"__cuda_array_interface__['typestr'] {typestr!r} is not a plain data type")
    itemsize = int(typestr[2:])
    shape = _int_tuple(_cai_field(iface, "shape"), "shape")
    if any(n < 0 for n in shape):
        raise ValueError(f"__cuda_array_interface__['shape'] {shape} has a negative extent")
    strides = iface.get("strides")
    if strides is not None and not _c_contiguous(shape, _int_tuple(strides, "strides"), itemsize):
        raise ValueError(
            f"the array is not C-contiguous (shape {shape}, strides {strides}, items of "
            f"{itemsize} bytes): pass a C-contiguous copy (cupy.ascontiguousarray(a), "
            "a.copy(order='C'))"
        )
    if iface.get("mask") is not None:
        raise ValueError("masked arrays are not supported")
    size = itemsize
    for n in shape:
        size *= n
    if ptr == 0 and size > 0:
        raise ValueError("__cuda_array_interface__['data'] has a null pointer")
    if ptr + size > 1 << 64 or size >= 1 << 63:
        raise ValueError(f"{size} bytes at {ptr:#x} do not fit in the address space")
    return ptr, size, device, readonly, array


def _int_tuple(value: Any, what: str) -> Tuple[int, ...]:
    if type(value) is not tuple or any(type(n) is not int for n in value):
        raise ValueError(f"__cuda_array_interface__[{what!r}] must be a tuple of ints, not {value!r}")
    return value


def _c_contiguous(shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int) -> bool:
    """Whether `strides` are those of a C-contiguous array of `shape`
    (the stride of an extent of 1 does not matter; an empty array is
    contiguous)."""
    if len(shape) != len(strides):
        return False
    if any(n == 0 for n in shape):
        return True
    expected = itemsize
    for n, stride in zip(reversed(shape), reversed(strides)):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True
