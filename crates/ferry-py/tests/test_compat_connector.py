"""The connector side of the reference's API (Dynamo 1.6.1's
`dynamo.nixl_connect`): connectors on any event loop and thread,
`initialize` and `_create_connection`, Connection and Remote, descriptor
pools (registration, `_data_size`, `_data_ref`), the operation classes, and
exceptions that are also the reference's types."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import math
import os
import threading
import time
import warnings

import pytest
from conftest import Peer, run

import ferry
from ferry import (
    AbstractOperation,
    ActiveOperation,
    Connection,
    Connector,
    Descriptor,
    OperationStatus,
    PassiveOperation,
    RdmaMetadata,
    ReadableOperation,
    ReadOperation,
    Remote,
    WritableOperation,
    WriteOperation,
)
from ferry import _bridge


def pair():
    return Connector(listen="127.0.0.1:0"), Connector(listen="127.0.0.1:0")


async def transfer(src_side: Connector, dst_side: Connector, size: int = 4096) -> bytes:
    """`src_side` exposes `size` bytes, `dst_side` reads them; the readable's
    wait starts first, so it is pending and its result comes through the
    running loop's bridge."""
    src = bytes(i % 251 for i in range(size))
    dst = bytearray(size)
    async with src_side.create_readable(Descriptor(src)) as readable:
        waiting = asyncio.ensure_future(readable.wait_for_completion())
        await asyncio.sleep(0)
        async with dst_side.begin_read(readable.metadata(), Descriptor(dst)) as read:
            await read.wait_for_completion()
        await waiting
    assert dst == src
    return bytes(dst)


# ---- 1. connectors, loops and threads ----


def test_connector_made_outside_any_loop_serves_two_loops_and_a_thread():
    a, b = pair()  # no event loop runs here
    assert len(run(transfer(a, b))) == 4096
    assert len(run(transfer(b, a))) == 4096

    # Two threads, each with its own loop, using the same connectors at once,
    # while this thread's loop uses them too.
    errors = []

    def worker():
        try:
            for _ in range(5):
                asyncio.run(transfer(a, b, 1 << 16))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(5):
        run(transfer(a, b, 1 << 16))
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_operation_started_in_one_loop_is_awaited_in_another():
    """A readable created in one thread's loop completes a read made in another
    thread's loop; each loop is woken through its own bridge."""
    a, b = pair()
    size = 1 << 20
    src = bytes(range(256)) * (size // 256)
    readable = run(_create(a, src))
    dst = bytearray(size)

    def reader():
        async def main():
            async with b.begin_read(readable.metadata(), Descriptor(dst)) as read:
                await read.wait_for_completion()

        asyncio.run(main())

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(reader)
        run(readable.wait_for_completion(timeout=30))
        done.result(30)
    assert dst == src
    readable.__exit__(None, None, None)


async def _create(connector: Connector, data: bytes) -> ReadableOperation:
    return await connector.create_readable(Descriptor(data))


def test_uvloop():
    uvloop = pytest.importorskip("uvloop")
    a, b = pair()
    assert len(uvloop.run(transfer(a, b))) == 4096
    # uvloop in another thread, and asyncio's loop here, one after the other.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert len(pool.submit(uvloop.run, transfer(b, a, 1 << 16)).result(60)) == 1 << 16
    assert len(run(transfer(a, b))) == 4096
    # A uvloop loop driven with run_until_complete, created and closed here.
    loop = uvloop.new_event_loop()
    try:
        assert len(loop.run_until_complete(transfer(a, b))) == 4096
    finally:
        loop.close()


def test_bridges_go_with_their_loops():
    """Each loop's bridge is released with the loop, or once it is closed;
    file descriptors do not pile up as loops come and go."""
    a, b = pair()
    run(transfer(a, b))
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    loops = []
    for _ in range(20):
        loop = asyncio.new_event_loop()
        loop.run_until_complete(transfer(a, b))
        loop.close()
        loops.append(loop)  # closed, but still referenced
    run(transfer(a, b))  # a new bridge: the closed loops' ones are dropped
    assert not any(held() in loops for held, _ in _bridge._bridges.values())
    del loops
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


class _LoopWithoutWeakref:
    """Stands for an event loop that takes no weak reference."""

    __slots__ = ("readers", "closed")

    def __init__(self):
        self.readers = {}
        self.closed = False

    def add_reader(self, fd, callback):
        self.readers[fd] = callback

    def is_closed(self):
        return self.closed


def test_a_loop_without_weak_references_is_held_until_closed():
    first, second = _LoopWithoutWeakref(), _LoopWithoutWeakref()
    bridge = _bridge._bridge_for(first)
    assert _bridge._bridge_for(first) is bridge and list(first.readers) == [bridge.fileno()]
    first.closed = True
    other = _bridge._bridge_for(second)
    assert other is not bridge
    assert all(held() is not first for held, _ in _bridge._bridges.values())
    second.closed = True
    _bridge._bridge_for(_LoopWithoutWeakref()).fileno()  # drops `second`'s
    assert all(held() is not second for held, _ in _bridge._bridges.values())


def test_a_loop_without_add_reader_is_a_clear_error():
    class NoReaders(_LoopWithoutWeakref):
        __slots__ = ()

        def add_reader(self, fd, callback):
            raise NotImplementedError

    with pytest.raises(RuntimeError, match="add_reader"):
        _bridge._bridge_for(NoReaders())


# ---- 1. Connector: equality, initialize, _create_connection ----


def test_connectors_compare_and_hash_by_worker_id():
    a = Connector("worker-a", listen="127.0.0.1:0")
    a2 = Connector("worker-a", listen="127.0.0.1:0")
    b = Connector("worker-b", listen="127.0.0.1:0")
    assert a == a2 and not (a != a2) and hash(a) == hash(a2)
    assert a != b and not (a == b)
    assert a != "worker-a" and a != None  # noqa: E711
    assert len({a, a2, b}) == 2
    assert {a: 1}[a2] == 1


def test_initialize_returns_none_without_warning():
    c = Connector(listen="127.0.0.1:0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run(c.initialize()) is None
        assert run(c.initialize()) is None  # as often as callers like


def test_create_connection_returns_the_shared_connection():
    """As the reference (1.6.1): one connection per connector, made and
    initialized on the first call, the same object on every call, from any
    loop or thread."""
    c = Connector("w", listen="127.0.0.1:0")

    async def main():
        first = await c._create_connection()
        second = await c._create_connection()
        return first, second

    first, second = run(main())
    assert isinstance(first, Connection)
    assert (first.name, str(first)) == ("w-1", "w-1")
    assert first.connector is c and first is second
    assert repr(first) == "Connection(is_initialized=True, name='w-1')"
    meta = first.metadata
    assert isinstance(meta, bytes) and b'"worker_id": "w"' in meta
    # The receivers' pattern: asyncio.run in a pool thread while a loop runs
    # here, or asyncio.run with no loop.
    assert asyncio.run(c._create_connection()) is first

    async def inside_a_loop():
        with concurrent.futures.ThreadPoolExecutor() as pool:
            return pool.submit(asyncio.run, c._create_connection()).result(timeout=10)

    assert run(inside_a_loop()) is first
    # Many threads at once, on a new connector: still one connection.
    d = Connector("v", listen="127.0.0.1:0")
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda _: asyncio.run(d._create_connection()), range(16)))
    assert all(g is got[0] for g in got) and got[0].name == "v-1"


def test_connection_arguments():
    c = Connector(listen="127.0.0.1:0")
    conn = Connection(c, 7)
    assert conn.name == f"{c.name}-7" and conn._is_initialized is False
    assert run(conn.initialize()) is None and conn._is_initialized is True
    with pytest.raises(TypeError):
        Connection("c", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Connection(c, "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Connection(c, True)
    with pytest.raises(ValueError):
        Connection(c, 0)


def test_empty_worker_id_is_a_type_error():
    with pytest.raises(TypeError):
        Connector("")
    with pytest.raises(ValueError):  # Ferry's type for it, still
        Connector("")
    with pytest.raises(ferry.InvalidWorkerIdError):
        Connector(worker_id="")


# ---- 2. descriptor pools ----


class PersistentConnector(Connector):
    """Dynamo 1.6.1's embedding receivers' connector: one connection for all."""

    def __init__(self):
        super().__init__(listen="127.0.0.1:0")
        self._connection = None
        self.asked = 0

    async def _create_connection(self) -> Connection:
        self.asked += 1
        if self._connection is None:
            self._connection = Connection(self, 1)
            await self._connection.initialize()
        return self._connection


class PooledReceiver:
    """The pooled receiver of Dynamo 1.6.1, on NumPy buffers: descriptors
    registered once with the persistent connection at construction, each
    receive lowering `_data_size` to the incoming size and viewing the start
    of `_data_ref`."""

    def __init__(self, items: int = 3, item_size: int = 1 << 16):
        numpy = pytest.importorskip("numpy")
        self.numpy = numpy
        self.connector = PersistentConnector()
        try:
            asyncio.get_running_loop()
            with concurrent.futures.ThreadPoolExecutor() as pool:
                connection = pool.submit(asyncio.run, self.connector._create_connection()).result(timeout=10)
        except RuntimeError:
            connection = asyncio.run(self.connector._create_connection())
        self.connection = connection
        self.free = []
        for _ in range(items):
            descriptor = Descriptor(numpy.zeros(item_size, dtype=numpy.int8))
            descriptor.register_with_connector(connection)
            self.free.append(descriptor)

    async def receive(self, metadata: RdmaMetadata, shape, dtype):
        descriptor = self.free.pop()
        original = descriptor._data_size
        nbytes = self.numpy.dtype(dtype).itemsize * math.prod(shape)
        descriptor._data_size = nbytes
        tensor = descriptor._data_ref[:nbytes].view(dtype).reshape(shape)
        read_op = await self.connector.begin_read(metadata, descriptor)
        await read_op.wait_for_completion()
        assert read_op.connection is self.connection
        descriptor._data_size = original
        self.free.append(descriptor)
        return tensor


def test_pooled_receiver_of_dynamo():
    numpy = pytest.importorskip("numpy")
    made_outside = PooledReceiver()
    sender = Connector(listen="127.0.0.1:0")

    async def main():
        made_inside = PooledReceiver()
        for receiver in (made_outside, made_inside):
            for n in (10, 100, 7):
                src = numpy.arange(n * 3, dtype=numpy.float32).reshape(n, 3)
                async with sender.create_readable(Descriptor(src)) as readable:
                    got = await receiver.receive(readable.metadata(), (n, 3), numpy.float32)
                    await readable.wait_for_completion()
                assert (got == src).all()
            assert all(d.is_registered and d._data_size == 1 << 16 for d in receiver.free)
        assert made_inside.connector.asked == 1 + 3

    run(main())


def test_registration_round_trip():
    c = Connector(listen="127.0.0.1:0")
    conn, other = Connection(c, 1), Connection(c, 2)
    d = Descriptor(bytearray(64))
    assert not d.is_registered
    d.register_with_connector(conn)
    assert d.is_registered
    d.register_with_connector(conn)  # again, the same: nothing happens
    with pytest.raises(RuntimeError, match="more than one connection"):
        d.register_with_connector(other)
    with pytest.raises(RuntimeError, match="deregistered from the connection"):
        d.deregister_with_connector(other)
    assert d.is_registered
    d.deregister_with_connector(conn)
    assert not d.is_registered
    with pytest.raises(RuntimeError):  # not registered at all
        d.deregister_with_connector(conn)
    d.register_with_connector(other)  # free for another connection now
    assert d.is_registered
    with pytest.raises(TypeError, match="Connection"):
        d.register_with_connector(c)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Connection"):
        d.deregister_with_connector(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="null pointer"):
        Descriptor((0, 0, "cpu", None)).register_with_connector(conn)


def test_operations_leave_registration_alone():
    """Ferry's operations started by the connector need no registration and
    touch none: a pooled descriptor, registered with the connector's shared
    connection, stays registered (the reference deregisters it when an
    operation ends)."""
    a, b = pair()
    conn = run(b._create_connection())
    dst = Descriptor(bytearray(16))
    dst.register_with_connector(conn)

    async def main():
        async with a.create_readable(Descriptor(bytes(16))) as readable:
            async with b.begin_read(readable.metadata(), dst) as read:
                await read.wait_for_completion()
            assert read.connection is conn  # the connector's shared one

    run(main())
    assert dst.is_registered
    dst.deregister_with_connector(conn)


def test_data_size_moves_only_the_bytes_it_says():
    a, b = pair()
    pool = bytearray(b"\xee" * 100)
    d = Descriptor(pool)
    assert d._data_size == d.size == 100 and d._data_ptr == d.ptr
    d._data_size = 10
    assert d.size == 10 and d._raw[1] == 10

    async def main():
        async with a.create_readable(Descriptor(b"0123456789")) as readable:
            async with b.begin_read(readable.metadata(), d) as read:
                await read.wait_for_completion()

    run(main())
    assert pool == b"0123456789" + b"\xee" * 90
    d._data_size = 100  # back to the size first described
    assert d.size == 100
    for bad in (101, -1):
        with pytest.raises(ValueError, match="between 0 and 100"):
            d._data_size = bad
    with pytest.raises(TypeError):
        d._data_size = 10.0  # type: ignore[assignment]
    assert d.size == 100
    # A copy keeps the bound of the memory first described.
    d._data_size = 5
    copy = Descriptor(d)
    assert copy.size == 5
    copy._data_size = 100


def test_data_ref_is_the_object_described():
    numpy = pytest.importorskip("numpy")
    buf, data, array = bytearray(8), b"abc", numpy.zeros(4, dtype=numpy.int16)
    assert Descriptor(buf)._data_ref is buf
    assert Descriptor(data)._data_ref is data
    assert Descriptor(array)._data_ref is array
    assert Descriptor((array, "cpu"))._data_ref is array
    assert Descriptor((array.ctypes.data, 8, "cpu", array))._data_ref is array
    assert Descriptor((array.ctypes.data, 8, "cpu"))._data_ref is None
    d = Descriptor(buf)
    assert Descriptor(d)._data_ref is buf
    d._data_ref = "something else"  # reported only: the memory is still held
    assert d._data_ref == "something else" and d.ptr == Descriptor(d).ptr
    del d._data_ref
    assert d._data_ref is None


def test_descriptor_str_as_the_reference_prints_it():
    d = Descriptor((0x1000, 64, "cpu", None))
    assert str(d) == "ptr=0x1000, size=64, device=cpu"
    assert repr(d) == "Descriptor(ptr=0x1000, size=64, device=cpu)"
    assert repr(Descriptor(b"ab")).endswith(", readonly)")
    assert str(Descriptor((0x2000, 8, "cuda:1", None))) == "ptr=0x2000, size=8, device=cuda:1"


def test_descriptor_metadata_and_from_serialized():
    cls = ferry.SerializedDescriptor
    d = Descriptor((0x1000, 64, "cpu", None))
    m = d.metadata  # a property, as in Dynamo 1.6.1
    assert isinstance(m, cls)
    assert (m.device, m.ptr, m.size) == ("cpu", 0x1000, 64)
    d._data_size = 16
    assert d.metadata.size == 16  # follows the size
    back = Descriptor.from_serialized(m)
    assert (back.ptr, back.size, str(back.device), back._data_ref) == (0x1000, 64, "cpu", None)
    with pytest.raises(TypeError):
        Descriptor.from_serialized({"device": "cpu", "ptr": 1, "size": 1})


# ---- 3. exceptions ----


def test_exception_classes():
    for name in (
        "UnreachableError",
        "ConnectionLostError",
        "PeerUnresponsiveError",
        "DigestMismatchError",
        "RejectedError",
        "RemoteCancelledError",
        "OperationCancelledError",
        "ProtocolError",
        "StaleMetadataError",
        "ShutdownError",
    ):
        cls = getattr(ferry, name)
        assert issubclass(cls, ferry.FerryError) and issubclass(cls, RuntimeError), name
    assert issubclass(ferry.UnreachableError, ConnectionError)
    assert issubclass(ferry.ConnectionLostError, ConnectionError)
    # A stopped peer is a lost connection that says why.
    assert issubclass(ferry.PeerUnresponsiveError, ferry.ConnectionLostError)
    assert issubclass(ferry.WrongPairingError, ValueError)
    assert issubclass(ferry.WrongPairingError, RuntimeError)
    assert not issubclass(ferry.WrongPairingError, ferry.FerryError)  # misuse, not a failure
    assert issubclass(ferry.InvalidWorkerIdError, TypeError)
    assert issubclass(ferry.InvalidWorkerIdError, ValueError)


def test_wrong_pairing_is_the_references_runtime_error_and_a_value_error():
    a, b = pair()

    async def main():
        readable = await a.create_readable(Descriptor(bytes(8)))
        writable = await a.create_writable(Descriptor(bytearray(8)))
        with pytest.raises(RuntimeError, match="pair READ with READABLE"):
            await b.begin_read(writable.metadata(), Descriptor(bytearray(8)))
        with pytest.raises(ValueError, match="a WriteOperation needs the metadata of a WritableOperation"):
            await b.begin_write(Descriptor(bytes(8)), readable.metadata())
        with pytest.raises(ferry.WrongPairingError, match="comes from a WritableOperation"):
            ReadOperation(b, writable.metadata(), Descriptor(bytearray(8)))
        # Nothing was disturbed.
        async with b.begin_read(readable.metadata(), Descriptor(bytearray(8))) as read:
            await read.wait_for_completion()
        async with b.begin_write(Descriptor(bytes(8)), writable.metadata()) as write:
            await write.wait_for_completion()
        await readable.wait_for_completion()
        await writable.wait_for_completion()

    run(main())


def test_a_cancelled_transfer_raises_runtime_errors_on_both_sides():
    """Ferry's behaviour, kept where the reference returns None: the side that
    cancels gets OperationCancelledError, the other RemoteCancelledError
    (unless the transfer had already finished); both are RuntimeErrors, which
    callers retry on."""
    a, b = pair()
    size = 64 << 20

    async def main():
        with await a.create_readable(Descriptor(bytearray(8))) as readable:
            readable.cancel()
            with pytest.raises(RuntimeError) as cancelled:
                await readable.wait_for_completion()
            assert isinstance(cancelled.value, ferry.OperationCancelledError)
            assert readable.status == OperationStatus.CANCELLED

        with await a.create_writable(Descriptor(bytearray(size))) as writable:
            write = await b.begin_write(Descriptor(bytes(size)), writable.metadata())
            write.cancel()
            if write.status == OperationStatus.CANCELLED:
                with pytest.raises(RuntimeError) as cancelled:
                    await write.wait_for_completion()
                assert isinstance(cancelled.value, ferry.OperationCancelledError)
            else:  # it had finished already
                assert write.status == OperationStatus.COMPLETE
            try:
                await writable.wait_for_completion(timeout=30)
            except RuntimeError as e:
                assert isinstance(e, ferry.RemoteCancelledError)
                assert writable.status == OperationStatus.CANCELLED

    run(main())


def test_a_failed_transfer_is_a_runtime_error(own_helper):
    """The remote is killed while the bytes move: `wait_for_completion`
    raises ConnectionLostError, which `except RuntimeError` catches (as
    Dynamo's decode workers do, to retry)."""
    size = 256 << 20
    c = Connector(listen="127.0.0.1:0")

    async def main():
        peer = await Peer.connect(own_helper)
        with await c.create_writable(Descriptor(bytearray(size))) as op:
            peer.send("write", metadata=op.metadata().to_json(), sizes=[size], seed=None)
            deadline = time.monotonic() + 30
            while op.status == OperationStatus.INITIALIZED and time.monotonic() < deadline:
                await asyncio.sleep(0.0002)
            own_helper.stop()
            if op.status == OperationStatus.COMPLETE:
                pytest.skip("the transfer finished before the helper could be stopped")
            own_helper.kill()
            caught = None
            try:
                await op.wait_for_completion()
            except RuntimeError as e:
                caught = e
            assert isinstance(caught, ferry.ConnectionLostError)
            assert isinstance(caught, ConnectionError)
            assert op.status == OperationStatus.ERRORED
        await peer.close()

    run(main())


# ---- 4. the operation surface ----


def test_operation_classes_connection_and_remote():
    a, b = pair()

    async def main():
        readable = await a.create_readable(Descriptor(bytes(8)))
        writable = await a.create_writable(Descriptor(bytearray(8)))
        read = await b.begin_read(readable.metadata(), Descriptor(bytearray(8)))
        write = await b.begin_write(Descriptor(bytes(8)), writable.metadata())
        for op in (readable, writable, read, write):
            assert isinstance(op, AbstractOperation)
            assert isinstance(op.connection, Connection)
            assert op.connection is op.connection  # made once
            assert op.connection.connector is op.connector
        assert isinstance(readable, PassiveOperation) and isinstance(writable, PassiveOperation)
        assert isinstance(read, ActiveOperation) and isinstance(write, ActiveOperation)
        assert not isinstance(read, PassiveOperation) and not isinstance(readable, ActiveOperation)
        assert readable.connector is a and read.connector is b
        assert readable.connection.name.startswith(a.name + "-")
        for op in (read, write):
            assert isinstance(op.remote, Remote)
            assert op.remote.name == str(op.remote) == a.name
            assert op.remote.connection is op.connection
            assert op.remote is op.remote
        assert not hasattr(readable, "remote")
        for op in (read, write, readable, writable):
            await op.wait_for_completion()

    run(main())
    for cls in (AbstractOperation, ActiveOperation, PassiveOperation):
        with pytest.raises(TypeError, match="abstract"):
            cls()


def test_operations_made_directly_as_in_the_reference():
    """`ReadableOperation(connection, descriptors)` and the other three, as
    the reference's classes are made (with a Connection, or a Connector)."""
    a, b = pair()
    conn_a = Connection(a, 1)
    conn_b = run(b._create_connection())
    src, dst = b"direct!!", bytearray(8)
    readable = ReadableOperation(conn_a, Descriptor(src))
    assert readable.connection is conn_a and readable.connector is a
    read = ReadOperation(conn_b, readable.metadata(), [Descriptor(dst)])
    assert read.connection is conn_b and read.remote.name == a.name
    run(read.wait_for_completion(timeout=30))
    run(readable.wait_for_completion(timeout=30))
    assert dst == src and read.results()[0].size == 8

    got = bytearray(4)
    writable = WritableOperation(a, Descriptor(got))
    write = WriteOperation(conn_b, Descriptor(b"abcd"), writable.metadata())
    run(write.wait_for_completion(timeout=30))
    run(writable.wait_for_completion(timeout=30))
    assert got == b"abcd"
    with pytest.raises(TypeError, match="Connection"):
        ReadableOperation("nope", Descriptor(src))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="read-only"):
        WritableOperation(a, Descriptor(b"ro"))


def test_a_subclass_connection_is_asked_for_each_operation():
    """A Connector subclass that overrides `_create_connection` gets asked
    before each operation, awaited or entered with a plain `with`, as the
    reference does; Dynamo replaces `Remote._release` the same way."""
    c = PersistentConnector()
    peer = Connector(listen="127.0.0.1:0")

    async def main():
        readable = await c.create_readable(Descriptor(bytes(4)))
        assert c.asked == 1 and readable.connection is c._connection
        with c.create_writable(Descriptor(bytearray(4))) as writable:
            assert c.asked == 2 and writable.connection is c._connection
            async with peer.begin_write(Descriptor(b"wxyz"), writable.metadata()) as w:
                await w.wait_for_completion()
                with w.remote as remote:
                    assert remote.name == c.name
        readable.cancel()

    run(main())

    class Waits(Connector):
        async def _create_connection(self) -> Connection:
            await asyncio.sleep(0)
            return Connection(self, 1)

    w = Waits(listen="127.0.0.1:0")
    assert run(_create(w, b"x")).connection.name == f"{w.name}-1"
    with pytest.raises(RuntimeError, match="waits for something"):
        with w.create_readable(Descriptor(b"x")):
            pass


def test_remote_release_can_be_replaced(monkeypatch):
    released = []
    monkeypatch.setattr(Remote, "_release", lambda self: released.append(self.name))
    c = Connector(listen="127.0.0.1:0")
    conn = Connection(c, 1)
    with Remote(conn, "peer-0") as remote:
        assert (remote.name, remote.connection) == ("peer-0", conn)
    assert released == ["peer-0"]
    assert Remote(conn, b"peer-1").name == "peer-1"
    with pytest.raises(ValueError):
        Remote(conn, "")
    with pytest.raises(TypeError):
        Remote(c, "peer")  # type: ignore[arg-type]


def test_an_active_operation_releases_its_remote_when_it_ends():
    """A read's remote (``read.remote``) holds a reference through the
    read's connection, and the read gives it back when it ends: by leaving
    `with`, or by being dropped."""
    a, b = pair()

    async def main() -> None:
        conn = await b._create_connection()
        src = bytes(range(64))
        for leave_with in (True, False):
            dst = bytearray(64)
            async with a.create_readable(Descriptor(src)) as readable:
                read = ferry.ReadOperation(conn, readable.metadata(), Descriptor(dst))
                assert read.connection is conn
                assert read.remote.name == a.name  # made when first asked for
                assert conn._remote_refs == {a.name: 1}, "the read holds its remote"
                await read.wait_for_completion()
                if leave_with:
                    with read:
                        pass
                else:
                    del read
                    gc.collect()
                assert conn._remote_refs == {}, conn._remote_refs
            assert dst == src

    run(main())
