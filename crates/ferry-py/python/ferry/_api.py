"""Connector, RdmaMetadata and the four operations."""

from __future__ import annotations

import weakref
from typing import (
    Any,
    Awaitable,
    Callable,
    ClassVar,
    Dict,
    Generator,
    Generic,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from . import _ferry
from ._metadata import DescriptorInfo, RdmaMetadata
from ._types import Descriptor, OperationKind, OperationStatus

__all__ = [
    "Connector",
    "RdmaMetadata",
    "DescriptorInfo",
    "ReadableOperation",
    "WritableOperation",
    "ReadOperation",
    "WriteOperation",
    "PendingOperation",
]

_STATUSES = tuple(OperationStatus)

_bridges: Any = weakref.WeakKeyDictionary()


def _bridge_for(loop: Any) -> _ferry.Bridge:
    """The mailbox through which results of Ferry's runtime reach `loop`
    (called by the compiled core). The loop watches its descriptor, so a
    result wakes the loop directly: no thread of ours takes the GIL."""
    try:
        return _bridges[loop]  # type: ignore[no-any-return]
    except KeyError:
        pass
    except TypeError:  # a loop that takes no weak reference: kept for good
        if id(loop) not in _bridges_kept:
            _bridges_kept[id(loop)] = (loop, _new_bridge(loop))
        return _bridges_kept[id(loop)][1]
    bridge = _new_bridge(loop)
    _bridges[loop] = bridge
    return bridge


_bridges_kept: Dict[int, Tuple[Any, _ferry.Bridge]] = {}


def _new_bridge(loop: Any) -> _ferry.Bridge:
    bridge = _ferry.Bridge()
    loop.add_reader(bridge.fileno(), bridge.drain)
    return bridge


Descriptors = Union[Descriptor, Sequence[Descriptor]]


class _Operation:
    """What the four operations share."""

    __slots__ = ("_op", "_descriptors", "_connector", "__weakref__")
    _kind: ClassVar[OperationKind]

    _op: _ferry.Operation
    _descriptors: List[Descriptor]
    _connector: Connector

    def __init__(self) -> None:
        raise TypeError(
            f"{type(self).__name__} is created by a Connector "
            "(create_readable, create_writable, begin_read, begin_write)"
        )

    @classmethod
    def _new(cls: Type[_Op], op: _ferry.Operation, descriptors: List[Descriptor], connector: Connector) -> _Op:
        self = cls.__new__(cls)
        self._op = op
        self._descriptors = descriptors
        self._connector = connector
        return self

    @property
    def status(self) -> OperationStatus:
        """The current state."""
        return _STATUSES[self._op.status()]

    @property
    def operation_kind(self) -> OperationKind:
        """READ for a readable or a read, WRITE for a writable or a write."""
        return self._kind

    @property
    def connector(self) -> Connector:
        """The connector that created the operation."""
        return self._connector

    @property
    def transport(self) -> Optional[str]:
        """The transport carrying the bytes (``"local"``, ``"cma"`` or ``"tcp"``), once known."""
        return self._op.transport()

    async def wait_for_completion(self, timeout: Optional[float] = None) -> None:
        """Waits until the operation ends. Returns when it completed; raises
        the cause otherwise: a :class:`FerryError` subclass when it failed or
        was cancelled (by either side), ``TimeoutError`` after `timeout`
        seconds (the operation goes on; cancel it to stop it).

        Woken by the operation's own notification, never by polling; the
        GIL is not held while waiting.
        """
        await self._op.wait(timeout)

    def cancel(self) -> None:
        """Cancels the operation unless it has ended; the remote is told.
        When this returns, Ferry no longer touches the memory."""
        self._op.cancel()

    def __enter__(self: _Op) -> _Op:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Cancels the operation if unfinished, withdraws what it exposes and
        # lets go of its memory.
        self._op.close()

    async def __aenter__(self: _Op) -> _Op:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._op.close()

    def __repr__(self) -> str:
        sizes = [d.size for d in self._descriptors]
        return f"{type(self).__name__}(status={self.status}, descriptors={sizes})"


_Op = TypeVar("_Op", bound=_Operation)


class _Passive(_Operation):
    __slots__ = ("_metadata",)

    def metadata(self, hex_encode: bool = False) -> RdmaMetadata:
        """The metadata to hand to the remote worker (`hex_encode` is
        accepted for compatibility and ignored: the metadata is JSON)."""
        try:
            return self._metadata  # type: ignore[has-type,no-any-return]
        except AttributeError:
            core = self._op.metadata()
            assert core is not None
            self._metadata = RdmaMetadata._wrap(core)
            return self._metadata


class ReadableOperation(_Passive):
    """Passive: local memory that one remote worker may read, once, with a
    :class:`ReadOperation`. Completes when the remote has every byte.

    Leaving its ``with`` block (or dropping it) before it completed cancels
    it and withdraws the memory.
    """

    __slots__ = ()
    _kind = OperationKind.READ


class WritableOperation(_Passive):
    """Passive: local memory that one remote worker may write, once, with a
    :class:`WriteOperation`. Completes when every byte has landed.

    Leaving its ``with`` block (or dropping it) before it completed cancels
    it and withdraws the memory.
    """

    __slots__ = ()
    _kind = OperationKind.WRITE


class ReadOperation(_Operation):
    """Active: reads a remote :class:`ReadableOperation` into local
    descriptors. Starts at once; leaving its ``with`` block (or dropping it)
    before it completed cancels it."""

    __slots__ = ()
    _kind = OperationKind.READ

    def results(self) -> List[Descriptor]:
        """The local descriptors, which hold the data once the read is
        complete (``RuntimeError`` before)."""
        if self.status != OperationStatus.COMPLETE:
            raise RuntimeError(f"the read is {self.status.name}, not COMPLETE: no results yet")
        return list(self._descriptors)


class WriteOperation(_Operation):
    """Active: writes local descriptors into a remote
    :class:`WritableOperation`. Starts at once; leaving its ``with`` block
    (or dropping it) before it completed cancels it."""

    __slots__ = ()
    _kind = OperationKind.WRITE


T = TypeVar("T", bound=_Operation)


class PendingOperation(Generic[T]):
    """What the connector's four methods return: await it for the operation
    (``op = await connector.begin_read(...)``), or use it directly as a
    context manager, ``with`` (which starts the operation at once, blocking
    without the GIL while a read or write connects) or ``async with``.

    It starts the operation once; nothing happens until then.
    """

    __slots__ = ("_begin", "_begin_blocking", "_wrap", "_op", "_started")

    def __init__(
        self,
        begin: Optional[Callable[[], Awaitable[_ferry.Operation]]],
        begin_blocking: Callable[[], _ferry.Operation],
        wrap: Callable[[_ferry.Operation], T],
    ) -> None:
        # `begin` is None when starting never waits (readables, writables).
        self._begin = begin
        self._begin_blocking = begin_blocking
        self._wrap = wrap
        self._op: Optional[T] = None
        self._started = False

    def _claim(self) -> None:
        if self._started:
            raise RuntimeError("this operation was already started: await it (or enter it) once")
        self._started = True

    def __await__(self) -> Generator[Any, None, T]:
        self._claim()
        if self._begin is None:
            return self._wrap(self._begin_blocking())
        core = yield from self._begin().__await__()
        return self._wrap(core)

    def __enter__(self) -> T:
        self._claim()
        self._op = self._wrap(self._begin_blocking())
        return self._op

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._op is not None:
            self._op.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> T:
        self._op = await self
        return self._op

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._op is not None:
            self._op.__exit__(exc_type, exc, tb)


def _descriptor_list(value: Any, what: str) -> List[Descriptor]:
    # type(), not isinstance(): an object's `__class__` can claim to be a
    # Descriptor, and a descriptor's address is taken as it is.
    if type(value) is Descriptor:
        return [value]
    if isinstance(value, (list, tuple)):
        items = list(value)
        for i, d in enumerate(items):
            if type(d) is not Descriptor:
                raise TypeError(
                    f"{what}[{i}] is a {type(d).__name__}, not a ferry.Descriptor: "
                    "wrap it, e.g. Descriptor(array)"
                )
        return items
    raise TypeError(
        f"{what} must be a ferry.Descriptor or a list of them, not {type(value).__name__}"
    )


def _check_writable(descs: List[Descriptor], op: str) -> None:
    for i, d in enumerate(descs):
        if d.readonly:
            raise ValueError(
                f"descriptor {i} is read-only (bytes or a read-only buffer), but a {op} "
                "writes into it: use writable memory (a bytearray, a writable NumPy array, "
                "a tensor)"
            )


def _metadata_arg(value: Any) -> RdmaMetadata:
    if not isinstance(value, RdmaMetadata):
        raise TypeError(
            f"remote_metadata must be a ferry.RdmaMetadata, not {type(value).__name__} "
            "(parse JSON with RdmaMetadata.model_validate_json)"
        )
    return value


class Connector:
    """One worker's entry point to Ferry: creates the four operations, owns
    the listener, the pooled connections to remote workers and the table of
    exposed memory.

    `worker_id` defaults to a random id. `listen` (``"ip:port"``, default
    ``"0.0.0.0:0"``: every interface, an ephemeral port) is where remote
    workers connect; the metadata carries this host's addresses.

    Operations keep their connector alive. When the connector is dropped
    with nothing else holding it, it shuts down.
    """

    __slots__ = ("_core", "__weakref__")

    def __init__(self, worker_id: Optional[str] = None, *, listen: Optional[str] = None) -> None:
        if worker_id is not None and not isinstance(worker_id, str):
            raise TypeError(f"worker_id must be a str or None, not {type(worker_id).__name__}")
        if listen is not None and not isinstance(listen, str):
            raise TypeError(f"listen must be a str such as '127.0.0.1:0', not {type(listen).__name__}")
        self._core = _ferry.Connector(worker_id, listen)

    @property
    def name(self) -> str:
        """The worker id."""
        return self._core.name

    @property
    def hostname(self) -> str:
        """This host's name."""
        return self._core.hostname

    @property
    def is_cuda_available(self) -> bool:
        """Whether CUDA memory can be moved (not in this version)."""
        return self._core.is_cuda_available

    @property
    def address(self) -> str:
        """Where the connector listens, ``ip:port``."""
        return self._core.local_address

    async def initialize(self) -> None:
        """Nothing to do: a connector is ready when created. Kept for code
        written against the reference."""

    def create_readable(self, local_descriptors: Descriptors) -> PendingOperation[ReadableOperation]:
        """Exposes `local_descriptors` for one remote worker to read; hand it
        the operation's ``metadata()``."""
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        return self._expose(ReadableOperation, descs, self._core.create_readable)

    def create_writable(self, local_descriptors: Descriptors) -> PendingOperation[WritableOperation]:
        """Exposes `local_descriptors` for one remote worker to write; hand
        it the operation's ``metadata()``."""
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        _check_writable(descs, "WritableOperation")
        return self._expose(WritableOperation, descs, self._core.create_writable)

    def begin_read(
        self, remote_metadata: RdmaMetadata, local_descriptors: Descriptors
    ) -> PendingOperation[ReadOperation]:
        """Starts reading the remote readable `remote_metadata` describes
        into `local_descriptors` (counts and sizes must match). The two
        arguments may also come the other way round."""
        if isinstance(local_descriptors, RdmaMetadata) and not isinstance(remote_metadata, RdmaMetadata):
            remote_metadata, local_descriptors = local_descriptors, remote_metadata
        meta = _metadata_arg(remote_metadata)
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        _check_writable(descs, "ReadOperation")
        raw = [d._raw for d in descs]
        return PendingOperation(
            lambda: self._core.begin_read(meta._core, raw),
            lambda: self._core.begin_read_blocking(meta._core, raw),
            lambda op: ReadOperation._new(op, descs, self),
        )

    def begin_write(
        self, local_descriptors: Descriptors, remote_metadata: RdmaMetadata
    ) -> PendingOperation[WriteOperation]:
        """Starts writing `local_descriptors` into the remote writable
        `remote_metadata` describes (counts and sizes must match). The two
        arguments may also come the other way round."""
        if isinstance(local_descriptors, RdmaMetadata) and not isinstance(remote_metadata, RdmaMetadata):
            remote_metadata, local_descriptors = local_descriptors, remote_metadata
        meta = _metadata_arg(remote_metadata)
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        raw = [d._raw for d in descs]
        return PendingOperation(
            lambda: self._core.begin_write(raw, meta._core),
            lambda: self._core.begin_write_blocking(raw, meta._core),
            lambda op: WriteOperation._new(op, descs, self),
        )

    def _expose(
        self,
        cls: Type[_Op],
        descs: List[Descriptor],
        create: Callable[[List[Any]], _ferry.Operation],
    ) -> PendingOperation[_Op]:
        raw = [d._raw for d in descs]
        return PendingOperation(None, lambda: create(raw), lambda op: cls._new(op, descs, self))

    def _stats(self) -> Dict[str, int]:
        """Exposed operations and open connections (for tests)."""
        return {
            "exposed": self._core.exposed_count(),
            "connections": self._core.connection_count(),
        }

    def __repr__(self) -> str:
        return f"Connector(name={self.name!r}, hostname={self.hostname!r}, address={self.address!r})"

    def __str__(self) -> str:
        return self.name
