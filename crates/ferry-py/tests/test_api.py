"""The API in one process: types, descriptors, metadata, operation life cycle."""

from __future__ import annotations

import array
import asyncio
import gc
import os
import pickle
import warnings
import weakref

import buffers
import pytest
from conftest import run

import ferry
from ferry import (
    Connector,
    Descriptor,
    Device,
    DeviceKind,
    OperationKind,
    OperationStatus,
    RdmaMetadata,
)


def pair():
    return Connector(listen="127.0.0.1:0"), Connector(listen="127.0.0.1:0")


def test_enum_numbers_match_the_reference():
    assert [(s.name, int(s)) for s in OperationStatus] == [
        ("UNINITIALIZED", 0),
        ("INITIALIZED", 1),
        ("IN_PROGRESS", 2),
        ("COMPLETE", 3),
        ("CANCELLED", 4),
        ("ERRORED", 5),
    ]
    assert (int(OperationKind.READ), int(OperationKind.WRITE)) == (1, 2)
    assert (int(DeviceKind.HOST), int(DeviceKind.CUDA)) == (1, 2)
    assert str(OperationStatus.IN_PROGRESS) == "PROC" == f"{OperationStatus.IN_PROGRESS}"
    assert str(DeviceKind.HOST) == "cpu"
    assert OperationStatus.COMPLETE == 3


def test_device():
    assert Device("cpu").kind == DeviceKind.HOST and Device("cpu").id == 0
    assert Device("cuda") == Device("cuda:0") == Device((DeviceKind.CUDA, 0))
    d = Device("cuda:3")
    assert (d.kind, d.id, str(d), repr(d)) == (DeviceKind.CUDA, 3, "cuda:3", "Device('cuda:3')")
    assert len({Device("cpu"), Device("cpu"), Device("cuda:1")}) == 2
    for bad in ["gpu0", "cpux", "cuda:", "cuda:-1", "cpu:1", ""]:
        with pytest.raises(ValueError, match="expected"):
            Device(bad)
    with pytest.raises(ValueError):
        Device((DeviceKind.HOST, 2))
    with pytest.raises(TypeError):
        Device(3)  # type: ignore[arg-type]


def test_descriptor_sources():
    numpy = pytest.importorskip("numpy")
    ba = bytearray(b"abc")
    d = Descriptor(ba)
    assert (d.size, d.device, d.readonly) == (3, Device("cpu"), False)
    b = b"hello"
    assert Descriptor(b).readonly and Descriptor(b).size == 5
    a = numpy.arange(10, dtype=numpy.float64)
    d = Descriptor(a)
    assert (d.ptr, d.size, d.readonly) == (a.__array_interface__["data"][0], 80, False)
    assert Descriptor((a, "cpu")).ptr == d.ptr
    assert Descriptor(memoryview(a)).ptr == d.ptr
    assert Descriptor(array.array("i", [1, 2, 3])).size == 12
    f = numpy.asfortranarray(numpy.zeros((3, 4)))
    assert (Descriptor(f).ptr, Descriptor(f).size) == (f.ctypes.data, 96)
    ro_bytes = memoryview(b"hello")
    assert (Descriptor(ro_bytes).size, Descriptor(ro_bytes).readonly) == (5, True)
    assert Descriptor(ro_bytes[1:]).ptr == Descriptor(ro_bytes).ptr + 1
    raw = Descriptor((d.ptr, 80, "cpu", a))
    assert (raw.ptr, raw.size, raw.readonly) == (d.ptr, 80, False)
    assert Descriptor((0, 0)).size == 0
    assert Descriptor(bytearray()).size == 0
    ro = numpy.zeros(4)
    ro.flags.writeable = False
    assert Descriptor(ro).readonly
    with pytest.raises(ValueError, match="not contiguous"):
        Descriptor(numpy.zeros((4, 4))[:, 1])
    with pytest.raises(ValueError, match="not contiguous"):
        Descriptor(memoryview(bytearray(8))[::2])
    with pytest.raises(TypeError):
        Descriptor(3.5)
    with pytest.raises(TypeError):
        Descriptor("text")
    with pytest.raises(ValueError):
        Descriptor(None)
    with pytest.raises(ValueError, match="host memory"):
        Descriptor((a, "cuda:0"))
    with pytest.raises(ValueError, match="null"):
        Descriptor((0, 10, "cpu", None))


def test_descriptor_pins_a_bytearray():
    ba = bytearray(16)
    d = Descriptor(ba)
    with pytest.raises(BufferError):
        ba.extend(b"x")  # would move the memory under an operation
    del d
    gc.collect()
    ba.extend(b"x")


def test_descriptor_keeps_its_object_alive():
    class Buf(bytearray):
        pass

    buf = Buf(8)
    ref = weakref.ref(buf)
    d = Descriptor(buf)
    del buf
    gc.collect()
    assert ref() is not None
    del d
    gc.collect()
    assert ref() is None


def test_metadata_round_trip_and_redaction():
    async def main():
        a, _ = pair()
        with await a.create_readable([Descriptor(bytearray(10)), Descriptor(b"xyz")]) as op:
            m = op.metadata()
            assert m is op.metadata()
            assert m.operation_kind == OperationKind.READ
            assert m.worker_id == a.name and m.hostname == a.hostname
            assert m.descriptors == [
                ferry.SerializedDescriptor(device="cpu", ptr=0, size=10),
                ferry.SerializedDescriptor(device="cpu", ptr=0, size=3),
            ]
            assert m.total_size == 13
            text = m.model_dump_json()
            assert len(text) < 600
            assert RdmaMetadata.model_validate_json(text) == m
            assert RdmaMetadata.model_validate_json(text.encode()) == m
            assert RdmaMetadata.from_json(m.to_json()) == m
            assert RdmaMetadata.model_validate(m.model_dump()) == m
            assert RdmaMetadata(**m.model_dump()) == m
            assert pickle.loads(pickle.dumps(m)) == m
            assert hash(m) == hash(RdmaMetadata.from_json(text))
            token = m.model_dump()["token"]
            assert token not in repr(m) and token not in str(m)
            assert "READ" in repr(m)

    run(main())


def test_in_process_read_and_write():
    async def main():
        a, b = pair()
        src = bytearray(b"x" * 5000)
        async with a.create_readable(Descriptor(src)) as readable:
            dst = bytearray(5000)
            async with b.begin_read(readable.metadata(), Descriptor(dst)) as read:
                await asyncio.gather(read.wait_for_completion(), readable.wait_for_completion())
                assert isinstance(read.transport, str)  # "tcp", or a faster one in one process
            assert dst == src
            assert read.results()[0].size == 5000

        target = bytearray(3)
        with a.create_writable([Descriptor(target)]) as writable:
            # The reference order of arguments works too.
            write = await b.begin_write(writable.metadata(), [Descriptor(b"abc")])
            await write.wait_for_completion()
            await writable.wait_for_completion()
        assert target == b"abc"
        assert a._stats()["exposed"] == 0

    run(main())


def test_leaving_the_block_cancels_and_releases():
    async def main():
        a, b = pair()
        buf = bytearray(64)
        with await a.create_readable(Descriptor(buf)) as op:
            meta = op.metadata()
            assert a._stats()["exposed"] == 1
        assert op.status == OperationStatus.CANCELLED
        assert a._stats()["exposed"] == 0
        with pytest.raises(ferry.OperationCancelledError):
            await op.wait_for_completion()
        # The metadata no longer grants anything.
        async with b.begin_read(meta, Descriptor(bytearray(64))) as read:
            with pytest.raises(ferry.RejectedError, match="ended"):
                await read.wait_for_completion()

        async with a.create_writable(Descriptor(buf)) as op2:
            pass
        assert op2.status == OperationStatus.CANCELLED

        # Dropping an operation cancels it too.
        op3 = await a.create_readable(Descriptor(buf))
        assert a._stats()["exposed"] == 1
        del op3
        gc.collect()
        assert a._stats()["exposed"] == 0

    run(main())


def test_cancel_and_results():
    async def main():
        a, b = pair()
        readable = await a.create_readable(Descriptor(bytearray(1 << 20)))
        writable = await a.create_writable(Descriptor(bytearray(16)))
        readable.cancel()
        readable.cancel()  # idempotent
        assert readable.status == OperationStatus.CANCELLED
        with pytest.raises(ferry.OperationCancelledError):
            await readable.wait_for_completion()
        read = await b.begin_read(readable.metadata(), Descriptor(bytearray(1 << 20)))
        with pytest.raises(ferry.RejectedError):
            await read.wait_for_completion()
        with pytest.raises(RuntimeError, match="ERRORED"):
            read.results()
        write = await b.begin_write(Descriptor(bytes(16)), writable.metadata())
        await write.wait_for_completion()
        write.cancel()  # completed operations stay complete
        assert write.status == OperationStatus.COMPLETE

    run(main())


def test_deadlines():
    async def main():
        a, _ = pair()
        with await a.create_readable(Descriptor(bytearray(8))) as op:
            with pytest.raises(TimeoutError):
                await op.wait_for_completion(timeout=0.05)
            # asyncio's own deadline cancels only the wait, not the operation.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(op.wait_for_completion(), 0.05)
            assert op.status == OperationStatus.INITIALIZED
            with pytest.raises(ValueError):
                await op.wait_for_completion(timeout=-1)

    run(main())


def test_waiting_does_not_block_the_loop():
    async def main():
        a, b = pair()
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.ensure_future(ticker())
        with await a.create_readable(Descriptor(bytearray(16))) as op:
            waiting = asyncio.ensure_future(op.wait_for_completion())
            await asyncio.sleep(0.1)
            assert not waiting.done() and ticks > 10
            async with b.begin_read(op.metadata(), Descriptor(bytearray(16))) as r:
                await r.wait_for_completion()
            await waiting
        t.cancel()

    run(main())


def test_misuse_errors():
    async def main():
        a, b = pair()
        with pytest.raises(TypeError, match="Descriptor"):
            a.create_readable(bytearray(4))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"local_descriptors\[1\]"):
            a.create_readable([Descriptor(bytearray(4)), b"x"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="no descriptors"):
            await a.create_readable([])
        with pytest.raises(TypeError, match="RdmaMetadata"):
            b.begin_read("{}", Descriptor(bytearray(4)))  # type: ignore[arg-type]
        with pytest.raises(ferry.DeviceMemoryError, match="descriptor 0 is on cuda:0"):
            await a.create_readable(Descriptor((1 << 20, 4096, "cuda:0", None)))
        with pytest.raises(TypeError):
            Connector(worker_id=5)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            Connector(worker_id="")
        with pytest.raises(ValueError, match="ip:port"):
            Connector(listen="nowhere")
        with pytest.raises(TypeError):
            ferry.ReadOperation()
        pending = a.create_readable(Descriptor(bytearray(4)))
        op = await pending
        with pytest.raises(RuntimeError, match="already started"):
            await pending
        op.cancel()

    run(main())


def test_connector_properties():
    c = Connector("prefill-0", listen="127.0.0.1:0")
    assert c.name == "prefill-0" == str(c)
    assert isinstance(c.hostname, str) and c.hostname
    assert c.is_cuda_available is False
    assert c.address.startswith("127.0.0.1:")
    assert "prefill-0" in repr(c)
    assert len(Connector().name) == 32
    run(c.initialize())


def test_operation_keeps_connector_alive():
    async def main():
        a, b = pair()
        ref = weakref.ref(a)
        readable = await a.create_readable(Descriptor(bytearray(32)))
        del a
        gc.collect()
        assert ref() is not None
        async with b.begin_read(readable.metadata(), Descriptor(bytearray(32))) as r:
            await r.wait_for_completion()

    run(main())


def test_blocking_with_outside_asyncio():
    """`with connector.begin_read(...)` works without a running loop too."""
    a, b = pair()
    src = bytes(range(256))
    with a.create_readable(Descriptor(src)) as readable:
        dst = bytearray(256)
        with b.begin_read(readable.metadata(), Descriptor(dst)) as read:
            read._op.wait_blocking(10)
        assert dst == src


def test_version():
    assert isinstance(ferry.__version__, str) and ferry.__version__.count(".") == 2


def test_event_loops_come_and_go_without_leaking():
    """Each event loop gets its own mailbox, released with the loop."""
    a, b = pair()

    async def once():
        with await a.create_readable(Descriptor(bytearray(64))) as readable:
            waiting = asyncio.ensure_future(readable.wait_for_completion())
            async with b.begin_read(readable.metadata(), Descriptor(bytearray(64))) as read:
                await read.wait_for_completion()
            await waiting

    run(once())
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(30):
        run(once())
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_forked_child_is_refused():
    Connector(listen="127.0.0.1:0")  # the runtime is running in this process
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded": that is the point
        pid = os.fork()
    if pid == 0:  # the child: ferry's threads are not here
        try:
            Connector(listen="127.0.0.1:0")
            code = 1
        except RuntimeError as e:
            code = 0 if "fork" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_overlapping_operations_are_refused():
    """Two operations in progress may share memory only if neither writes it."""
    numpy = pytest.importorskip("numpy")

    async def main():
        a, b = pair()
        buf = bytearray(1024)
        source = await b.create_readable(Descriptor(bytes(1024)))
        other = await b.create_readable(Descriptor(bytes(1024)))
        with await a.create_writable(Descriptor(buf)) as writable:
            # Written by the writable: nobody else may use it meanwhile.
            with pytest.raises(ValueError, match="overlaps memory that an operation in progress writes") as refused:
                await a.begin_read(source.metadata(), Descriptor(buf))
            # One line, words one space apart.
            assert "  " not in str(refused.value) and "\n" not in str(refused.value)
            with pytest.raises(ValueError, match="overlaps"):
                await a.create_readable(Descriptor(memoryview(buf)))
        # The writable was cancelled on leaving the block: the memory is free.
        async with a.begin_read(source.metadata(), Descriptor(buf)) as read:
            await read.wait_for_completion()
        # `read` ended (it is still referenced): the memory is free again.
        async with a.begin_read(other.metadata(), Descriptor(buf)) as read2:
            await read2.wait_for_completion()

        # Sources may share memory; disjoint slices of one array are fine.
        data = numpy.zeros(100, dtype=numpy.uint8)
        r1 = await a.create_readable(Descriptor(data))
        r2 = await a.create_readable(Descriptor(data))
        with pytest.raises(ValueError, match="overlaps memory that an operation in progress reads"):
            await a.create_writable(Descriptor(data[50:]))
        r1.cancel()
        r2.cancel()
        w = await a.create_writable(Descriptor(data[50:]))
        w.cancel()

    run(main())

    async def disjoint():
        a, _ = pair()
        data = numpy.zeros(100, dtype=numpy.uint8)
        w1 = await a.create_writable(Descriptor(data[:50]))
        w2 = await a.create_writable(Descriptor(data[50:]))
        with pytest.raises(ValueError, match="descriptors 0 and 1 overlap"):
            await a.create_writable([Descriptor(data[60:70]), Descriptor(data[65:80])])
        r = await a.create_readable([Descriptor(b"abc"), Descriptor(b"abc")])  # bytes may repeat
        for op in (w1, w2, r):
            op.cancel()

    run(disjoint())
