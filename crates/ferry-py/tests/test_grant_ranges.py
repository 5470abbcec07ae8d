"""Byte ranges and bare notifications on a standing grant, from Python:
ranges at odd offsets and lengths read and written (every byte of both
buffers checked, so the bytes around each range are untouched), refusals
typed with nothing moved, and the owner's notifications in order with
their kinds. Both sides in this process (cross-memory attach)."""

from __future__ import annotations

from typing import List, Tuple

import pytest
from conftest import run

import ferry
from ferry import BlockRange, BlockRef, NotificationKind, OperationKind, Pool

BS = 4096


def pattern(n: int, seed: int) -> bytearray:
    return bytearray((k * 7 + seed) % 251 for k in range(n))


def apply(dst: bytearray, src: bytes, moves: List[Tuple[int, int, int]]) -> None:
    for s, d, n in moves:
        dst[d : d + n] = src[s : s + n]


def test_ranges_move_every_byte_and_notify_in_order() -> None:
    async def main() -> None:
        owner = ferry.Connector("range-owner-0")
        me = ferry.Connector("range-holder-0")
        theirs = pattern(8 * BS, 1)
        pool = Pool(theirs, BS)
        grant = owner.grant(pool, "read_write", holder="range-holder-0")
        remote = await me.open_grant(grant.metadata())
        ours = bytearray(b"\xee" * 4 * BS)
        mine = Pool(ours, BS)
        # READ: tuples, BlockRange and a pinned generation; into disjoint
        # places.
        ranges = [(2, 1, 1), BlockRange(BlockRef(5, 0), BS - 9, 9), BlockRange(7, 0, BS), (0, 100, 1000)]
        local = [(0, 0), (0, 1), (1, 0), (3, 5)]
        want = bytearray(ours)
        apply(want, bytes(theirs), [(2 * BS + 1, 0, 1), (6 * BS - 9, 1, 9), (7 * BS, BS, BS), (100, 3 * BS + 5, 1000)])
        before = bytes(theirs)
        await remote.read_ranges(ranges, mine, local, notify=b"read")
        assert ours == want
        assert bytes(theirs) == before
        # WRITE: blocking form, overlapping local places.
        want_theirs = bytearray(theirs)
        apply(want_theirs, bytes(ours), [(10, 3 * BS + 3, 50), (10, 4 * BS, 7)])
        remote.write_ranges_blocking(mine, [(0, 10), (0, 10)], [(3, 3, 50), (4, 0, 7)], notify=b"write")
        assert theirs == want_theirs
        await remote.notify(b"hello")
        remote.notify_blocking(b"")
        got = [await grant.next_notification() for _ in range(4)]
        assert [(n.seq, n.kind, n.first_block, n.block_count, n.payload) for n in got if n] == [
            (1, NotificationKind.READ, 2, 4, b"read"),
            (2, NotificationKind.WRITE, 3, 2, b"write"),
            (3, NotificationKind.MESSAGE, 0, 0, b"hello"),
            (4, NotificationKind.MESSAGE, 0, 0, b""),
        ]
        # READ and WRITE equal OperationKind's (an IntEnum each).
        assert got[1] is not None and int(got[1].kind) == OperationKind.WRITE
        assert got[0] is not None and str(got[0].kind) == "read"
        assert grant.poll_notification() is None

    run(main())


def test_bad_ranges_are_refused_with_nothing_moved() -> None:
    async def main() -> None:
        owner = ferry.Connector("range-owner-1")
        me = ferry.Connector("range-holder-1")
        theirs = pattern(4 * BS, 3)
        pool = Pool(theirs, BS)
        grant = owner.grant(pool, "read_write", holder="range-holder-1")
        remote = await me.open_grant(grant.metadata())
        ours = pattern(2 * BS, 4)
        mine = Pool(ours, BS)
        snapshot = (bytes(theirs), bytes(ours))

        def unchanged() -> None:
            assert (bytes(theirs), bytes(ours)) == snapshot

        # Misuse (ValueError): a range past its block's end, or empty...
        with pytest.raises(ValueError, match="4097"):
            await remote.write_ranges(mine, [(0, 0)], [(1, BS - 3, 4)])
        with pytest.raises(ValueError):
            await remote.read_ranges([(1, 0, 0)], mine, [(0, 0)])
        with pytest.raises(ferry.GrantBlockRangeError):
            await remote.read_ranges([(4, 0, 1)], mine, [(0, 0)])
        # ...a local place past its block's end, or overlapping another.
        with pytest.raises(ValueError):
            await remote.read_ranges([(1, 0, 10)], mine, [(0, BS - 9)])
        with pytest.raises(ferry.BlockRangeError):  # local block past the pool
            await remote.read_ranges([(1, 0, 10)], mine, [(2, 0)])
        with pytest.raises(ValueError):
            await remote.read_ranges([(1, 0, 10), (2, 0, 10)], mine, [(0, 0), (0, 5)])
        with pytest.raises(ValueError):
            await remote.read_ranges([(1, -1, 10)], mine, [(0, 0)])
        with pytest.raises(TypeError, match="BlockRange alone"):
            await remote.read_ranges(BlockRange(1, 0, 1), mine, [(0, 0)])  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await remote.read_ranges([(1, 0)], mine, [(0, 0)])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="256"):
            await remote.notify(b"x" * 257)
        unchanged()
        # A retired generation: refused, nothing lands.
        fresh = await grant.retire([2])
        with pytest.raises(ferry.StaleGenerationError):
            await remote.write_ranges(mine, [(0, 0), (0, 8)], [(1, 0, 8), ((2, 0), 100, 8)], notify=b"x")
        unchanged()
        assert grant.poll_notification() is None
        await remote.write_ranges(mine, [(0, 0)], [BlockRange(fresh[0], 100, 8)])
        assert bytes(theirs[2 * BS + 100 : 2 * BS + 108]) == bytes(ours[:8])
        # Rights: a READ grant refuses writes, and sends a bare notification.
        ro = owner.grant(pool, "read", holder="range-holder-1")
        r2 = await me.open_grant(ro.metadata())
        with pytest.raises(ferry.GrantRightsError):
            await r2.write_ranges(mine, [(0, 0)], [(0, 0, 1)])
        await r2.notify(b"hi")
        n = await ro.next_notification()
        assert n is not None and n.kind == NotificationKind.MESSAGE and n.payload == b"hi"
        # Revoked: a bare notification is refused too.
        await grant.revoke()
        with pytest.raises(ferry.GrantRevokedError):
            await remote.notify(b"late")

    run(main())
