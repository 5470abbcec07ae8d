"""Descriptors: :class:`Descriptor` (local memory an operation moves) and
:class:`SerializedDescriptor` (the reference's serialized form), and how
each kind of object is described."""

from __future__ import annotations

import ctypes
import json
import re
import sys
from typing import Any, Dict, Optional, Tuple, Union

from . import _ferry
from ._errors import DeviceMemoryError
from ._pydantic import core_schema_for, json_schema_for
from ._registration import _Registrable
from ._cuda_array import (
    CUDA0,
    _cuda_array_device,
    _cuda_array_interface,
    _cuda_pointer_device,
    _describe_cuda_array,
)
from ._types import CPU, Device, DeviceKind, _parse_device

__all__ = ["Descriptor", "SerializedDescriptor"]

_TYPE_MESSAGE = (
    "Descriptor takes bytes, a bytearray or another buffer (memoryview, NumPy array, "
    "array.array, mmap), a torch.Tensor or torch.nn.Parameter, an object with a "
    "__cuda_array_interface__ (CuPy, Numba), an (array, device) tuple "
    "or a (ptr, size, device, ref) tuple"
)

DescriptorSource = Any
"""What :class:`Descriptor` accepts (see its documentation)."""

_Described = Tuple[int, int, Device, bool, Any]
"""``(ptr, size, device, readonly, ref)``."""


class Descriptor(_Registrable):
    """One contiguous buffer that an operation moves data from or into.

    Accepts:

    - ``bytes`` (or a subclass): read-only, so only the source of a write or
      the memory of a readable;
    - a ``bytearray``, or any other object with the buffer protocol:
      ``memoryview``, a NumPy array, ``array.array``, ``mmap``... (read-only
      buffers are read-only descriptors; a buffer must be contiguous, in C or
      Fortran order, and must not hold Python objects);
    - a ``torch.Tensor`` or ``torch.nn.Parameter`` (contiguous, dense, on
      cpu, cuda or xpu), when ``torch`` has been imported: its
      ``data_ptr()``, ``numel() * element_size()`` bytes, on the device of
      ``tensor.device`` (``cuda:N`` with ``N`` its ``index``);
    - an object with a ``__cuda_array_interface__`` (CuPy, Numba, JAX...)
      that exports no host buffer: CUDA memory, described from the
      interface (versions 0 to 3; see below). The interface does not say
      which GPU the memory is on: the device is ``cuda:N`` where the
      object's ``device.id`` is an int ``N`` (CuPy's and JAX's arrays have
      one), else the GPU the CUDA driver says the address is on (where the
      driver is here), else ``cuda:0``. Pass ``(array, "cuda:N")`` to say
      which;
    - a tuple ``(array, device)``: any of the above and the
      :class:`Device` (or device string) it must be on (an array whose
      ``device.id`` says another GPU is refused);
    - a tuple ``(ptr, size, device, ref)`` (``device`` and ``ref`` may be
      left out): raw memory, e.g. ``(ptr, size, "cuda:1", owner)``. Only the
      CUDA driver checks it (a ``cuda:N`` address must be memory of that
      GPU, where the driver is here): the memory must stay valid while an
      operation uses it, and
      ``ref`` (kept alive by the descriptor) is typically what owns it.

    Anything else is a ``TypeError``. Sizes and addresses come only from
    what the interpreter or the framework guarantees: the buffer protocol
    (the memory an object actually exports, not its ``len()`` or
    ``nbytes``), a ``bytes`` object's own storage, and torch's own C methods
    of a tensor whose type is exactly ``torch.Tensor`` or
    ``torch.nn.Parameter``. No method or attribute an arbitrary object can
    define gives an address or a size of host memory; so an object that
    only looks like a tensor or an array is refused (``numpy.asarray(obj)``
    turns an object with an ``__array_interface__`` into an array, if you
    trust it). A ``__cuda_array_interface__`` is checked but cannot be
    verified: it must have ``version`` (0 to 3), ``data`` (an ``(int ptr,
    bool read_only)`` pair), ``shape`` (a tuple of ints) and ``typestr`` (a
    plain NumPy type such as ``"<f4"``, whose item size it gives); its
    ``strides``, if any, must be those of a C-contiguous array, and it must
    have no ``mask``; ``read_only`` memory is a read-only descriptor.

    CUDA memory is described, never touched on the host, and moves where
    :attr:`Connector.is_cuda_available` is ``True``: by CUDA IPC between
    processes of one host, else over TCP staged through host memory (another
    host, no cross-memory attach, host memory into GPU memory, one
    process); without CUDA an operation over it raises a
    :class:`CudaUnavailableError` (the message says why). Host and CUDA
    memory mixed in one operation raises :class:`NoDeviceTransportError` (both
    :class:`DeviceMemoryError`, a :class:`ValueError`).

    The descriptor keeps the object alive, and a buffer exported (a
    ``bytearray`` cannot be resized while a descriptor holds it). Do not read
    or write the memory while an operation that uses it is in progress, and
    do not resize a tensor that a descriptor describes.

    For code written against the reference, a descriptor also has
    ``register_with_connector`` / ``deregister_with_connector`` /
    ``is_registered`` (Ferry needs no registration: these only record the
    :class:`Connection`, as descriptor pools expect), the ``metadata``
    property and ``from_serialized``, and the private ``_data_size`` (which
    may be lowered, and raised back, within the memory first described) and
    ``_data_ref`` (the object described) that pooled receivers use.

    ``Descriptor`` cannot be subclassed: a subclass could change the address
    and size an operation uses.
    """

    __slots__ = (
        "_ptr",
        "_size",
        "_device",
        "_readonly",
        "_ref",
        "_core_args",
        "_capacity",
        "_obj",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError(
            "ferry.Descriptor cannot be subclassed (a subclass could change the address and "
            "size an operation uses): keep a Descriptor in an attribute instead"
        )

    def __init__(self, data: DescriptorSource) -> None:
        if data is None:
            raise ValueError("Descriptor needs data, not None")
        if type(data) is Descriptor:
            ptr, size, device, readonly, ref = (
                data._ptr,
                data._size,
                data._device,
                data._readonly,
                data._ref,
            )
            capacity, obj = data._capacity, data._obj
        else:
            ptr, size, device, readonly, ref = _describe(data)
            capacity, obj = size, _described_object(data)
        self._ptr: int = ptr
        self._size: int = size
        self._device: Device = device
        self._readonly: bool = readonly
        self._ref: Any = ref
        # How far `_data_size` may go: the memory first described, which
        # `_ref` keeps alive.
        self._capacity: int = capacity
        # What the reference calls `_data_ref`: the object described.
        self._obj: Any = obj
        self._connection = None
        # Identifies the current registration (a new object for each one),
        # so an operation releases only the registration it claimed.
        self._registration = None
        # What the compiled core takes.
        self._core_args = (ptr, size, str(device), not readonly, ref)

    @property
    def _raw(self) -> Tuple[int, int, str, bool, Any]:
        """What the compiled core takes; memory it cannot move is refused
        here, when an operation is created."""
        if self._ptr == 0 and self._size > 0:
            raise ValueError(
                f"a descriptor has a null ptr and size {self._size}: it names no memory. It "
                "describes a remote's memory (from RdmaMetadata.to_descriptors() or the "
                "descriptors of Ferry's RdmaMetadata, which carry no addresses): pass that "
                "metadata to begin_read or begin_write, and local memory as the descriptors"
            )
        if self._device.kind == DeviceKind.XPU:
            raise DeviceMemoryError(
                f"a descriptor is on {self._device}: this version of Ferry moves host (cpu) "
                "memory only, and XPU memory is not supported: copy the data to host memory "
                "(e.g. tensor.cpu()) and describe that"
            )
        return self._core_args

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

    @property
    def metadata(self) -> SerializedDescriptor:
        """The descriptor's address, size and device as a
        :class:`SerializedDescriptor` (as the reference has it). It does not
        keep the memory alive."""
        return SerializedDescriptor(device=str(self._device), ptr=self._ptr, size=self._size)

    @staticmethod
    def from_serialized(serialized: SerializedDescriptor) -> Descriptor:
        """``serialized.to_descriptor()``: raw memory, the caller's promise
        (see :meth:`SerializedDescriptor.to_descriptor`)."""
        if type(serialized) is not SerializedDescriptor:
            raise TypeError(
                f"from_serialized takes a ferry.SerializedDescriptor, not {type(serialized).__name__}"
            )
        return serialized.to_descriptor()

    # ---- the reference's private fields that callers use ----

    @property
    def _data_ptr(self) -> int:
        return self._ptr

    @property
    def _data_device(self) -> Device:
        return self._device

    @property
    def _data_size(self) -> int:
        """The size; pooled receivers lower it to use the start of a larger
        buffer, and set it back afterwards. Only values from 0 to the size
        first described are taken (``ValueError`` otherwise): the memory
        beyond was never described. Operations take the size when created."""
        return self._size

    @_data_size.setter
    def _data_size(self, size: int) -> None:
        n = _int_arg(size)
        if n is None:
            raise TypeError(f"_data_size must be an int, not {type(size).__name__}")
        if not 0 <= n <= self._capacity:
            raise ValueError(
                f"_data_size must be between 0 and {self._capacity}, the size of the memory "
                f"this descriptor describes (got {n})"
            )
        self._size = n
        self._core_args = (self._ptr, n, str(self._device), not self._readonly, self._ref)

    @property
    def _data_ref(self) -> Any:
        """The object described: the tensor, array, bytes or buffer given,
        or the ``ref`` of a raw ``(ptr, size, device, ref)`` tuple."""
        return self._obj

    @_data_ref.setter
    def _data_ref(self, obj: Any) -> None:
        # Changes what is reported only: neither the memory described nor
        # what keeps it alive.
        self._obj = obj

    @_data_ref.deleter
    def _data_ref(self) -> None:
        self._obj = None

    def __str__(self) -> str:
        return f"ptr={hex(self._ptr)}, size={self._size}, device={self._device}"

    def __repr__(self) -> str:
        ro = ", readonly" if self._readonly else ""
        return f"Descriptor({self}{ro})"


def _described_object(data: Any) -> Any:
    """What the reference keeps as a descriptor's ``_data_ref``: the array
    of an ``(array, device)`` tuple, the ``ref`` of a raw tuple (or None),
    else the object itself."""
    if type(data) is tuple:
        if 2 <= len(data) <= 4 and _int_arg(data[0]) is not None and _int_arg(data[1]) is not None:
            return data[3] if len(data) == 4 else None
        return data[0]
    return data


class SerializedDescriptor:
    """One descriptor's device, address and size, as the reference's
    ``SerializedDescriptor`` (a frozen pydantic model there; a plain frozen
    class here, usable as a field of a pydantic v2 model all the same).

    Fields, keyword only: ``device`` (a string such as ``"cpu"`` or
    ``"cuda:0"``, or a :class:`Device`; kept as a stripped, lower-cased
    string), ``ptr`` (an address) and ``size`` (bytes). Each is checked by
    the classmethod the reference names: :meth:`validate_device`,
    :meth:`validate_ptr` and :meth:`validate_size`.

    The items of :attr:`RdmaMetadata.descriptors` are
    ``SerializedDescriptor`` objects, as in the reference, with ``ptr`` 0: a
    null ``ptr`` is accepted here, whatever the size. Ferry's
    :class:`RdmaMetadata` carries no addresses (a remote's address is of no
    use to this process; the capability in ``nixl_metadata`` authorizes the
    transfer), and callers that rebuild metadata from its parts
    (``SerializedDescriptor(ptr=d.ptr, size=d.size, device=d.device)``) must
    be able to. :meth:`to_descriptor` of such a one gives a
    :class:`Descriptor` that names no memory (``ptr`` 0, the size and
    device): it can be read (``size``, ``device``), never moved, nor
    registered (``ValueError``). A ``SerializedDescriptor`` with an address
    describes local memory, e.g. :attr:`Descriptor.metadata`.
    """

    __slots__ = ("_device", "_ptr", "_size")

    def __init__(self, *, device: Union[str, Device] = "cpu", ptr: int = 0, size: int = 0) -> None:
        self._device: str = type(self).validate_device(device)
        self._ptr: int = type(self).validate_ptr(ptr)
        self._size: int = type(self).validate_size(size)

    # ---- the reference's validators ----

    @classmethod
    def validate_device(cls, v: Union[str, Device]) -> str:
        """``v`` as a device string, stripped and lower-cased (a
        :class:`Device` gives its string); ``TypeError`` if it is not a
        string or a ``Device``, ``ValueError`` if it names no device."""
        if type(v) is Device:
            return str(v)
        if not isinstance(v, str):
            raise TypeError(f"device must be a str such as 'cpu' or 'cuda:0', not {type(v).__name__}")
        device = str.lower(str.strip(v))
        _parse_device(device)
        return device

    @classmethod
    def validate_ptr(cls, v: int) -> int:
        """``v`` as a plain int; ``TypeError`` if it is not an int,
        ``ValueError`` if it is not a 64-bit address. 0 (null) is accepted:
        Ferry's metadata carries no addresses (see the class);
        :meth:`to_descriptor` refuses a null ``ptr`` with a size."""
        p = _int_arg(v)
        if p is None:
            raise TypeError(f"ptr must be an int, not {type(v).__name__}")
        if not 0 <= p < 1 << 64:
            raise ValueError(f"ptr {p} is not an address")
        return p

    @classmethod
    def validate_size(cls, v: int) -> int:
        """``v`` as a plain int; ``TypeError`` if it is not an int,
        ``ValueError`` if it is negative (or 2**64 or more)."""
        n = _int_arg(v)
        if n is None:
            raise TypeError(f"size must be an int, not {type(v).__name__}")
        if not 0 <= n < 1 << 64:
            raise ValueError(f"size must be >= 0 (got {n})")
        return n

    @property
    def device(self) -> str:
        """The device, e.g. ``"cpu"`` or ``"cuda:0"``."""
        return self._device

    @property
    def ptr(self) -> int:
        """The address of the first byte."""
        return self._ptr

    @property
    def size(self) -> int:
        """The length in bytes."""
        return self._size

    def to_descriptor(self) -> Descriptor:
        """A :class:`Descriptor` of this memory: the raw
        ``(ptr, size, device, None)`` form, the caller's promise that the
        memory is this process's and stays valid (nothing keeps it alive).

        With a null ``ptr`` and a size (the descriptors of Ferry's
        :class:`RdmaMetadata`, which have no address), a descriptor that
        names no memory: its ``ptr`` is 0, its ``size`` and ``device`` these
        ones, and an operation or a registration over it raises
        ``ValueError`` (read or write the remote's memory with an operation
        on the metadata instead)."""
        if self._ptr == 0 and self._size > 0:
            return _addressless(self._device, self._size)
        return Descriptor((self._ptr, self._size, self._device, None))

    # ---- pydantic's names ----

    def model_dump(self, *, mode: str = "python") -> Dict[str, Any]:
        """``{"device": ..., "ptr": ..., "size": ...}``."""
        _check_mode(mode)
        return {"device": self._device, "ptr": self._ptr, "size": self._size}

    def model_dump_json(self, *, indent: Optional[int] = None) -> str:
        """:meth:`model_dump` as JSON."""
        return json.dumps(self.model_dump(), indent=indent)

    @classmethod
    def model_validate(cls, obj: Any) -> SerializedDescriptor:
        """From a ``SerializedDescriptor`` or the dict :meth:`model_dump`
        gives (unknown keys are refused). A bad dict raises ``ValueError``;
        an argument that is not a dict, ``TypeError``."""
        if isinstance(obj, SerializedDescriptor):
            return obj
        if not isinstance(obj, dict):
            raise TypeError(f"model_validate takes a dict, not {type(obj).__name__}")
        unknown = sorted(str(k)[:64] for k in obj if k not in ("device", "ptr", "size"))
        if unknown:
            raise ValueError(
                f"SerializedDescriptor has no field {', '.join(map(repr, unknown[:8]))}: "
                "its fields are device, ptr and size"
            )
        try:
            return cls(**obj)
        except TypeError as e:
            # A field of the wrong type: the dict is a bad document.
            raise ValueError(str(e)) from None

    @classmethod
    def model_validate_json(cls, json_data: Union[str, bytes, bytearray]) -> SerializedDescriptor:
        """From the JSON :meth:`model_dump_json` gives; ``ValueError`` if it
        is bad, however it is bad."""
        if not isinstance(json_data, (str, bytes, bytearray)):
            raise TypeError(
                f"model_validate_json takes str, bytes or bytearray, not {type(json_data).__name__}"
            )
        obj = _json_document(json_data, "SerializedDescriptor")
        if not isinstance(obj, dict):
            raise ValueError(f"SerializedDescriptor JSON must be an object, not {type(obj).__name__}")
        return cls.model_validate(obj)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema_for(cls, cls.model_validate, cls.model_dump)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Dict[str, Any]:
        return json_schema_for(
            cls,
            schema,
            handler,
            {
                "properties": {
                    "device": {"type": "string", "default": "cpu"},
                    "ptr": {"type": "integer", "default": 0},
                    "size": {"type": "integer", "default": 0},
                },
                "additionalProperties": False,
            },
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SerializedDescriptor):
            return NotImplemented
        return (self._device, self._ptr, self._size) == (other._device, other._ptr, other._size)

    def __hash__(self) -> int:
        return hash((SerializedDescriptor, self._device, self._ptr, self._size))

    def __reduce__(self) -> Any:
        return (_serialized_descriptor, (self._device, self._ptr, self._size))

    def __repr__(self) -> str:
        return f"SerializedDescriptor(device={self._device!r}, ptr={self._ptr}, size={self._size})"


def _serialized_descriptor(device: str, ptr: int, size: int) -> SerializedDescriptor:
    return SerializedDescriptor(device=device, ptr=ptr, size=size)


def _remote_serialized(device: str, size: int) -> SerializedDescriptor:
    """An item of :attr:`RdmaMetadata.descriptors`: `device` as metadata
    writes it (the compiled core checked it when the metadata was parsed),
    no address."""
    s = SerializedDescriptor.__new__(SerializedDescriptor)
    s._device, s._ptr, s._size = device, 0, size
    return s


def _remote_descriptor(device: str, size: int) -> Descriptor:
    """An item of :meth:`RdmaMetadata.to_descriptors`: a descriptor of a
    remote's memory, which names no local memory."""
    return _addressless(device, size)


def _addressless(device: str, size: int) -> Descriptor:
    """A :class:`Descriptor` with a null ``ptr`` and `size`: it can be read,
    not moved (``_raw`` refuses it) nor registered (a null pointer)."""
    d = Descriptor((0, 0, device, None))
    d._size = d._capacity = size
    d._core_args = (0, size, str(d._device), not d._readonly, None)
    return d


def _json_document(json_data: Union[str, bytes, bytearray], what: str) -> Any:
    """`json_data` parsed; ``ValueError`` for any bad JSON, nesting too deep
    for the parser included (which raises ``RecursionError``)."""
    try:
        return json.loads(json_data)
    except RecursionError:
        raise ValueError(f"not valid {what} JSON: nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"not valid {what} JSON: {e}") from None


def _check_mode(mode: str) -> None:
    """pydantic's ``mode`` argument: the dict is made of JSON values either way."""
    if mode not in ("python", "json"):
        raise ValueError(f"mode must be 'python' or 'json', not {mode!r}")


def _describe(data: Any) -> _Described:
    """``(ptr, size, device, readonly, ref)`` of `data`.

    Types are told by ``type(data)``, never by ``isinstance``, which an
    object's ``__class__`` attribute can fool.
    """
    cls = type(data)
    if issubclass(cls, bytes):
        # The address and length of the object's own storage, read in C:
        # not len(), which a subclass can redefine.
        ptr, size = _ferry.bytes_address(data)
        return ptr, size, CPU, True, data
    if cls is tuple:
        return _describe_tuple(data)
    if issubclass(cls, tuple):
        raise TypeError(
            f"{_TYPE_MESSAGE}; got a {cls.__name__}, a subclass of tuple: pass a plain tuple"
        )
    torch = _torch()
    if torch is not None and issubclass(cls, torch.Tensor):
        return _describe_tensor(torch, data)
    try:
        view = memoryview(data)
    except (TypeError, ValueError, BufferError) as e:
        # No host buffer: CUDA memory, if the object says so.
        iface = _cuda_array_interface(data)
        if iface is not None:
            device = _cuda_array_device(data)
            if device is None:
                device = _cuda_pointer_device(iface)
            return _describe_cuda_array(data, iface, CUDA0 if device is None else device)
        raise TypeError(
            f"{_TYPE_MESSAGE}; got {cls.__name__}, which does not export its memory as a "
            f"buffer ({e})"
        ) from None
    return _describe_buffer(data, view)


def _device_arg(d: Any) -> Device:
    if type(d) is Device or isinstance(d, str):
        return Device(d)
    raise TypeError(f"a device must be a ferry.Device or a string such as 'cpu', not {type(d).__name__}")


def _int_arg(x: Any) -> Optional[int]:
    """`x` as a plain int if it is an int (not a bool), else None."""
    if isinstance(x, int) and not isinstance(x, bool):
        # The value in C, whatever an int subclass's methods say.
        return int.__index__(x)
    return None


def _describe_tuple(data: Tuple[Any, ...]) -> _Described:
    if 2 <= len(data) <= 4:
        ptr, size = _int_arg(data[0]), _int_arg(data[1])
        if ptr is not None and size is not None:
            # (ptr, size[, device[, ref]]): raw memory, the caller's promise.
            device = _device_arg(data[2]) if len(data) >= 3 else CPU
            ref = data[3] if len(data) == 4 else None
            if ptr < 0 or size < 0:
                raise ValueError(f"ptr and size must be >= 0 (got {ptr}, {size})")
            if ptr == 0 and size > 0:
                raise ValueError("ptr is null")
            return ptr, size, device, False, ref
    if len(data) == 2 and (type(data[1]) is Device or isinstance(data[1], str)):
        array, device = data[0], _device_arg(data[1])
        torch = _torch()
        is_tensor = torch is not None and issubclass(type(array), torch.Tensor)
        if device.kind == DeviceKind.CUDA and not is_tensor:
            iface = _cuda_array_interface(array)
            if iface is not None:
                says = _cuda_array_device(array)
                if says is not None and says != device:
                    raise ValueError(f"the array is on {says} (its device.id), not on {device}")
                return _describe_cuda_array(array, iface, device)
        ptr, size, found, readonly, ref = _describe(array)
        if found != device:
            where = "host memory" if found == CPU else f"on {found}"
            raise ValueError(f"the memory is {where}, not on {device}")
        return ptr, size, device, readonly, ref
    raise TypeError(f"{_TYPE_MESSAGE}; got a tuple of {len(data)} that is neither")


# ---- torch ----


def _torch() -> Any:
    """The torch module if the program imported it (a tensor cannot exist
    otherwise), else None. Never imports it: that takes seconds."""
    return sys.modules.get("torch")


def _describe_tensor(torch: Any, t: Any) -> _Described:
    """A tensor whose type is exactly ``torch.Tensor`` or
    ``torch.nn.Parameter``, read through torch's own C methods, called on
    the class: an attribute set on the instance is not consulted, and these
    two types do not reroute the calls through ``__torch_function__``.

    Other subclasses are refused: their methods, or their
    ``__torch_function__``, can answer anything.
    """
    tensor = torch.Tensor
    cls = type(t)
    if cls is not tensor and cls is not torch.nn.Parameter:
        raise TypeError(
            f"{cls.__name__} is a subclass of torch.Tensor, which can redefine a tensor's "
            "address and size: only torch.Tensor and torch.nn.Parameter are taken; pass "
            "tensor.as_subclass(torch.Tensor) (the same memory)"
        )
    layout = tensor.layout.__get__(t)
    if layout is not torch.strided:
        raise ValueError(f"the tensor's layout is {layout}: only dense (strided) tensors can be moved")
    if not tensor.is_contiguous(t):
        raise ValueError("the tensor is not contiguous: pass tensor.contiguous() (a copy)")
    if tensor.is_conj(t) or tensor.is_neg(t):
        raise ValueError(
            "the tensor is a lazily conjugated or negated view, whose memory holds other "
            "values: pass tensor.resolve_conj().resolve_neg()"
        )
    device = _tensor_device(tensor.device.__get__(t))
    size = int(tensor.numel(t)) * int(tensor.element_size(t))
    # The storage too: it outlives `t.data = other` or `t.set_(...)`.
    storage = tensor.untyped_storage(t)
    return int(tensor.data_ptr(t)), size, device, False, (t, storage)


def _tensor_device(d: Any) -> Device:
    """The :class:`Device` of a ``torch.device``."""
    if d.type == "cpu":
        return CPU
    if d.type in ("cuda", "xpu"):
        kind = DeviceKind.CUDA if d.type == "cuda" else DeviceKind.XPU
        return Device((kind, 0 if d.index is None else int(d.index)))
    raise ValueError(f"tensors on {d} are not supported: only cpu, cuda and xpu")


# ---- buffers ----


def _holds_objects(fmt: str) -> bool:
    """Whether a buffer's struct format has Python objects ('O') in it,
    leaving out the names of a structure's fields (``T{<d:name:}``)."""
    return "O" in re.sub(r":[^:]*:", "", fmt)


def _numpy(what: str) -> Any:
    try:
        import numpy
    except ImportError:
        raise TypeError(f"{what} needs NumPy to be described: install numpy") from None
    return numpy


def _describe_buffer(data: Any, view: memoryview) -> _Described:
    """The memory a buffer export says: address, size and the export itself
    come from one `Py_buffer`, which the descriptor keeps (so the memory can
    be neither resized nor freed)."""
    if _holds_objects(view.format):
        raise TypeError(
            f"the buffer holds Python objects (format {view.format!r}): their bytes are "
            "addresses, which must neither leave the process nor be overwritten"
        )
    if not view.c_contiguous:
        if not view.f_contiguous:
            raise ValueError("the buffer is not contiguous: pass a contiguous copy")
        # Fortran order: the same bytes, seen in C order through NumPy.
        numpy = _numpy("a Fortran-order buffer")
        try:
            view = memoryview(numpy.asarray(view).T)
        except (TypeError, ValueError, BufferError) as e:
            raise ValueError(f"cannot describe this Fortran-order buffer: {e}") from None
        if not view.c_contiguous:
            raise ValueError("the buffer is not contiguous: pass a contiguous copy")
    size = view.nbytes
    if view.readonly:
        owner = view.obj
        if type(owner) is bytes:
            ptr, length = _ferry.bytes_address(owner)
            if length == size:  # the whole of it
                return ptr, size, CPU, True, (data, view)
        # A read-only buffer does not export a writable pointer; NumPy can
        # tell its address without copying.
        numpy = _numpy("a read-only buffer other than bytes (or pass bytes(buffer))")
        array = numpy.frombuffer(view, dtype=numpy.uint8)
        if array.nbytes != size:
            raise ValueError(f"cannot describe this buffer: {array.nbytes} bytes seen of {size}")
        return int(array.ctypes.data), size, CPU, True, (data, array)
    try:
        # Exports the buffer for as long as `pinned` lives: the memory can
        # then be neither resized nor freed.
        pinned = (ctypes.c_char * size).from_buffer(view)
    except (TypeError, ValueError, BufferError) as e:
        raise ValueError(f"cannot describe this buffer: {e}") from None
    return ctypes.addressof(pinned), size, CPU, False, (data, pinned)
