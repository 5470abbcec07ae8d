"""Registered pools and paged descriptors: ferry.Pool, pool.blocks(ids)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import run

import ferry
from ferry import (
    BlockBusyError,
    BlockIdTypeError,
    BlockRangeError,
    BlockSliceError,
    DescriptorInfo,
    Device,
    PagedDescriptor,
    Pool,
    PoolError,
    RdmaMetadata,
)


def connector() -> ferry.Connector:
    return ferry.Connector(listen="127.0.0.1:0")


def patterned(n: int, block: int) -> np.ndarray:
    """Block i holds bytes i*7+j (mod 256)."""
    a = (np.arange(n, dtype=np.uint32)[:, None] * 7 + np.arange(block, dtype=np.uint32)[None, :]) % 251
    return a.astype(np.uint8)


def test_bench_kv_tiny_reads_and_writes_between_two_processes():
    """Paged READ and WRITE between two Python processes, random block
    lists on both sides, 1 and 4 operations in flight, every byte checked
    (by ferry.bench_kv itself: it fails otherwise)."""
    out = subprocess.run(
        [sys.executable, "-m", "ferry.bench_kv", "--tiny", "--ferry", "none"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every byte checked" in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("tiny-")]
    assert {(r[0], r[2]) for r in rows} == {("tiny-read", "1"), ("tiny-read", "4"), ("tiny-write", "1"), ("tiny-write", "4")}
    assert all(r[3] in ("cma", "tcp") for r in rows), rows


@pytest.mark.parametrize("write", [False, True])
def test_random_blocks_byte_for_byte(write):
    """READ (the remote exposes a readable) and WRITE (a writable), random
    block lists on both sides, with plain descriptors in the same operation."""
    n, block = 256, 4096
    rng = np.random.default_rng(5 + write)

    async def main():
        a, b = connector(), connector()
        src = patterned(n, block)
        dst = np.zeros((n, block), np.uint8)
        extra_src, extra_dst = bytearray(b"x" * 100), bytearray(100)
        ps, pd = Pool(src), Pool(dst)
        assert (ps.block_size, ps.block_count, pd.size) == (block, n, n * block)
        src_ids = rng.permutation(n)[:200]
        dst_ids = rng.permutation(n)[:200]
        if not write:
            with await a.create_readable([ps.shared_blocks(src_ids), ferry.Descriptor(extra_src)]) as r:
                meta = r.metadata()
                async with await b.begin_read(meta, [pd.blocks(dst_ids), ferry.Descriptor(extra_dst)]) as op:
                    await op.wait_for_completion()
                await r.wait_for_completion()
        else:
            with await b.create_writable([pd.blocks(dst_ids), ferry.Descriptor(extra_dst)]) as w:
                meta = w.metadata()
                async with await a.begin_write([ps.shared_blocks(src_ids), ferry.Descriptor(extra_src)], meta) as op:
                    await op.wait_for_completion()
                await w.wait_for_completion()
        assert meta.descriptor_count == 201
        assert meta.descriptor_runs == [
            (ferry.SerializedDescriptor(device="cpu", size=block), 200),
            (ferry.SerializedDescriptor(device="cpu", size=100), 1),
        ]
        assert np.array_equal(dst[dst_ids], src[src_ids])
        untouched = np.setdiff1d(np.arange(n), dst_ids)
        assert not dst[untouched].any()
        assert extra_dst == extra_src

    run(main())


def test_head_slices_and_sequences_of_ints():
    """offset/length take part of each block; ids may be a list or a range."""
    n, block = 16, 1024

    async def main():
        a, b = connector(), connector()
        src, dst = patterned(n, block), np.zeros((n, block), np.uint8)
        ps, pd = Pool(src), Pool(dst.reshape(-1), block_size=block)
        with await a.create_readable(ps.shared_blocks([3, 1, 2], offset=256, length=512)) as r:
            d = pd.blocks(range(10, 13), offset=0, length=512)
            assert (d.block_count, d.size, d.offset, d.length) == (3, 1536, 0, 512)
            assert list(d.ids) == [10, 11, 12]
            async with await b.begin_read(r.metadata(), d) as op:
                await op.wait_for_completion()
        for k, s in enumerate([3, 1, 2]):
            assert np.array_equal(dst[10 + k, :512], src[s, 256:768])
            assert not dst[10 + k, 512:].any()

    run(main())


def test_metadata_is_compact_for_many_blocks():
    n = 16_384
    pool = Pool(np.zeros((n, 64), np.uint8))

    async def main():
        c = connector()
        ids = np.random.default_rng(1).permutation(n)
        with await c.create_readable(pool.shared_blocks(ids)) as r:
            m = r.metadata()
            assert len(m.to_json()) < 1000
            assert m.descriptor_count == n and m.total_size == n * 64
            assert m.descriptor_runs == [(ferry.SerializedDescriptor(device="cpu", size=64), n)]
            assert "descriptors=16384" in repr(m)
            back = RdmaMetadata.model_validate_json(m.model_dump_json())
            assert back == m
            # The reference's fields, with one entry per block, still check.
            infos = m.descriptors
            assert len(infos) == n
            assert RdmaMetadata(nixl_metadata=m.nixl_metadata, descriptors=infos) == m
            with pytest.raises(ValueError, match="do not match"):
                RdmaMetadata(nixl_metadata=m.nixl_metadata, descriptors=infos[:-1])

    run(main())


def test_hostile_ids_and_slices_are_refused():
    pool = Pool(np.zeros((8, 64), np.uint8))
    range_errors = [
        [8],
        [0, 1, 1 << 40],
        [-1],
        np.array([0, 8]),
        np.array([3, -2], np.int64),
        np.array([-1], np.int8),
        np.array([1 << 33], np.uint64),
        [2**70],
    ]
    for ids in range_errors:
        with pytest.raises(BlockRangeError) as e:
            pool.blocks(ids)
        assert isinstance(e.value, (PoolError, IndexError, ValueError))
    type_errors = [
        np.array([1.0, 2.0]),
        np.array([True]),
        np.array(["1"]),
        np.array([1], dtype=object),
        [1.0],
        [True],
        ["1"],
        "12",
        b"\x00\x00\x00\x00",
        bytearray(4),
        None,
        3,
        {1: 2},
    ]
    for ids in type_errors:
        with pytest.raises(BlockIdTypeError) as e2:
            pool.blocks(ids)
        assert isinstance(e2.value, TypeError) and isinstance(e2.value, PoolError)
    with pytest.raises(PoolError, match="block ids given"):
        pool.blocks([])
    with pytest.raises(PoolError, match="block ids given"):
        pool.blocks(np.array([], np.int64))
    for offset, length in [(0, 65), (65, None), (60, 8), (2**63 - 1, 2), (2**64, None), (-1, None), (0, -1), (2**64 - 1, 2)]:
        with pytest.raises(BlockSliceError):
            pool.blocks([0], offset=offset, length=length)
    with pytest.raises(TypeError):
        pool.blocks([0], offset=1.5)  # type: ignore[arg-type]
    for block in (0, -4, 8 * 64 + 1):
        with pytest.raises((PoolError, ValueError)):
            Pool(np.zeros((8, 64), np.uint8), block_size=block)
    with pytest.raises(TypeError):
        Pool(np.zeros((8, 64), np.uint8), block_size="64")  # type: ignore[arg-type]
    raw = np.zeros(64, np.uint8)
    with pytest.raises(TypeError, match="block_size is needed"):
        Pool((raw.ctypes.data, 64, "cpu", raw))  # raw memory has no first dimension
    assert Pool((raw.ctypes.data, 64, "cpu", raw), block_size=16).block_count == 4
    with pytest.raises(TypeError):
        PagedDescriptor()
    with pytest.raises(TypeError):
        type("Sub", (PagedDescriptor,), {})


def test_read_only_pools_and_readonly_blocks():
    ro = Pool(bytes(4096), block_size=1024)
    assert ro.readonly and ro.block_count == 4
    with pytest.raises(PoolError, match="read-only"):
        ro.blocks([0])
    shared = ro.shared_blocks([0, 1])
    assert shared.readonly

    async def main():
        c = connector()
        with await c.create_readable(ferry.Descriptor(bytearray(2048))) as r:
            with pytest.raises(ValueError, match="read-only"):
                await c.begin_read(r.metadata(), shared)
        with pytest.raises(ValueError, match="read-only"):
            await c.create_writable(shared)
        with await c.create_readable(shared) as r2:  # a readable only reads it
            assert r2.metadata().total_size == 2048

    run(main())


def test_blocks_are_held_while_an_operation_is_in_progress():
    """A writing operation excludes others on its blocks, readers share
    them; blocks are free again once the operation has ended, even while
    its Python object lives. Other descriptors over the pool's memory
    conflict with the pool's operations."""
    arr = np.zeros((8, 64), np.uint8)
    pool = Pool(arr)

    async def main():
        c = connector()
        w = await c.create_writable(pool.blocks([1, 2]))
        with pytest.raises(BlockBusyError, match="block 2"):
            await c.create_writable(pool.blocks([2, 3]))
        with pytest.raises(BlockBusyError):
            await c.create_readable(pool.blocks([1]))
        with pytest.raises(ValueError, match="overlaps memory"):
            await c.create_readable(ferry.Descriptor(arr))
        other = await c.create_writable(pool.blocks([3, 4]))  # other blocks: fine
        with pytest.raises(BlockBusyError, match="named twice"):
            await c.create_writable(pool.blocks([5, 5]))
        r1 = await c.create_readable(pool.shared_blocks([5, 6]))
        r2 = await c.create_readable(pool.blocks([5, 6, 6]))  # readers share, even twice
        with pytest.raises(BlockBusyError):
            await c.create_writable(pool.blocks([6]))
        w.cancel()
        w2 = await c.create_writable(pool.blocks([1, 2]))  # w ended: free again
        for op in (w, w2, other, r1, r2):
            op.cancel()
        with await c.create_writable(pool.blocks([1, 2, 3, 4, 5, 6])):
            pass
        with await c.create_readable(ferry.Descriptor(arr)):
            pass

    run(main())


def test_operations_from_a_connection_register_paged_descriptors():
    pool = Pool(bytearray(4096), block_size=512)

    async def main():
        c = connector()
        conn = await c._create_connection()
        d = pool.blocks([1, 0])
        with ferry.ReadableOperation(conn, [d]) as op:
            assert d.is_registered
            assert op.metadata().descriptor_count == 2
        assert not d.is_registered

    run(main())


def test_mismatched_block_sizes_are_refused():
    async def main():
        a, b = connector(), connector()
        with await a.create_readable(Pool(bytearray(4096), block_size=1024).shared_blocks([0, 1])) as r:
            with pytest.raises(ValueError):
                await b.begin_read(r.metadata(), Pool(bytearray(4096), block_size=512).blocks([0, 1, 2, 3]))

    run(main())
