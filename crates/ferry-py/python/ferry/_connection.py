"""A worker's connector as its connections see it, and the connections:
what every operation is made from, and what a descriptor is registered
with."""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, Optional

from . import _ferry
from ._errors import InvalidWorkerIdError

# Guards the making of a connector's one shared connection: callers come
# from several loops and threads.
_count_lock = threading.Lock()


class _ConnectorBase:
    """A connector as its connections and operations see it: the compiled
    connector (the worker's id, host and address, its metrics) and the
    :class:`Connection` its operations are made from. :class:`Connector`
    (``_connector.py``) adds the four operations; this class is never made
    on its own, and is what a :class:`Connection` and an operation take for
    a connector."""

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
        return type(self)._create_connection is not _ConnectorBase._create_connection

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
        if not isinstance(other, _ConnectorBase):
            return NotImplemented
        return self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)

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

    def __init__(self, connector: _ConnectorBase, number: int) -> None:
        if not isinstance(connector, _ConnectorBase):
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
    def connector(self) -> _ConnectorBase:
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


def _connection_result(value: Any) -> Connection:
    if not isinstance(value, Connection):
        raise TypeError(
            f"_create_connection() must return a ferry.Connection, not {type(value).__name__}"
        )
    return value
