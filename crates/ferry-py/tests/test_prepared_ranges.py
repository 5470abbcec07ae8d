"""Prepared range transfers (``RemoteGrant.prepare_ranges``, what
``ferry.nixl`` re-posts): every post moves the bytes as they are at that
post, in the call or on Ferry's runtime; ``post`` is one at a time, and
posts nothing once a gate has closed; failures are the grant's typed
errors. Both sides in this process (cross-memory attach)."""

from __future__ import annotations

import time
from typing import Any, Tuple

import pytest
from conftest import run

import ferry
from ferry import Pool

BS = 4096


def pattern(n: int, seed: int) -> bytearray:
    return bytearray((k * 7 + seed) % 251 for k in range(n))


def pair(tag: str, theirs: bytearray, ours: bytearray, block: int = BS) -> Tuple[Any, Any, Any, Pool]:
    """A grant over `theirs` opened by a second connector, and a pool over
    `ours`: (owner's grant, remote grant core, owner connector, our pool)."""

    async def main() -> Tuple[Any, Any, Any, Pool]:
        owner = ferry.Connector(f"prep-owner-{tag}")
        me = ferry.Connector(f"prep-holder-{tag}")
        grant = owner.grant(Pool(theirs, block), "read_write", holder=f"prep-holder-{tag}")
        remote = await me.open_grant(grant.metadata())
        # The connectors live as long as the grants (kept in the tuple).
        return grant, remote, (owner, me), Pool(ours, block)

    return run(main())


def test_each_post_moves_the_bytes_as_they_are_then() -> None:
    theirs = pattern(4 * BS, 1)
    ours = bytearray(4 * BS)
    grant, remote, _keep, mine = pair("0", theirs, ours)
    # READ owner block 2 from byte 10 (100 bytes) and block 3 whole, into
    # our block 0 at 5 and our block 1.
    read = remote.prepare_ranges(False, [(2, 10, 100), (3, 0, BS)], mine, [(0, 5), (1, 0)])
    assert (read.nbytes, read.large, read.write) == (100 + BS, False, False)
    assert read.done() and read.times() is None
    for seed in (1, 2, 3):
        theirs[:] = pattern(4 * BS, seed)
        if seed == 3:
            assert read.post() == 0
            assert read.done() and read.error() is None
            start_us, post_ns, xfer_ns = read.times() or (0, 0, None)
            assert abs(start_us - time.time_ns() // 1000) < 60_000_000 and post_ns > 0 and xfer_ns is not None
        else:
            read.run_blocking()
        assert ours[5:105] == theirs[2 * BS + 10 : 2 * BS + 110]
        assert ours[BS : 2 * BS] == theirs[3 * BS : 4 * BS]
        assert ours[:5] == bytes(5) and ours[105:BS] == bytes(BS - 105)
    # WRITE our block 2 into owner block 0 at 1, with a notification.
    ours[2 * BS : 3 * BS] = pattern(BS, 9)
    write = remote.prepare_ranges(True, [ferry.BlockRange(0, 1, 50)], mine, [(2, 0)])
    before = bytes(theirs)
    assert write.post(b"w") == 0
    assert theirs[1:51] == ours[2 * BS : 2 * BS + 50]
    assert theirs[:1] == before[:1] and theirs[51:] == before[51:]
    n = grant.poll_notification()
    assert n is not None and n.payload == b"w" and n.kind == ferry.NotificationKind.WRITE


def test_a_large_post_runs_on_the_runtime_one_at_a_time() -> None:
    size = 16 << 20
    theirs = pattern(size, 4)
    ours = bytearray(size)
    _grant, remote, _keep, mine = pair("1", theirs, ours, block=size)
    prep = remote._core.prepare_ranges(False, [(0, 0, size)], mine._core, [(0, 0)])
    assert prep.large
    # start(): a Pending, polled and waited for.
    p = prep.start()
    assert p.wait(30.0) and p.done() and p.error() is None
    end = p.finished_ns()
    assert end is not None and end <= time.monotonic_ns()
    assert ours == theirs
    # post(): refused (3) while the last post is in progress, which then
    # ends as it would have.
    busy = 0
    for seed in range(5, 15):
        theirs[:64] = bytes([seed]) * 64
        code = prep.post()
        assert code in (0, 1)
        again = prep.post()
        if again == 3:
            busy += 1
        else:
            assert again in (0, 1)
        assert prep.wait(30.0) and prep.done() and prep.error() is None
        assert ours[:64] == bytes([seed]) * 64
    # A 16 MiB copy takes milliseconds: the second post came while the
    # first was in progress at least once in ten.
    assert busy > 0


def test_a_closed_gate_posts_nothing() -> None:
    theirs = pattern(2 * BS, 5)
    ours = bytearray(2 * BS)
    _grant, remote, _keep, mine = pair("2", theirs, ours)
    gates = [ferry._ferry.Gate(), ferry._ferry.Gate()]
    prep = remote._core.prepare_ranges(False, [(1, 0, BS)], mine._core, [(0, 0)], gates)
    assert prep.post() == 0 and ours[:BS] == theirs[BS:]
    ours[:] = bytes(2 * BS)
    gates[1].close()
    assert not gates[1].is_open and gates[0].is_open
    assert prep.post() == 4
    assert ours == bytes(2 * BS)
    assert prep.done() and isinstance(prep.error(), RuntimeError)


def test_failures_are_the_grants_typed_errors() -> None:
    theirs = pattern(2 * BS, 6)
    ours = bytearray(2 * BS)
    grant, remote, _keep, mine = pair("3", theirs, ours)
    with pytest.raises(ferry.BlockRangeError):
        remote._core.prepare_ranges(False, [(0, 0, 8)], mine._core, [(2, 0)])
    with pytest.raises(ferry.GrantBlockRangeError):
        remote._core.prepare_ranges(False, [(2, 0, 8)], mine._core, [(0, 0)])
    prep = remote._core.prepare_ranges(False, [(0, 0, BS)], mine._core, [(1, 0)])
    run(grant.revoke())
    assert prep.post() == 2
    assert isinstance(prep.error(), ferry.GrantRevokedError)
    with pytest.raises(ferry.GrantRevokedError):
        prep.run_blocking()
    p = prep.start()
    assert p.wait(10.0) and isinstance(p.error(), ferry.GrantRevokedError)
    assert ours == bytes(2 * BS)
