""":class:`RdmaMetadata`: what a readable or writable hands to its remote."""

from __future__ import annotations

import json
import string
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple, TypeVar, Union

from . import _ferry
from ._pydantic import core_schema_for, json_schema_for
from ._descriptor import (
    Descriptor,
    SerializedDescriptor,
    _check_mode,
    _json_document,
    _remote_descriptor,
    _remote_serialized,
)
from ._sequence import DescriptorSequence
from ._types import Device, OperationKind

__all__ = ["RdmaMetadata", "DescriptorInfo", "ForeignMetadataError"]


class ForeignMetadataError(ValueError):
    """Metadata that Ferry did not write: typically the reference's
    (``dynamo.nixl_connect``), whose ``nixl_metadata`` is a NIXL agent's
    metadata. Ferry does not speak NIXL: both workers must use Ferry."""


class DescriptorInfo(NamedTuple):
    """A remote descriptor's device and size, as earlier versions of Ferry
    described the items of :attr:`RdmaMetadata.descriptors` (which are now
    :class:`SerializedDescriptor` objects, as in the reference).
    ``RdmaMetadata(descriptors=...)`` still takes them. The tuple is
    ``(device, size)``; its :attr:`ptr` is 0.
    """

    device: Device
    size: int

    @property
    def ptr(self) -> int:
        """0, always: Ferry does not share addresses (see the class)."""
        return 0


# The reference's fields (its RdmaMetadata is a pydantic model of these).
_REFERENCE_FIELDS = ("descriptors", "nixl_metadata", "notification_key", "operation_kind")

_WHAT_TO_DO = (
    "Ferry does not speak NIXL and cannot reach a NIXL agent: both workers must use Ferry. "
    "Create the ReadableOperation or WritableOperation with ferry on the remote worker and "
    "send its op.metadata() (model_dump() or model_dump_json()), or build RdmaMetadata from "
    "that metadata's nixl_metadata"
)

_HEX = frozenset(string.hexdigits + string.whitespace)


class RdmaMetadata:
    """What a :class:`ReadableOperation` or :class:`WritableOperation` hands
    to its remote worker, through any side channel, so that the remote can
    start the paired :class:`ReadOperation` or :class:`WriteOperation`.

    It is a capability: whoever holds it may read (or write) the described
    bytes of that one operation until it ends. Its ``repr`` hides the token;
    treat its JSON like a password.

    What it costs follows the bytes of its JSON: a paged descriptor's
    blocks are one entry of the metadata, and :attr:`descriptors` keeps
    them as that entry (a :class:`DescriptorSequence`), however many blocks
    it describes.

    Get it from ``op.metadata()``; move it as JSON with
    :meth:`model_dump_json` / :meth:`model_validate_json` (pydantic's names)
    or :meth:`to_json` / :meth:`from_json`, or as a dict with
    :meth:`model_dump` / :meth:`model_validate`. It can be a field of a
    pydantic v2 model (``Optional[RdmaMetadata]``), without
    ``arbitrary_types_allowed``; the model then dumps and validates it as
    that dict. Bad metadata (JSON, or a dict given to
    :meth:`model_validate`), however it is bad, raises ``ValueError``
    (:class:`ForeignMetadataError`, a subclass, for the reference's NIXL
    metadata); an argument of the wrong type (not text, not a dict) raises
    ``TypeError``.

    ``RdmaMetadata(**fields)`` takes the fields of :meth:`model_dump`, or the
    reference's: ``descriptors``, ``nixl_metadata``, ``notification_key``,
    ``operation_kind``. Then ``nixl_metadata`` must be Ferry's metadata (the
    :attr:`nixl_metadata` of metadata Ferry wrote); a NIXL agent's metadata
    raises :class:`ForeignMetadataError`.
    """

    __slots__ = ("_core", "_descriptors")
    _core: _ferry.Metadata
    # Made when first asked for (from the runs: the core is immutable).
    _descriptors: Optional[DescriptorSequence[SerializedDescriptor]]

    def __init__(self, **fields: Any) -> None:
        self._core = _core_from_fields(fields)
        self._descriptors = None

    @classmethod
    def _wrap(cls, core: _ferry.Metadata) -> RdmaMetadata:
        m = cls.__new__(cls)
        m._core = core
        m._descriptors = None
        return m

    # ---- JSON ----

    @classmethod
    def from_json(cls, json_data: Union[str, bytes, bytearray]) -> RdmaMetadata:
        """Parses and validates metadata JSON; ``ValueError`` if it is bad
        (:class:`ForeignMetadataError` if it is the reference's)."""
        try:
            return cls._wrap(_ferry.Metadata.from_json(json_data))
        except ValueError:
            fields = _reference_json(json_data)
            if fields is None:
                raise
        return cls._wrap(_as_document(_core_from_reference, fields))

    def to_json(self) -> str:
        """The JSON to hand to the remote worker (a few hundred bytes)."""
        return self._core.to_json()

    @classmethod
    def model_validate_json(cls, json_data: Union[str, bytes, bytearray]) -> RdmaMetadata:
        """pydantic's name for :meth:`from_json`."""
        return cls.from_json(json_data)

    def model_dump_json(self, *, indent: Optional[int] = None) -> str:
        """pydantic's name for :meth:`to_json`."""
        text = self._core.to_json()
        return text if indent is None else json.dumps(json.loads(text), indent=indent)

    @classmethod
    def model_validate(cls, obj: Union[RdmaMetadata, Dict[str, Any]]) -> RdmaMetadata:
        """Metadata from the dictionary :meth:`model_dump` gives (or from the
        reference's fields, see the class)."""
        if isinstance(obj, RdmaMetadata):
            return obj
        if not isinstance(obj, dict):
            raise TypeError(f"model_validate takes a dict, not {type(obj).__name__}")
        return cls._wrap(_as_document(_core_from_fields, obj))

    def model_dump(self, *, mode: str = "python") -> Dict[str, Any]:
        """The metadata as a dictionary of JSON values (``mode`` is
        accepted for pydantic's sake: the result is the same)."""
        _check_mode(mode)
        result: Dict[str, Any] = json.loads(self._core.to_json())
        return result

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema_for(cls, cls.model_validate, cls.model_dump)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Dict[str, Any]:
        return json_schema_for(
            cls, schema, handler, {"description": "Ferry's RdmaMetadata (RdmaMetadata.model_dump())"}
        )

    # ---- the reference's validator ----

    @classmethod
    def validate_operation_kind(cls, v: int) -> int:
        """``v`` as a plain int if it is an :class:`OperationKind` an
        operation can have (1 READ, 2 WRITE); else ``TypeError``, as the
        reference raises. ``RdmaMetadata(operation_kind=...)`` checks it so,
        then that it matches the metadata in ``nixl_metadata``."""
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"operation_kind must be an int, not {type(v).__name__}")
        kind = int.__index__(v)
        if kind not in (OperationKind.READ, OperationKind.WRITE):
            raise TypeError(
                f"operation_kind must be an integer value of OperationKind: "
                f"{int(OperationKind.READ)} (READ) or {int(OperationKind.WRITE)} (WRITE), not {kind}"
            )
        return kind

    # ---- what it describes ----

    @property
    def operation_kind(self) -> OperationKind:
        """READ for a readable's metadata, WRITE for a writable's."""
        return OperationKind(self._core.operation_kind)

    @property
    def worker_id(self) -> str:
        """The id of the worker that exposes the memory."""
        return self._core.worker_id

    @property
    def hostname(self) -> str:
        """The host name of that worker."""
        return self._core.hostname

    @property
    def descriptors(self) -> DescriptorSequence[SerializedDescriptor]:
        """The exposed descriptors, as the reference's field: a
        :class:`SerializedDescriptor` each (``device`` a string such as
        ``"cpu"`` or ``"cuda:0"``, ``size``, ``model_dump()``,
        ``to_descriptor()``), whose ``ptr`` is 0: Ferry's metadata carries
        no addresses. Each block of a :class:`PagedDescriptor` counts as
        one.

        A :class:`DescriptorSequence`, which reads as a list (``len``,
        indexing, slicing, iteration, ``==`` with a list) but keeps the
        metadata's runs: its length and any item cost a step per run of
        the metadata, not per block. Code that visits every item pays per
        block; :attr:`descriptor_runs` and :attr:`descriptor_count` never
        do."""
        descriptors = self._descriptors
        if descriptors is None:
            descriptors = DescriptorSequence(self._core.descriptor_runs, _remote_serialized)
            self._descriptors = descriptors
        return descriptors

    @property
    def descriptor_runs(self) -> List[Tuple[SerializedDescriptor, int]]:
        """The exposed descriptors as the metadata lists them: runs of
        ``(SerializedDescriptor, count)``, one per descriptor, or per paged
        descriptor (its block size, and how many blocks); neighbours of
        one device and size are one run."""
        return self.descriptors.runs

    @property
    def descriptor_count(self) -> int:
        """How many descriptors are exposed (each block of a paged one
        counting as one): ``len(descriptors)``, without listing them."""
        return self._core.descriptor_count

    @property
    def total_size(self) -> int:
        """The sum of the descriptors' sizes."""
        return self._core.total_size

    @property
    def nixl_metadata(self) -> str:
        """The reference's name for what a remote needs to reach the
        exposing worker; in Ferry, the metadata's own JSON (no NIXL is
        involved). ``RdmaMetadata(nixl_metadata=m.nixl_metadata)`` is
        ``m``."""
        return self._core.to_json()

    @property
    def notification_key(self) -> str:
        """Names the operation (``"<worker_id>:<operation number>"``); not
        secret. Ferry's completion notices are part of its protocol, so the
        key plays no other part."""
        return f"{self._core.worker_id}:{self.model_dump()['operation_id']}"

    def to_descriptors(self) -> Union[Descriptor, DescriptorSequence[Descriptor]]:
        """What the remote descriptors are, as the reference gives them:
        one :class:`Descriptor` if there is one, else a sequence of them
        (a :class:`DescriptorSequence`, as :attr:`descriptors` is). Each is
        ``d.to_descriptor()`` of an item of :attr:`descriptors`: the
        remote's device and size, and ``ptr`` 0 (Ferry's metadata carries no
        addresses), so it names no memory of this process: an operation or
        a registration over it raises ``ValueError``."""
        descriptors = self.descriptors
        if len(descriptors) == 1:
            return descriptors[0].to_descriptor()
        return DescriptorSequence(descriptors._runs, _remote_descriptor)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RdmaMetadata):
            return NotImplemented
        return self._core.to_json() == other._core.to_json()

    def __hash__(self) -> int:
        return hash(self._core.to_json())

    def __reduce__(self) -> Any:
        return (RdmaMetadata.from_json, (self._core.to_json(),))

    def __repr__(self) -> str:
        # Never the token, nor the addresses.
        return (
            f"RdmaMetadata(operation_kind={self.operation_kind}, worker_id={self.worker_id!r}, "
            f"hostname={self.hostname!r}, descriptors={self._core.descriptor_count}, "
            f"total_size={self.total_size})"
        )


T = TypeVar("T")


def _as_document(parse: Callable[[Dict[str, Any]], T], fields: Dict[str, Any]) -> T:
    """``parse(fields)`` where `fields` is a document (parsed JSON, or a dict
    given to ``model_validate``): a field of the wrong type makes the
    document bad, a ``ValueError``, not a ``TypeError``."""
    try:
        return parse(fields)
    except TypeError as e:
        raise ValueError(str(e)) from None


def _core_from_fields(fields: Dict[str, Any]) -> _ferry.Metadata:
    """Metadata from Ferry's fields (those of ``model_dump()``) or the
    reference's."""
    if not fields:
        raise TypeError(
            "RdmaMetadata comes from op.metadata(), RdmaMetadata.model_validate_json(json) "
            "or RdmaMetadata.model_validate(dict), not from no fields"
        )
    if "nixl_metadata" in fields or "notification_key" in fields:
        return _core_from_reference(fields)
    try:
        text = json.dumps(fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"metadata fields must be JSON values: {e}") from None
    except RecursionError:
        raise ValueError("metadata fields must be JSON values: nested too deeply") from None
    return _ferry.Metadata.from_json(text)


def _reference_json(json_data: Any) -> Optional[Dict[str, Any]]:
    """The fields of `json_data` if it is a JSON object with the reference's
    fields, else None."""
    if not isinstance(json_data, (str, bytes, bytearray)) or len(json_data) > 4 << 20:
        return None
    try:
        obj = json.loads(json_data)
    except (ValueError, RecursionError):
        # Not JSON, or nested deeper than the parser goes: not the
        # reference's either (the caller raises Ferry's ValueError).
        return None
    if isinstance(obj, dict) and ("nixl_metadata" in obj or "notification_key" in obj):
        return obj
    return None


def _core_from_reference(fields: Dict[str, Any]) -> _ferry.Metadata:
    """Metadata from the reference's four fields, whose ``nixl_metadata``
    must be Ferry's metadata; the others must agree with it."""
    unknown = sorted(str(k) for k in fields if k not in _REFERENCE_FIELDS)
    if unknown:
        raise ValueError(
            f"RdmaMetadata got the reference's fields and also {', '.join(map(repr, unknown))}: "
            "give either the fields of model_dump() or the reference's "
            "(descriptors, nixl_metadata, notification_key, operation_kind)"
        )
    key = fields.get("notification_key", "")
    if not isinstance(key, str):
        raise TypeError(f"notification_key must be a str, not {type(key).__name__}")
    core = _ferry_core(fields.get("nixl_metadata"))

    kind = fields.get("operation_kind")
    if kind is not None:
        kind = RdmaMetadata.validate_operation_kind(kind)
        if kind != core.operation_kind:
            raise ValueError(
                f"operation_kind {int(kind)} does not match the metadata in nixl_metadata, which is "
                f"a {OperationKind(core.operation_kind)} ({core.operation_kind})"
            )

    given = fields.get("descriptors")
    if given is not None:
        found = _given_runs(given)
        if found:
            # Compared as runs: a paged descriptor's blocks are one entry.
            expected = _runs((Device(d), size, n) for d, size, n in core.descriptor_runs)
            if found != expected:
                raise ValueError(
                    f"descriptors {_run_sizes(found)} do not match the metadata in nixl_metadata, "
                    f"which exposes {_run_sizes(expected)}"
                )
    return core


def _given_runs(given: Any) -> List[Tuple[Device, int, int]]:
    """The runs of the reference's ``descriptors`` field: a list or tuple
    of descriptors, a step per item, or a :class:`DescriptorSequence`
    (``metadata.descriptors``), a step per run."""
    if isinstance(given, DescriptorSequence):
        return _runs(
            (*_device_and_size(i, item), n) for i, (item, n) in enumerate(given.runs)
        )
    if not isinstance(given, (list, tuple)):
        raise TypeError(f"descriptors must be a list, not {type(given).__name__}")
    return _runs((*_device_and_size(i, d), 1) for i, d in enumerate(given))


def _ferry_core(nixl_metadata: Any) -> _ferry.Metadata:
    """Ferry's metadata in a reference ``nixl_metadata`` field."""
    if nixl_metadata is None or (isinstance(nixl_metadata, str) and not nixl_metadata.strip()):
        raise ValueError(
            "RdmaMetadata needs nixl_metadata: Ferry's metadata, as RdmaMetadata.nixl_metadata "
            "(or to_json()) gives it"
        )
    if isinstance(nixl_metadata, (bytes, bytearray)):
        try:
            nixl_metadata = bytes(nixl_metadata).decode("utf-8")
        except UnicodeDecodeError:
            raise ForeignMetadataError(
                f"nixl_metadata is binary: a NIXL agent's metadata, not Ferry's. {_WHAT_TO_DO}"
            ) from None
    if not isinstance(nixl_metadata, str):
        raise TypeError(f"nixl_metadata must be a str, not {type(nixl_metadata).__name__}")
    text = nixl_metadata.strip()
    if text.startswith("b64:") or set(text) <= _HEX:
        form = "base64" if text.startswith("b64:") else "hexadecimal"
        raise ForeignMetadataError(
            f"nixl_metadata holds a NIXL agent's metadata ({form}, as dynamo.nixl_connect writes "
            f"it), not Ferry's. {_WHAT_TO_DO}"
        )
    if not text.startswith("{"):
        raise ForeignMetadataError(f"nixl_metadata is not Ferry's metadata. {_WHAT_TO_DO}")
    try:
        return _ferry.Metadata.from_json(text)
    except ValueError as e:
        try:
            obj = _json_document(text, "metadata")
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "version" in obj and "token" in obj:
            raise  # Ferry's, but bad: Ferry's own message says why
        raise ForeignMetadataError(
            f"nixl_metadata is not Ferry's metadata ({e}). {_WHAT_TO_DO}"
        ) from None


def _device_and_size(index: int, d: Any) -> Tuple[Device, int]:
    """``(Device, size)`` of a descriptor given in the reference's fields: a
    SerializedDescriptor, its dict, or a DescriptorInfo."""
    if isinstance(d, dict):
        d = SerializedDescriptor.model_validate(d)
    if isinstance(d, (SerializedDescriptor, DescriptorInfo)):
        return (Device(d.device), d.size)
    raise TypeError(
        f"descriptors[{index}] must be a SerializedDescriptor (or its dict), not {type(d).__name__}"
    )


def _runs(items: Iterable[Tuple[Device, int, int]]) -> List[Tuple[Device, int, int]]:
    """``(device, size, count)`` items as runs of equal ``(device, size)``."""
    out: List[Tuple[Device, int, int]] = []
    for device, size, n in items:
        if out and out[-1][0] == device and out[-1][1] == size:
            out[-1] = (device, size, out[-1][2] + n)
        else:
            out.append((device, size, n))
    return out


# An error message names this many runs at most.
_MESSAGE_RUNS = 8


def _run_sizes(runs: List[Tuple[Device, int, int]]) -> str:
    shown = ", ".join(
        f"{size} bytes on {device}" + ("" if n == 1 else f" x {n}")
        for device, size, n in runs[:_MESSAGE_RUNS]
    )
    more = f", ... ({len(runs)} runs)" if len(runs) > _MESSAGE_RUNS else ""
    return f"[{shown}{more}]"
