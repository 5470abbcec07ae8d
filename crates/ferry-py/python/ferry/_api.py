"""Connector, Connection, RdmaMetadata and the operations."""

from __future__ import annotations

import json
import threading
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
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from . import _ferry
from ._errors import InvalidWorkerIdError, WrongPairingError
from ._metadata import DescriptorInfo, RdmaMetadata
from ._types import Descriptor, Device, OperationKind, OperationStatus

__all__ = [
    "Connector",
    "Connection",
    "Remote",
    "RdmaMetadata",
    "DescriptorInfo",
    "AbstractOperation",
    "ActiveOperation",
    "PassiveOperation",
    "ReadableOperation",
    "WritableOperation",
    "ReadOperation",
    "WriteOperation",
    "PendingOperation",
]

_STATUSES = tuple(OperationStatus)

# ---- event loops ----
#
# A result of Ferry's runtime that is not ready at once reaches the event
# loop awaiting it through that loop's Bridge: a socket pair the loop watches
# (`add_reader`), so a result wakes the loop directly and no thread of ours
# takes the GIL. Any loop that supports `add_reader` will do (asyncio's
# selector loops, uvloop), in any thread, and a connector is bound to none:
# it can be created outside any loop and used from several at once.
#
# One bridge per loop, found by the loop's id and checked by identity; the
# loop is held weakly (strongly if it takes no weak reference), and a bridge
# goes with its loop, or once the loop is closed.

_bridges: Dict[int, Tuple[Callable[[], Any], _ferry.Bridge]] = {}
_bridges_lock = threading.Lock()


def _bridge_for(loop: Any) -> _ferry.Bridge:
    """The bridge of `loop`, made on first use (called by the compiled core,
    on the loop's own thread, while it runs)."""
    entry = _bridges.get(id(loop))
    if entry is not None and entry[0]() is loop:
        return entry[1]
    with _bridges_lock:
        entry = _bridges.get(id(loop))
        if entry is not None and entry[0]() is loop:
            return entry[1]
        _forget_closed_loops()
        bridge = _ferry.Bridge()
        try:
            loop.add_reader(bridge.fileno(), bridge.drain)
        except NotImplementedError:
            raise RuntimeError(
                f"ferry needs an event loop that supports add_reader; {type(loop).__name__} "
                "does not (use asyncio's default loop or uvloop)"
            ) from None
        key = id(loop)
        held: Callable[[], Any]
        try:
            held = weakref.ref(loop, lambda r: _forget(key, r))
        except TypeError:  # a loop that takes no weak reference: held until closed
            held = lambda: loop  # noqa: E731
        _bridges[key] = (held, bridge)
        return bridge


def _forget(key: int, held: Any) -> None:
    # A weak reference's callback, run while the loop is freed (before its
    # id can be reused): takes no lock, which the freeing thread may hold.
    entry = _bridges.get(key)
    if entry is not None and entry[0] is held:
        _bridges.pop(key, None)


def _forget_closed_loops() -> None:
    """Drops the bridges of loops that are closed (or gone); under the lock."""
    for key, (held, _) in list(_bridges.items()):
        loop = held()
        if loop is None or loop.is_closed():
            _forget(key, held)


Descriptors = Union[Descriptor, Sequence[Descriptor]]


class Connection:
    """A connection of a :class:`Connector`, as the reference's operations
    hold one: ``await connector._create_connection()`` returns the
    connector's one shared connection (``Connection(connector, number)``
    makes another), and every operation has one (its ``connection``).

    Ferry's connector pools its network connections itself, and exposes
    memory per operation: a ``Connection`` holds no resource. It names the
    connector (``name`` is ``"<worker id>-<number>"``), is what a
    :class:`Descriptor` is registered with, and counts the references to
    each :class:`Remote` (``acquire_remote_ref`` / ``release_remote_ref``).
    Connections compare by identity.
    """

    def __init__(self, connector: Connector, number: int) -> None:
        if not isinstance(connector, Connector):
            raise TypeError(f"connector must be a ferry.Connector, not {type(connector).__name__}")
        if not isinstance(number, int) or isinstance(number, bool):
            raise TypeError(f"number must be an int, not {type(number).__name__}")
        if number <= 0:
            raise ValueError(f"number must be greater than 0 (got {number})")
        self._connector = connector
        self._number = int(number)
        self._name = f"{connector.name}-{self._number}"
        self._is_initialized = False
        # How many Remotes hold each remote worker, by name.
        self._remote_refs: Dict[str, int] = {}
        self._remote_refs_lock = threading.Lock()

    @property
    def connector(self) -> Connector:
        """The connector of this connection."""
        return self._connector

    @property
    def name(self) -> str:
        """``"<worker id>-<number>"``."""
        return self._name

    @property
    def metadata(self) -> bytes:
        """What identifies the connector to a remote (JSON): worker id,
        host name and address. Ferry's operations carry this in their
        :class:`RdmaMetadata`; nothing needs to send it apart."""
        c = self._connector
        return json.dumps(
            {"worker_id": c.name, "hostname": c.hostname, "address": c.address}
        ).encode()

    def acquire_remote_ref(self, name: str) -> None:
        """Counts one more holder of the remote worker `name` (what a
        :class:`Remote` does when created)."""
        with self._remote_refs_lock:
            self._remote_refs[name] = self._remote_refs.get(name, 0) + 1

    def release_remote_ref(self, name: str) -> bool:
        """Counts one holder of `name` less; True when that was the last one
        (False also when `name` has no holder)."""
        with self._remote_refs_lock:
            count = self._remote_refs.get(name)
            if count is None:
                return False
            if count <= 1:
                del self._remote_refs[name]
                return True
            self._remote_refs[name] = count - 1
            return False

    async def initialize(self) -> None:
        """Nothing to do: a connection is ready when created (kept for the
        reference's callers)."""
        self._is_initialized = True

    def __repr__(self) -> str:
        return f"Connection(is_initialized={self._is_initialized}, name={self._name!r})"

    def __str__(self) -> str:
        return self._name


class Remote:
    """A remote worker, as seen through a local :class:`Connection`, as the
    reference names it: ``name`` is the remote's worker id. The remote of a
    :class:`ReadOperation` or :class:`WriteOperation` is its ``remote``.

    `nixl_metadata` is what a remote's :class:`RdmaMetadata` carries there
    (Ferry's metadata, JSON), that :class:`RdmaMetadata` itself, or the
    remote worker's id. Each Remote counts as one holder of that worker on
    the connection (``connection.acquire_remote_ref``) and lets go of it
    once: leaving its ``with`` block, ``_release()`` or its destruction,
    whichever comes first (from any thread). Ferry keeps nothing else per
    remote.
    """

    def __init__(self, connection: Connection, nixl_metadata: Union[RdmaMetadata, str, bytes]) -> None:
        if not isinstance(connection, Connection):
            raise TypeError(f"connection must be a ferry.Connection, not {type(connection).__name__}")
        self._connection = connection
        self._name = _remote_name(nixl_metadata)
        self._release_lock = threading.Lock()
        self._released = False
        connection.acquire_remote_ref(self._name)
        self._acquired = True

    @property
    def connection(self) -> Connection:
        """The local connection the remote is used through."""
        return self._connection

    @property
    def name(self) -> str:
        """The remote worker's id."""
        return self._name

    def _release(self) -> None:
        """Lets go of the remote, once (the reference also forgets the
        remote's NIXL agent when it was the last holder; callers may replace
        this method)."""
        if not getattr(self, "_acquired", False):
            return  # __init__ did not finish
        with self._release_lock:
            if self._released:
                return
            self._released = True
        self._connection.release_remote_ref(self._name)

    def __del__(self) -> None:
        if getattr(self, "_acquired", False):  # __init__ finished
            self._release()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._release()

    def __repr__(self) -> str:
        return f"Remote(name={self._name}, connection={self._connection.name})"

    def __str__(self) -> str:
        return self._name


def _remote_name(value: Any) -> str:
    """The worker id in a Remote's `nixl_metadata`."""
    if isinstance(value, RdmaMetadata):
        return value.worker_id
    if not isinstance(value, (str, bytes)):
        raise TypeError(
            "nixl_metadata must be a str or bytes (an RdmaMetadata's nixl_metadata, or a worker "
            f"id) or a ferry.RdmaMetadata, not {type(value).__name__}"
        )
    if len(value) == 0:
        raise ValueError("nixl_metadata must not be empty")
    text = value if isinstance(value, str) else value.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        # Ferry's metadata, as RdmaMetadata.nixl_metadata gives it.
        return RdmaMetadata(nixl_metadata=text).worker_id
    return text


class AbstractOperation:
    """What every operation is: a :class:`ReadableOperation` or
    :class:`WritableOperation` (both :class:`PassiveOperation`), or a
    :class:`ReadOperation` or :class:`WriteOperation` (both
    :class:`ActiveOperation`). Only these four are created."""

    __slots__ = ("_op", "_descriptors", "_connector", "_connection", "_registrations", "__weakref__")
    _kind: ClassVar[OperationKind]

    _op: _ferry.Operation
    _descriptors: List[Descriptor]
    _connector: Connector
    _connection: Optional[Connection]
    # The registrations an operation made from a Connection claimed.
    _registrations: Optional[List[Tuple[Descriptor, object]]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"{type(self).__name__} is abstract: a Connector creates operations "
            "(create_readable, create_writable, begin_read, begin_write)"
        )

    @classmethod
    def _new(
        cls: Type[_Op],
        op: _ferry.Operation,
        descriptors: List[Descriptor],
        connector: Connector,
        connection: Optional[Connection] = None,
    ) -> _Op:
        self = cls.__new__(cls)
        self._op = op
        self._descriptors = descriptors
        self._connector = connector
        self._connection = connection
        self._registrations = None
        return self

    def _setup(
        self,
        op: _ferry.Operation,
        descriptors: List[Descriptor],
        connector: Connector,
        connection: Optional[Connection],
        registrations: Optional[List[Tuple[Descriptor, object]]] = None,
    ) -> None:
        self._op = op
        self._descriptors = descriptors
        self._connector = connector
        self._connection = connection
        self._registrations = registrations

    def _release(self) -> None:
        """Deregisters the local descriptors that an operation made from a
        :class:`Connection` registered (or found registered) when created,
        as the reference does when an operation ends; a registration made
        since (by hand, or by a newer operation) is left alone. Once."""
        regs = getattr(self, "_registrations", None)
        if regs is None:
            return
        self._registrations = None
        conn = self._connection
        assert conn is not None
        _release_registrations(conn, regs)

    def __del__(self) -> None:
        self._release()

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
    def connection(self) -> Connection:
        """The operation's :class:`Connection`: the one it was made from, or
        what the connector's ``_create_connection()`` returns: the
        connector's shared connection (a subclass's override is asked when
        the operation starts)."""
        conn = self._connection
        if conn is None:
            c = self._connector
            conn = c._connection_now() if c._overrides_connection() else c._shared_connection()
            self._connection = conn
        return conn

    @property
    def transport(self) -> Optional[str]:
        """The transport carrying the bytes (``"local"``, ``"cma"`` or ``"tcp"``), once known."""
        return self._op.transport()

    async def wait_for_completion(self, timeout: Optional[float] = None) -> None:
        """Waits until the operation ends. Returns when it completed; raises
        the cause otherwise: a :class:`FerryError` subclass (a
        ``RuntimeError``) when it failed or was cancelled (by either side),
        ``TimeoutError`` after `timeout` seconds (the operation goes on;
        cancel it to stop it).

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
        # lets go of its memory (and of its registrations).
        self._op.close()
        self._release()

    async def __aenter__(self: _Op) -> _Op:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._op.close()
        self._release()

    def __repr__(self) -> str:
        sizes = [d.size for d in self._descriptors]
        return f"{type(self).__name__}(status={self.status.name}, descriptors={sizes})"


_Op = TypeVar("_Op", bound=AbstractOperation)
_Operation = AbstractOperation  # its former name


class PassiveOperation(AbstractOperation):
    """A :class:`ReadableOperation` or :class:`WritableOperation`: local
    memory exposed to one remote worker, which the ``metadata()`` describes."""

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


_Passive = PassiveOperation  # its former name


class ActiveOperation(AbstractOperation):
    """A :class:`ReadOperation` or :class:`WriteOperation`: moves bytes from
    or into a remote worker's passive operation, described by the
    :class:`RdmaMetadata` it was started with (its ``remote``)."""

    __slots__ = ("_remote_metadata", "_remote")

    _remote_metadata: RdmaMetadata
    _remote: Optional[Remote]

    def _setup_active(
        self,
        op: _ferry.Operation,
        descriptors: List[Descriptor],
        connector: Connector,
        connection: Optional[Connection],
        remote_metadata: RdmaMetadata,
        registrations: Optional[List[Tuple[Descriptor, object]]] = None,
    ) -> None:
        self._setup(op, descriptors, connector, connection, registrations)
        self._remote_metadata = remote_metadata
        self._remote = None

    def _release(self) -> None:
        super()._release()
        remote = getattr(self, "_remote", None)
        if remote is not None:
            remote._release()

    @property
    def remote(self) -> Remote:
        """The remote worker (its ``name`` is the remote's worker id)."""
        remote = self._remote
        if remote is None:
            remote = self._remote = Remote(self.connection, self._remote_metadata)
        return remote


_Act = TypeVar("_Act", bound=ActiveOperation)


def _new_active(
    cls: Type[_Act],
    op: _ferry.Operation,
    descriptors: List[Descriptor],
    connector: Connector,
    connection: Optional[Connection],
    remote_metadata: RdmaMetadata,
) -> _Act:
    self = cls.__new__(cls)
    self._op = op
    self._descriptors = descriptors
    self._connector = connector
    self._connection = connection
    self._registrations = None
    self._remote_metadata = remote_metadata
    self._remote = None
    return self


def _claim_registrations(
    connection: Optional[Connection], descs: List[Descriptor]
) -> Optional[List[Tuple[Descriptor, object]]]:
    """Registers `descs` with `connection` (an operation made from one), as
    the reference's operations do; the registrations claimed, for
    :meth:`AbstractOperation._release`. None for an operation made from a
    Connector."""
    if connection is None:
        return None
    claimed: List[Tuple[Descriptor, object]] = []
    try:
        for d in descs:
            claimed.append((d, d._claim_registration(connection)))
    except BaseException:
        _release_registrations(connection, claimed)
        raise
    return claimed


def _release_registrations(connection: Connection, regs: List[Tuple[Descriptor, object]]) -> None:
    for d, token in regs:
        d._release_registration(connection, token)


def _created(
    connection: Optional[Connection],
    descs: List[Descriptor],
    create: Callable[[List[Any]], _ferry.Operation],
) -> Tuple[_ferry.Operation, Optional[List[Tuple[Descriptor, object]]]]:
    """The core operation over `descs`, and the registrations claimed (an
    operation made from a Connection); none are kept if it fails."""
    raw = [d._raw for d in descs]
    regs = _claim_registrations(connection, descs)
    try:
        return create(raw), regs
    except BaseException:
        if regs is not None and connection is not None:
            _release_registrations(connection, regs)
        raise



class ReadableOperation(PassiveOperation):
    """Passive: local memory that one remote worker may read, once, with a
    :class:`ReadOperation`. Completes when the remote has every byte.

    Leaving its ``with`` block (or dropping it) before it completed cancels
    it and withdraws the memory.

    Usually created by ``connector.create_readable(descriptors)``; also, as
    in the reference, by ``ReadableOperation(connection, descriptors)``.
    """

    __slots__ = ()
    _kind = OperationKind.READ

    def __init__(self, connection: Union[Connection, Connector], local_descriptors: Descriptors) -> None:
        conn, connector = _connection_of(connection)
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        core, regs = _created(conn, descs, connector._core.create_readable)
        self._setup(core, descs, connector, conn, regs)


class WritableOperation(PassiveOperation):
    """Passive: local memory that one remote worker may write, once, with a
    :class:`WriteOperation`. Completes when every byte has landed.

    Leaving its ``with`` block (or dropping it) before it completed cancels
    it and withdraws the memory.

    Usually created by ``connector.create_writable(descriptors)``; also, as
    in the reference, by ``WritableOperation(connection, descriptors)``.
    """

    __slots__ = ()
    _kind = OperationKind.WRITE

    def __init__(self, connection: Union[Connection, Connector], local_descriptors: Descriptors) -> None:
        conn, connector = _connection_of(connection)
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        _check_writable(descs, "WritableOperation")
        core, regs = _created(conn, descs, connector._core.create_writable)
        self._setup(core, descs, connector, conn, regs)


class ReadOperation(ActiveOperation):
    """Active: reads a remote :class:`ReadableOperation` into local
    descriptors. Starts at once; leaving its ``with`` block (or dropping it)
    before it completed cancels it.

    Usually started by ``await connector.begin_read(metadata, descriptors)``;
    also, as in the reference, by ``ReadOperation(connection, metadata,
    descriptors)``, which blocks (without the GIL) while it connects: prefer
    the connector's method inside an event loop."""

    __slots__ = ()
    _kind = OperationKind.READ

    def __init__(
        self,
        connection: Union[Connection, Connector],
        remote_metadata: RdmaMetadata,
        local_descriptors: Descriptors,
    ) -> None:
        conn, connector = _connection_of(connection)
        meta, descs = _read_args(remote_metadata, local_descriptors)
        core, regs = _created(conn, descs, lambda raw: connector._core.begin_read_blocking(meta._core, raw))
        self._setup_active(core, descs, connector, conn, meta, regs)

    def results(self) -> List[Descriptor]:
        """The local descriptors, which hold the data once the read is
        complete (``RuntimeError`` before)."""
        if self.status != OperationStatus.COMPLETE:
            raise RuntimeError(f"the read is {self.status.name}, not COMPLETE: no results yet")
        return list(self._descriptors)


class WriteOperation(ActiveOperation):
    """Active: writes local descriptors into a remote
    :class:`WritableOperation`. Starts at once; leaving its ``with`` block
    (or dropping it) before it completed cancels it.

    Usually started by ``await connector.begin_write(descriptors, metadata)``;
    also, as in the reference, by ``WriteOperation(connection, descriptors,
    metadata)``, which blocks (without the GIL) while it connects: prefer the
    connector's method inside an event loop."""

    __slots__ = ()
    _kind = OperationKind.WRITE

    def __init__(
        self,
        connection: Union[Connection, Connector],
        local_descriptors: Descriptors,
        remote_metadata: RdmaMetadata,
    ) -> None:
        conn, connector = _connection_of(connection)
        descs, meta = _write_args(local_descriptors, remote_metadata)
        core, regs = _created(conn, descs, lambda raw: connector._core.begin_write_blocking(raw, meta._core))
        self._setup_active(core, descs, connector, conn, meta, regs)


T = TypeVar("T", bound=AbstractOperation)


class PendingOperation(Generic[T]):
    """What the connector's four methods return: await it for the operation
    (``op = await connector.begin_read(...)``), or use it directly as a
    context manager, ``with`` (which starts the operation at once, blocking
    without the GIL while a read or write connects) or ``async with``.

    It starts the operation once; nothing happens until then.
    """

    __slots__ = ("_connector", "_begin", "_begin_blocking", "_wrap", "_op", "_started")

    def __init__(
        self,
        connector: Connector,
        begin: Optional[Callable[[], Awaitable[_ferry.Operation]]],
        begin_blocking: Callable[[], _ferry.Operation],
        wrap: Callable[[_ferry.Operation, Optional[Connection]], T],
    ) -> None:
        # `begin` is None when starting never waits (readables, writables).
        self._connector = connector
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
        connection = None
        if self._connector._overrides_connection():
            # As the reference does: a subclass's connection, asked for
            # before each operation.
            connection = _connection_result(
                (yield from self._connector._create_connection().__await__())
            )
        if self._begin is None:
            return self._wrap(self._begin_blocking(), connection)
        core = yield from self._begin().__await__()
        return self._wrap(core, connection)

    def __enter__(self) -> T:
        self._claim()
        connection = None
        if self._connector._overrides_connection():
            connection = self._connector._connection_now()
        self._op = self._wrap(self._begin_blocking(), connection)
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


_READ, _WRITE = int(OperationKind.READ), int(OperationKind.WRITE)
_ACTIVE_NAMES = {_READ: "ReadOperation", _WRITE: "WriteOperation"}
_PASSIVE_NAMES = {_READ: "ReadableOperation", _WRITE: "WritableOperation"}


def _check_pairing(meta: RdmaMetadata, active: int) -> None:
    """A :class:`WrongPairingError` unless `meta` is of the passive operation
    that an `active` operation (1 READ, 2 WRITE) pairs with: the core's
    check and message, with a class that is also the reference's
    RuntimeError."""
    found = meta.operation_kind
    if found != active:
        found_name = _PASSIVE_NAMES.get(int(found), f"operation of kind {found}")
        raise WrongPairingError(
            f"a {_ACTIVE_NAMES[active]} needs the metadata of a {_PASSIVE_NAMES[active]}, "
            f"but this metadata comes from a {found_name}: "
            "pair READ with READABLE and WRITE with WRITABLE"
        )


def _read_args(remote_metadata: Any, local_descriptors: Any) -> Tuple[RdmaMetadata, List[Descriptor]]:
    # The two arguments may come the other way round.
    if isinstance(local_descriptors, RdmaMetadata) and not isinstance(remote_metadata, RdmaMetadata):
        remote_metadata, local_descriptors = local_descriptors, remote_metadata
    meta = _metadata_arg(remote_metadata)
    descs = _descriptor_list(local_descriptors, "local_descriptors")
    _check_pairing(meta, _READ)
    _check_writable(descs, "ReadOperation")
    return meta, descs


def _write_args(local_descriptors: Any, remote_metadata: Any) -> Tuple[List[Descriptor], RdmaMetadata]:
    # The two arguments may come the other way round.
    if isinstance(local_descriptors, RdmaMetadata) and not isinstance(remote_metadata, RdmaMetadata):
        remote_metadata, local_descriptors = local_descriptors, remote_metadata
    meta = _metadata_arg(remote_metadata)
    descs = _descriptor_list(local_descriptors, "local_descriptors")
    _check_pairing(meta, _WRITE)
    return descs, meta


def _connection_of(value: Any) -> Tuple[Optional[Connection], Connector]:
    """`(connection, connector)` of an operation created directly: from a
    :class:`Connection`, or from a :class:`Connector` (the reference's
    older form)."""
    if isinstance(value, Connection):
        return value, value.connector
    if isinstance(value, Connector):
        return None, value
    raise TypeError(f"connection must be a ferry.Connection, not {type(value).__name__}")


def _connection_result(value: Any) -> Connection:
    if not isinstance(value, Connection):
        raise TypeError(
            f"_create_connection() must return a ferry.Connection, not {type(value).__name__}"
        )
    return value


_count_lock = threading.Lock()


class Connector:
    """One worker's entry point to Ferry: creates the four operations, owns
    the listener, the pooled connections to remote workers and the table of
    exposed memory.

    `worker_id` defaults to a random id. `listen` (``"ip:port"``, default
    ``"0.0.0.0:0"``: every interface, an ephemeral port) is where remote
    workers connect; the metadata carries this host's addresses.

    A connector belongs to no event loop: it can be created outside any,
    then used from several loops (asyncio's, uvloop) and threads at once.
    Connectors compare (and hash) by worker id.

    Operations keep their connector alive. When the connector is dropped
    with nothing else holding it, it shuts down.
    """

    __slots__ = ("_core", "_connection_count", "_connection", "__weakref__")

    def __init__(self, worker_id: Optional[str] = None, *, listen: Optional[str] = None) -> None:
        if worker_id is not None and not isinstance(worker_id, str):
            raise TypeError(f"worker_id must be a str or None, not {type(worker_id).__name__}")
        if worker_id == "":
            raise InvalidWorkerIdError("worker_id must be a non-empty str or None")
        if listen is not None and not isinstance(listen, str):
            raise TypeError(f"listen must be a str such as '127.0.0.1:0', not {type(listen).__name__}")
        self._core = _ferry.Connector(worker_id, listen)
        # How many connections `_create_connection` made (the reference's
        # counter, which numbers them: one, shared, as in the reference).
        self._connection_count = 0
        self._connection: Optional[Connection] = None

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
        """Does nothing and returns None: a connector is ready when created.
        Deprecated in the reference, which returns None there too (and warns
        by no more than a debug log); kept for the code that calls it."""

    async def _create_connection(self) -> Connection:
        """The connector's one shared :class:`Connection` (``"<worker
        id>-1"``), made and initialized on the first call, as the
        reference's operations get theirs (and its descriptor pools register
        with it): the same object on every call, from any event loop or
        thread. A subclass may override it: the operations then ask it for
        theirs."""
        return self._shared_connection()

    def _shared_connection(self) -> Connection:
        conn = self._connection
        if conn is not None:
            return conn
        # A threading lock: callers come from several loops and threads.
        with _count_lock:
            conn = self._connection
            if conn is None:
                self._connection_count += 1
                conn = Connection(self, self._connection_count)
                conn._is_initialized = True  # what `initialize()` does
                self._connection = conn
        return conn

    def _overrides_connection(self) -> bool:
        return type(self)._create_connection is not Connector._create_connection

    def _connection_now(self) -> Connection:
        """What `_create_connection()` returns, run here without an event
        loop (for `with connector.create_readable(...)`): a subclass's
        override must then finish without waiting for anything."""
        coro = self._create_connection()
        try:
            coro.send(None)
        except StopIteration as done:
            return _connection_result(done.value)
        coro.close()
        raise RuntimeError(
            f"{type(self).__name__}._create_connection() waits for something, which an "
            "operation started with a plain `with` cannot: await the operation "
            "(`await connector.begin_read(...)`, or `async with`) instead"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Connector):
            return NotImplemented
        return self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)

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
        arguments may also come the other way round. The metadata of a
        writable is a :class:`WrongPairingError`."""
        meta, descs = _read_args(remote_metadata, local_descriptors)
        raw = [d._raw for d in descs]
        return PendingOperation(
            self,
            lambda: self._core.begin_read(meta._core, raw),
            lambda: self._core.begin_read_blocking(meta._core, raw),
            lambda op, conn: _new_active(ReadOperation, op, descs, self, conn, meta),
        )

    def begin_write(
        self, local_descriptors: Descriptors, remote_metadata: RdmaMetadata
    ) -> PendingOperation[WriteOperation]:
        """Starts writing `local_descriptors` into the remote writable
        `remote_metadata` describes (counts and sizes must match). The two
        arguments may also come the other way round. The metadata of a
        readable is a :class:`WrongPairingError`."""
        descs, meta = _write_args(local_descriptors, remote_metadata)
        raw = [d._raw for d in descs]
        return PendingOperation(
            self,
            lambda: self._core.begin_write(raw, meta._core),
            lambda: self._core.begin_write_blocking(raw, meta._core),
            lambda op, conn: _new_active(WriteOperation, op, descs, self, conn, meta),
        )

    def _expose(
        self,
        cls: Type[_Op],
        descs: List[Descriptor],
        create: Callable[[List[Any]], _ferry.Operation],
    ) -> PendingOperation[_Op]:
        raw = [d._raw for d in descs]
        return PendingOperation(
            self, None, lambda: create(raw), lambda op, conn: cls._new(op, descs, self, conn)
        )

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
