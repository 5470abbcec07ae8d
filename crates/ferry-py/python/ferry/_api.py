"""Connector, Connection, RdmaMetadata and the operations."""

from __future__ import annotations

import json
import threading
import weakref
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

from . import _ferry
from ._errors import InvalidWorkerIdError, WrongPairingError
from ._metadata import DescriptorInfo, RdmaMetadata
from ._descriptor import Descriptor
from ._pool import AnyDescriptor
from ._types import OperationStatus

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


Descriptors = Union[AnyDescriptor, Sequence[AnyDescriptor]]


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
        # Reentrant: a Remote's finalizer releases its reference, and the
        # garbage collector may run one on a thread that holds this lock.
        self._remote_refs_lock = threading.RLock()

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
        """Whether this connector moves CUDA memory: what callers of the
        reference ask before handing over CUDA tensors. ``True`` where the
        CUDA driver loads and sees a device: CUDA memory then moves by CUDA
        IPC between processes of one host (GPU to GPU, GPU to host), on a
        connection where cross-memory attach works. Where it is ``False``,
        creating an operation over CUDA memory raises
        :class:`CudaUnavailableError` (the message says why); a pairing no
        transport carries (another host, no attach, host memory into GPU
        memory, both sides in one process, host and CUDA memory mixed in
        one operation) raises :class:`NoDeviceTransportError`."""
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
        descs: List[AnyDescriptor],
        create: Callable[[List[Any]], _ferry.Operation],
    ) -> PendingOperation[_Op]:
        raw = [d._raw for d in descs]
        return PendingOperation(
            self, None, lambda: create(raw), lambda op, conn: cls._new(op, descs, self, conn)
        )

    def metrics(self) -> Dict[str, Any]:
        """This connector's metrics now: operations by kind, transport and
        outcome (with their bytes), durations of completed operations,
        errors by cause, operations in flight, bytes exposed, bytes sent
        and received, connections opened and closed, operations whose GPU
        memory moved staged where CUDA IPC was to carry it
        (``cuda_ipc_fallbacks``; see docs/metrics.md).
        The same counters are served to Prometheus when FERRY_METRICS_ADDR
        is set."""
        return self._core.metrics()

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


# The operations need Connection, defined above; Connector needs them.
from ._operations import (  # noqa: E402
    AbstractOperation,
    PassiveOperation,
    ActiveOperation,
    ReadableOperation,
    WritableOperation,
    ReadOperation,
    WriteOperation,
    PendingOperation,
    _descriptor_list,
    _check_writable,
    _read_args,
    _write_args,
    _connection_result,
    _new_active,
    _Op,
)
