"""The operations: the four kinds, their common base classes, and the
awaitable that creates one."""

from __future__ import annotations

from typing import (
    Any,
    Awaitable,
    Callable,
    ClassVar,
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
from ._errors import WrongPairingError
from ._metadata import RdmaMetadata
from ._descriptor import Descriptor
from ._pool import AnyDescriptor, PagedDescriptor
from ._types import OperationKind, OperationStatus

from ._connection import Connection, _ConnectorBase, _connection_result
from ._remote import Remote

_STATUSES = tuple(OperationStatus)

# What an operation takes as its local memory: one descriptor, or several.
Descriptors = Union[AnyDescriptor, Sequence[AnyDescriptor]]


class AbstractOperation:
    """What every operation is: a :class:`ReadableOperation` or
    :class:`WritableOperation` (both :class:`PassiveOperation`), or a
    :class:`ReadOperation` or :class:`WriteOperation` (both
    :class:`ActiveOperation`). Only these four are created."""

    __slots__ = ("_op", "_descriptors", "_connector", "_connection", "_registrations", "__weakref__")
    _kind: ClassVar[OperationKind]

    _op: _ferry.Operation
    _descriptors: List[AnyDescriptor]
    _connector: _ConnectorBase
    _connection: Optional[Connection]
    # The registrations an operation made from a Connection claimed.
    _registrations: Optional[List[Tuple[AnyDescriptor, object]]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"{type(self).__name__} is abstract: a Connector creates operations "
            "(create_readable, create_writable, begin_read, begin_write)"
        )

    @classmethod
    def _new(
        cls: Type[_Op],
        op: _ferry.Operation,
        descriptors: List[AnyDescriptor],
        connector: _ConnectorBase,
        connection: Optional[Connection] = None,
    ) -> _Op:
        self = cls.__new__(cls)
        self._setup(op, descriptors, connector, connection)
        return self

    def _setup(
        self,
        op: _ferry.Operation,
        descriptors: List[AnyDescriptor],
        connector: _ConnectorBase,
        connection: Optional[Connection],
        registrations: Optional[List[Tuple[AnyDescriptor, object]]] = None,
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
    def connector(self) -> _ConnectorBase:
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
        """The transport carrying the bytes (``"local"``, ``"cma"``, ``"ucx"`` or ``"tcp"``), once known."""
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
        When this returns, Ferry starts no further access to the memory; a
        copy already in flight may run a little longer (a UCX get that the
        source does not answer: about 250 ms, after which the connection
        ends; a stalled same-host copy: until its pages arrive), and the
        memory is given back once it returned. A READ whose every byte has
        landed and that only awaits the source's confirmation is the
        remote's to decide: it stays in progress until then."""
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
        descriptors: List[AnyDescriptor],
        connector: _ConnectorBase,
        connection: Optional[Connection],
        remote_metadata: RdmaMetadata,
        registrations: Optional[List[Tuple[AnyDescriptor, object]]] = None,
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
    descriptors: List[AnyDescriptor],
    connector: _ConnectorBase,
    connection: Optional[Connection],
    remote_metadata: RdmaMetadata,
) -> _Act:
    self = cls.__new__(cls)
    self._setup_active(op, descriptors, connector, connection, remote_metadata)
    return self


def _claim_registrations(
    connection: Optional[Connection], descs: List[AnyDescriptor]
) -> Optional[List[Tuple[AnyDescriptor, object]]]:
    """Registers `descs` with `connection` (an operation made from one), as
    the reference's operations do; the registrations claimed, for
    :meth:`AbstractOperation._release`. None for an operation made from a
    Connector."""
    if connection is None:
        return None
    claimed: List[Tuple[AnyDescriptor, object]] = []
    try:
        for d in descs:
            claimed.append((d, d._claim_registration(connection)))
    except BaseException:
        _release_registrations(connection, claimed)
        raise
    return claimed


def _release_registrations(connection: Connection, regs: List[Tuple[AnyDescriptor, object]]) -> None:
    for d, token in regs:
        d._release_registration(connection, token)


def _created(
    connection: Optional[Connection],
    descs: List[AnyDescriptor],
    create: Callable[[List[Any]], _ferry.Operation],
) -> Tuple[_ferry.Operation, Optional[List[Tuple[AnyDescriptor, object]]]]:
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

    def __init__(self, connection: Union[Connection, _ConnectorBase], local_descriptors: Descriptors) -> None:
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

    def __init__(self, connection: Union[Connection, _ConnectorBase], local_descriptors: Descriptors) -> None:
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
        connection: Union[Connection, _ConnectorBase],
        remote_metadata: RdmaMetadata,
        local_descriptors: Descriptors,
    ) -> None:
        conn, connector = _connection_of(connection)
        meta, descs = _read_args(remote_metadata, local_descriptors)
        core, regs = _created(conn, descs, lambda raw: connector._core.begin_read_blocking(meta._core, raw))
        self._setup_active(core, descs, connector, conn, meta, regs)

    def results(self) -> List[AnyDescriptor]:
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
        connection: Union[Connection, _ConnectorBase],
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
        connector: _ConnectorBase,
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


def _descriptor_list(value: Any, what: str) -> List[AnyDescriptor]:
    # type(), not isinstance(): an object's `__class__` can claim to be a
    # Descriptor, and a descriptor's address is taken as it is.
    if type(value) is Descriptor or type(value) is PagedDescriptor:
        return [value]
    if isinstance(value, (list, tuple)):
        items = list(value)
        for i, d in enumerate(items):
            if type(d) is not Descriptor and type(d) is not PagedDescriptor:
                raise TypeError(
                    f"{what}[{i}] is a {type(d).__name__}, not a ferry.Descriptor: "
                    "wrap it, e.g. Descriptor(array)"
                )
        return items
    raise TypeError(
        f"{what} must be a ferry.Descriptor (or PagedDescriptor) or a list of them, "
        f"not {type(value).__name__}"
    )


def _check_writable(descs: List[AnyDescriptor], op: str) -> None:
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


def _read_args(remote_metadata: Any, local_descriptors: Any) -> Tuple[RdmaMetadata, List[AnyDescriptor]]:
    # The two arguments may come the other way round.
    if isinstance(local_descriptors, RdmaMetadata) and not isinstance(remote_metadata, RdmaMetadata):
        remote_metadata, local_descriptors = local_descriptors, remote_metadata
    meta = _metadata_arg(remote_metadata)
    descs = _descriptor_list(local_descriptors, "local_descriptors")
    _check_pairing(meta, _READ)
    _check_writable(descs, "ReadOperation")
    return meta, descs


def _write_args(local_descriptors: Any, remote_metadata: Any) -> Tuple[List[AnyDescriptor], RdmaMetadata]:
    # The two arguments may come the other way round.
    if isinstance(local_descriptors, RdmaMetadata) and not isinstance(remote_metadata, RdmaMetadata):
        remote_metadata, local_descriptors = local_descriptors, remote_metadata
    meta = _metadata_arg(remote_metadata)
    descs = _descriptor_list(local_descriptors, "local_descriptors")
    _check_pairing(meta, _WRITE)
    return descs, meta


def _connection_of(value: Any) -> Tuple[Optional[Connection], _ConnectorBase]:
    """`(connection, connector)` of an operation created directly: from a
    :class:`Connection`, or from a :class:`Connector` (the reference's
    older form)."""
    if isinstance(value, Connection):
        return value, value.connector
    if isinstance(value, _ConnectorBase):
        return None, value
    raise TypeError(f"connection must be a ferry.Connection, not {type(value).__name__}")

