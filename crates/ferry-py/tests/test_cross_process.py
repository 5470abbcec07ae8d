"""Two Python processes: this one and tests/helper.py, exchanging RdmaMetadata
JSON over a loopback socket."""

from __future__ import annotations

import asyncio
import time

import buffers
import pytest
from conftest import Peer, run

import ferry
from ferry import Descriptor, OperationStatus, RdmaMetadata

SIZES = [1, 4096, 1 << 20]


def connector() -> ferry.Connector:
    return ferry.Connector(listen="127.0.0.1:0")


@pytest.mark.parametrize("kind", buffers.WRITABLE_KINDS)
def test_read_from_remote_readable(helper, kind):
    """The helper exposes; this process reads into buffers of `kind` (a
    read-only one cannot be a destination: see test_read_only_destination)."""

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=SIZES, kind="bytearray", seed=11)
        meta = RdmaMetadata.model_validate_json((await peer.expect(rid, "metadata"))["metadata"])
        assert meta.operation_kind == ferry.OperationKind.READ
        assert [d.size for d in meta.descriptors] == SIZES
        bufs = buffers.make(kind, SIZES, None)
        async with await c.begin_read(meta, [buffers.descriptor(kind, b) for b in bufs]) as op:
            await op.wait_for_completion()
            assert op.status == OperationStatus.COMPLETE
            assert [d.size for d in op.results()] == SIZES
        assert buffers.verify(kind, bufs, 11)
        done = await peer.expect(rid, "done")
        assert done["status"] == "COMPLETE" and done["error"] is None
        await peer.close()

    run(main())


@pytest.mark.parametrize("kind", buffers.WRITABLE_KINDS + buffers.READONLY_KINDS)
def test_remote_reads_local_readable(helper, kind):
    """This process exposes buffers of `kind` (bytes included); the helper reads."""

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        bufs = buffers.make(kind, SIZES, 12)
        with await c.create_readable([buffers.descriptor(kind, b) for b in bufs]) as op:
            assert op.status == OperationStatus.INITIALIZED
            done = await peer.request("read", metadata=op.metadata().model_dump_json(), sizes=SIZES, seed=12)
            await op.wait_for_completion()
            assert op.status == OperationStatus.COMPLETE
        assert done["status"] == "COMPLETE" and done["verified"], done
        assert c._stats()["exposed"] == 0
        await peer.close()

    run(main())


@pytest.mark.parametrize("kind", buffers.WRITABLE_KINDS + buffers.READONLY_KINDS)
def test_write_into_remote_writable(helper, kind):
    """The helper exposes zeroed buffers; this process writes from `kind` (bytes included)."""

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("writable", sizes=SIZES, kind="numpy", seed=13)
        meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        assert meta.operation_kind == ferry.OperationKind.WRITE
        bufs = buffers.make(kind, SIZES, 13)
        op = await c.begin_write([buffers.descriptor(kind, b) for b in bufs], meta)
        with op:
            await op.wait_for_completion()
        assert op.status == OperationStatus.COMPLETE
        done = await peer.expect(rid, "done")
        assert done["status"] == "COMPLETE" and done["verified"], done
        await peer.close()

    run(main())


@pytest.mark.parametrize("kind", buffers.WRITABLE_KINDS)
def test_remote_writes_local_writable(helper, kind):
    """This process exposes zeroed buffers of `kind`; the helper writes."""

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        bufs = buffers.make(kind, SIZES, None)
        async with c.create_writable([buffers.descriptor(kind, b) for b in bufs]) as op:
            done = await peer.request("write", metadata=op.metadata().to_json(), sizes=SIZES, kind="memoryview", seed=14)
            await op.wait_for_completion()
        assert done["status"] == "COMPLETE", done
        assert buffers.verify(kind, bufs, 14)
        await peer.close()

    run(main())


def test_large_transfer_both_ways(helper):
    """64 MiB in 3 descriptors, read then written back, every byte checked."""
    sizes = [(32 << 20) + 3, 1, (32 << 20) - 4]

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=sizes, kind="numpy", seed=21)
        meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        bufs = buffers.make("numpy", sizes, None)
        with await c.begin_read(meta, [Descriptor(b) for b in bufs]) as op:
            await op.wait_for_completion()
        assert buffers.verify("numpy", bufs, 21)
        assert (await peer.expect(rid, "done"))["status"] == "COMPLETE"

        rid = peer.send("writable", sizes=sizes, kind="bytearray", seed=21)
        meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        with await c.begin_write([Descriptor(b) for b in bufs], meta) as op:
            await op.wait_for_completion()
        done = await peer.expect(rid, "done")
        assert done["status"] == "COMPLETE" and done["verified"], done
        await peer.close()

    run(main())


def test_thousand_concurrent_operations(helper):
    """1,000 concurrent 4 KiB reads, then 1,000 concurrent 4 KiB writes into
    this process, all from one asyncio loop with asyncio.gather."""
    n, size = 1000, 4096

    async def main():
        c = connector()
        peer = await Peer.connect(helper)

        # 1,000 reads of the helper's readables.
        rid = peer.send("readable_many", count=n, size=size, seed=31)
        metas = [RdmaMetadata.from_json(m) for m in (await peer.expect(rid, "metadata"))["metadata"]]
        bufs = [bytearray(size) for _ in range(n)]
        ops = await asyncio.gather(*(c.begin_read(m, Descriptor(b)) for m, b in zip(metas, bufs)))
        await asyncio.gather(*(op.wait_for_completion() for op in ops))
        assert all(op.status == OperationStatus.COMPLETE for op in ops)
        assert all(bytes(b) == buffers.pattern(31, i, size) for i, b in enumerate(bufs))
        done = await peer.expect(rid, "done")
        assert done["completed"] == n, done

        # 1,000 writables here, written concurrently by the helper.
        bufs = [bytearray(size) for _ in range(n)]
        ops = await asyncio.gather(*(c.create_writable(Descriptor(b)) for b in bufs))
        rid = peer.send("write_many", metadata=[op.metadata().to_json() for op in ops], size=size, seed=32)
        await asyncio.gather(*(op.wait_for_completion() for op in ops))
        done = await peer.expect(rid, "done")
        assert done["completed"] == n, done
        assert all(bytes(b) == buffers.pattern(32, i, size) for i, b in enumerate(bufs))
        for op in ops:
            op.__exit__(None, None, None)
        assert c._stats()["exposed"] == 0
        await peer.close()

    run(main())


# ---- misuse and failures across processes ----


def test_wrong_pairing(helper):
    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=[64], seed=1)
        readable_meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        with pytest.raises(ValueError, match="pair READ with READABLE"):
            await c.begin_write(Descriptor(bytearray(64)), readable_meta)
        rid2 = peer.send("writable", sizes=[64], seed=1)
        writable_meta = RdmaMetadata.from_json((await peer.expect(rid2, "metadata"))["metadata"])
        with pytest.raises(ValueError, match="WritableOperation"):
            await c.begin_read(writable_meta, Descriptor(bytearray(64)))
        # Nothing was disturbed: both can still be completed.
        async with c.begin_read(readable_meta, Descriptor(bytearray(64))) as op:
            await op.wait_for_completion()
        async with c.begin_write(Descriptor(buffers.pattern(1, 0, 64)), writable_meta) as op:
            await op.wait_for_completion()
        assert (await peer.expect(rid, "done"))["status"] == "COMPLETE"
        assert (await peer.expect(rid2, "done"))["verified"]
        await peer.close()

    run(main())


def test_size_and_count_mismatch(helper):
    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=[100, 200], seed=2)
        meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        with pytest.raises(ValueError, match="descriptor 1 is 201 bytes locally but 200 bytes at the remote"):
            await c.begin_read(meta, [Descriptor(bytearray(100)), Descriptor(bytearray(201))])
        with pytest.raises(ValueError, match="counts must match"):
            await c.begin_read(meta, Descriptor(bytearray(100)))
        async with c.begin_read(meta, [Descriptor(bytearray(100)), Descriptor(bytearray(200))]) as op:
            await op.wait_for_completion()
        assert (await peer.expect(rid, "done"))["status"] == "COMPLETE"
        await peer.close()

    run(main())


def test_read_only_destination(helper):
    numpy = pytest.importorskip("numpy")

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=[16], seed=3)
        meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        frozen = numpy.zeros(16, dtype=numpy.uint8)
        frozen.flags.writeable = False
        for ro in (b"0123456789abcdef", memoryview(b"x" * 20)[2:18], frozen):
            d = Descriptor(ro)
            assert d.readonly
            with pytest.raises(ValueError, match="read-only"):
                await c.begin_read(meta, d)
            with pytest.raises(ValueError, match="read-only"):
                with c.create_writable(d):
                    pass
        with pytest.raises(ValueError, match="read-only"):
            c.begin_read(meta, Descriptor(b"0123456789abcdef"))  # refused at once, before awaiting
        await peer.close()

    run(main())


def test_bad_metadata_json():
    for bad in ["", "not json", "{}", '{"version": 1}', "[]", b"\xff\xfe", '{"version": 99}']:
        with pytest.raises(ValueError):
            RdmaMetadata.model_validate_json(bad)
    with pytest.raises(TypeError):
        RdmaMetadata.model_validate_json(42)  # type: ignore[arg-type]


def test_tampered_metadata_is_rejected(helper):
    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=[64], seed=4)
        good = (await peer.expect(rid, "metadata"))["metadata"]
        fields = RdmaMetadata.from_json(good).model_dump()
        fields["token"] = "0" * 32
        forged = RdmaMetadata.model_validate(fields)
        async with c.begin_read(forged, Descriptor(bytearray(64))) as op:
            with pytest.raises(ferry.RejectedError, match="token"):
                await op.wait_for_completion()
            assert op.status == OperationStatus.ERRORED
        # The real owner of the metadata still gets its bytes.
        async with c.begin_read(RdmaMetadata.from_json(good), Descriptor(bytearray(64))) as op:
            await op.wait_for_completion()
        assert (await peer.expect(rid, "done"))["status"] == "COMPLETE"
        await peer.close()

    run(main())


def test_remote_dead_before_begin(own_helper):
    async def main():
        c = connector()
        peer = await Peer.connect(own_helper)
        rid = peer.send("writable", sizes=[4096], seed=5)
        meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        own_helper.kill()
        with pytest.raises(ferry.FerryError) as info:
            async with c.begin_write(Descriptor(bytearray(4096)), meta) as op:
                await op.wait_for_completion()
        assert isinstance(info.value, ConnectionError), info.value
        await peer.close()

    run(main())


def test_remote_killed_mid_transfer(own_helper):
    """The helper writes 256 MiB into this process and is killed (SIGKILL)
    while the bytes move: the writable here fails with ConnectionLostError."""
    size = 256 << 20

    async def main():
        c = connector()
        peer = await Peer.connect(own_helper)
        buf = bytearray(size)
        with await c.create_writable(Descriptor(buf)) as op:
            peer.send("write", metadata=op.metadata().to_json(), sizes=[size], seed=None)
            deadline = time.monotonic() + 30
            while op.status == OperationStatus.INITIALIZED and time.monotonic() < deadline:
                await asyncio.sleep(0.0002)
            own_helper.stop()  # SIGSTOP: the transfer freezes where it is
            if op.status == OperationStatus.COMPLETE:
                pytest.skip("the transfer finished before the helper could be stopped")
            assert op.status == OperationStatus.IN_PROGRESS
            own_helper.kill()
            with pytest.raises(ferry.ConnectionLostError):
                await op.wait_for_completion()
            assert op.status == OperationStatus.ERRORED
        await peer.close()

    run(main())


def test_remote_cancel_is_seen_by_passive_side(helper):
    """The helper starts reading 64 MiB and cancels at once: the readable here
    learns it (RemoteCancelledError), unless the read had already finished."""
    size = 64 << 20

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        with await c.create_readable(Descriptor(bytes(size))) as op:
            done = await peer.request("read", metadata=op.metadata().to_json(), sizes=[size], cancel=True)
            assert done["status"] == "CANCELLED", done
            try:
                await op.wait_for_completion(timeout=10)
            except ferry.RemoteCancelledError:
                assert op.status == OperationStatus.CANCELLED
            else:
                assert op.status == OperationStatus.COMPLETE
        await peer.close()

    run(main())


def test_local_cancel_is_seen_by_remote(helper):
    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("writable", sizes=[128], seed=7)
        meta = RdmaMetadata.from_json((await peer.expect(rid, "metadata"))["metadata"])
        # Leaving the block before waiting cancels; the helper's writable
        # may have been written already, or learns of the cancellation.
        with c.begin_write(Descriptor(bytearray(128)), meta):
            pass
        done = await peer.expect(rid, "done")
        assert done["status"] in ("COMPLETE", "CANCELLED"), done
        if done["status"] == "CANCELLED":
            assert "RemoteCancelledError" in done["error"]
        await peer.close()

    run(main())
