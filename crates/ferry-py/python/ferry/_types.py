"""The enums and :class:`Device` (descriptors are in ``_descriptor.py``)."""

from __future__ import annotations

import re
from enum import IntEnum
from typing import Tuple, Union

__all__ = [
    "DeviceKind",
    "OperationKind",
    "OperationStatus",
    "Device",
]


class DeviceKind(IntEnum):
    """The kind of memory a :class:`Device` names (the reference's numbers)."""

    UNSPECIFIED = 0
    HOST = 1
    """System (CPU) memory."""
    CUDA = 2
    """CUDA device (GPU) memory."""
    XPU = 3
    """Intel XPU (Level Zero) device memory: it can be named and described,
    but this version of Ferry refuses to move it."""

    def __str__(self) -> str:
        return _DEVICE_KIND_NAMES.get(self.value, "<invalid>")

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    @property
    def nixl_mem_type(self) -> str:
        """NIXL's name for this kind of memory: ``"DRAM"`` for host memory,
        ``"VRAM"`` otherwise (as in the reference). Ferry itself does not
        use it."""
        return "DRAM" if self is DeviceKind.HOST else "VRAM"


_DEVICE_KIND_NAMES = {1: "cpu", 2: "cuda", 3: "xpu"}


class OperationKind(IntEnum):
    """What a readable or writable lets its remote do: 1 READ, 2 WRITE."""

    UNSPECIFIED = 0
    READ = 1
    WRITE = 2

    def __str__(self) -> str:
        return "<invalid>" if self is OperationKind.UNSPECIFIED else self.name

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class OperationStatus(IntEnum):
    """The state of an operation (the reference's six states and numbers).

    ``str()`` gives the reference's short names: ``INIT``, ``PROC``,
    ``DONE``, ``STOP``, ``ERR`` (and ``<invalid>`` for UNINITIALIZED);
    ``.name`` gives the member's name.
    """

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
        return _STATUS_NAMES.get(self.value, "<invalid>")

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


_STATUS_NAMES = {1: "INIT", 2: "PROC", 3: "DONE", 4: "STOP", 5: "ERR"}


# What Device takes (after surrounding spaces are stripped, in any case):
# the reference's names, each with an optional ":N".
_DEVICE_STRING = re.compile(r"(cpu|host|cuda|gpu|xpu)(?:\s*:\s*([0-9]{1,9}))?")
_DEVICE_NAME_KINDS = {
    "cpu": DeviceKind.HOST,
    "host": DeviceKind.HOST,
    "cuda": DeviceKind.CUDA,
    "gpu": DeviceKind.CUDA,
    "xpu": DeviceKind.XPU,
}
_DEVICE_EXPECTED = "expected 'cpu' (or 'host'), 'cuda' or 'cuda:N' (or 'gpu:N'), or 'xpu:N'"


def _parse_device(text: str) -> Tuple[DeviceKind, int]:
    """``(kind, id)`` of a device string, read as the reference reads it
    (any case, surrounding spaces, ``gpu`` for ``cuda``, ``host`` for
    ``cpu``), without its leniency for trailing junk."""
    m = _DEVICE_STRING.fullmatch(text.strip().lower())
    if m is None:
        raise ValueError(f"invalid device {text[:64]!r}: {_DEVICE_EXPECTED}")
    kind = _DEVICE_NAME_KINDS[m.group(1)]
    ident = int(m.group(2) or 0)
    if kind == DeviceKind.HOST and ident != 0:
        raise ValueError(
            f"invalid device {text[:64]!r}: host memory has no device number "
            "(expected 'cpu' or 'cpu:0')"
        )
    return kind, ident


class Device:
    """Where memory lives: a string such as ``"cpu"``, ``"cuda"`` (=
    ``"cuda:0"``), ``"cuda:N"`` or ``"xpu:N"`` (any case, surrounding spaces
    allowed; ``"host"`` and ``"gpu:N"`` are synonyms), or a
    ``(DeviceKind, id)`` pair.

    This version of Ferry moves host memory only; descriptors on a CUDA or
    XPU device are refused (``ValueError``) when an operation is created.
    """

    __slots__ = ("_kind", "_id")

    def __init__(self, metadata: Union[str, Tuple[DeviceKind, int], Device]) -> None:
        if type(metadata) is Device:
            kind, ident = metadata._kind, metadata._id
        elif isinstance(metadata, str):
            kind, ident = _parse_device(metadata)
        elif isinstance(metadata, tuple) and len(metadata) == 2:
            k, ident = metadata
            if not isinstance(k, int) or isinstance(k, bool):
                raise TypeError(f"device kind must be a DeviceKind, not {type(k).__name__}")
            if k not in (DeviceKind.HOST, DeviceKind.CUDA, DeviceKind.XPU):
                raise ValueError(
                    f"device kind must be DeviceKind.HOST, DeviceKind.CUDA or DeviceKind.XPU, not {k!r}"
                )
            kind = DeviceKind(k)
            if not isinstance(ident, int) or isinstance(ident, bool):
                raise TypeError(f"device id must be an int, not {type(ident).__name__}")
            if ident < 0 or ident >= 1_000_000_000:
                raise ValueError(f"device id {ident} is out of range")
            if kind == DeviceKind.HOST and ident != 0:
                raise ValueError(f"host memory has no device number (got {ident})")
        else:
            raise TypeError(
                "Device takes 'cpu', 'cuda', 'cuda:N', 'xpu:N' or a (DeviceKind, id) pair, "
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
        return "cpu" if self._kind == DeviceKind.HOST else f"{self._kind}:{self._id}"

    def __repr__(self) -> str:
        return f"Device({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self._kind, self._id) == (other._kind, other._id)

    def __hash__(self) -> int:
        return hash((self._kind, self._id))


CPU = Device("cpu")
