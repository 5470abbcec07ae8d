"""vLLM's P2P offload data plane (``DataTransport``) on Ferry: the contract
of ``vllm/v1/kv_offload/tiering/p2p/data/base.py`` as vLLM documents it
(vLLM itself need not be installed), between two transports of this
process, and across two processes (tests/p2p_peer.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Iterator, List, Set, Tuple

import numpy as np
import pytest

from ferry.vllm import FerryTransport, PollResult, TransportError

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCKS, BLOCK = 32, 4096


def region(fill: int) -> Tuple[np.ndarray, memoryview]:
    a = np.full((BLOCKS, BLOCK), fill, dtype=np.uint8)
    return a, memoryview(a)


def stamp(a: np.ndarray, block: int, salt: int) -> None:
    a[block] = (np.arange(BLOCK) + block * 7 + salt) % 251


def wait_ended(t: FerryTransport, ids: Set[int], peer: str | None = None, timeout: float = 10.0) -> PollResult:
    """Polls until every id in `ids` surfaced; what surfaced."""
    done: List[int] = []
    failed: List[int] = []
    until = time.monotonic() + timeout
    while set(done) | set(failed) < ids:
        assert time.monotonic() < until, f"not ended within {timeout} s: {ids - set(done) - set(failed)}"
        r = t.poll(peer)
        done += r.done
        failed += r.failed
        time.sleep(0.001)
    return PollResult(done=done, failed=failed)


@pytest.fixture
def pair() -> Iterator[Tuple[FerryTransport, np.ndarray, FerryTransport, np.ndarray]]:
    a_mem, a_view = region(0)
    b_mem, b_view = region(0xEE)
    a = FerryTransport("p2p-a", a_view)
    b = FerryTransport("p2p-b", b_view)
    a.add_remote_peer("b", b.get_agent_metadata(), 0, BLOCKS, BLOCK)
    try:
        yield a, a_mem, b, b_mem
    finally:
        a.close()
        b.close()


def test_write_blocks_copies_by_index_and_touches_nothing_else(pair) -> None:  # type: ignore[no-untyped-def]
    a, a_mem, b, b_mem = pair
    for i in range(BLOCKS):
        stamp(a_mem, i, 1)
    before = b_mem.copy()
    t1 = a.write_blocks("b", [0, 3], [5, 7])
    t2 = a.write_blocks("b", [9], [31])
    assert isinstance(t1, int) and isinstance(t2, int) and t1 != t2
    r = wait_ended(a, {t1, t2})
    assert sorted(r.done) == sorted([t1, t2]) and not r.failed
    assert np.array_equal(b_mem[5], a_mem[0]) and np.array_equal(b_mem[7], a_mem[3])
    assert np.array_equal(b_mem[31], a_mem[9])
    untouched = [i for i in range(BLOCKS) if i not in (5, 7, 31)]
    assert np.array_equal(b_mem[untouched], before[untouched])
    # Ended transfers leave the in-flight set: a second poll reports nothing.
    assert a.poll() == PollResult(done=[], failed=[])


def test_unknown_peer_and_mismatched_lists_return_none(pair) -> None:  # type: ignore[no-untyped-def]
    a, _, _, _ = pair
    assert a.write_blocks("nobody", [0], [0]) is None
    assert a.write_blocks("b", [0, 1], [0]) is None


def test_an_index_out_of_range_fails_in_poll_and_moves_nothing(pair) -> None:  # type: ignore[no-untyped-def]
    a, _, _, b_mem = pair
    before = b_mem.copy()
    t = a.write_blocks("b", [0], [BLOCKS])
    assert t is not None
    r = wait_ended(a, {t})
    assert r.failed == [t] and not r.done
    assert np.array_equal(b_mem, before)


def test_poll_scoped_to_a_peer_leaves_the_others(pair) -> None:  # type: ignore[no-untyped-def]
    a, a_mem, b, _ = pair
    c_mem, c_view = region(0x11)
    c = FerryTransport("p2p-c", c_view)
    try:
        a.add_remote_peer("c", c.get_agent_metadata())
        tb = a.write_blocks("b", [1], [1])
        tc = a.write_blocks("c", [2], [2])
        assert tb is not None and tc is not None
        rb = wait_ended(a, {tb}, peer="b")
        assert rb.done == [tb]
        # c's completion was not drained by b's poll.
        rc = wait_ended(a, {tc}, peer="c")
        assert rc.done == [tc]
        assert np.array_equal(c_mem[2], a_mem[2])
    finally:
        c.close()


def test_cancel_immediate_forgets_and_wait_returns_what_is_in_flight(pair) -> None:  # type: ignore[no-untyped-def]
    a, _, _, _ = pair
    ids = [a.write_blocks("b", [i], [i]) for i in range(8)]
    assert all(isinstance(t, int) for t in ids)
    assert a.cancel(ids[:4], "immediate") == []  # type: ignore[arg-type]
    still = a.cancel(ids[4:], "wait")  # type: ignore[arg-type]
    assert set(still) <= set(ids[4:])
    # What "wait" returned surfaces in poll; what "immediate" forgot never does.
    seen = wait_ended(a, set(still)) if still else PollResult([], [])
    time.sleep(0.05)
    late = a.poll()
    surfaced = set(seen.done) | set(seen.failed) | set(late.done) | set(late.failed)
    assert not surfaced & set(ids[:4])
    assert a.cancel([12345], "wait") == []
    with pytest.raises(ValueError):
        a.cancel([], "later")


def test_after_the_peer_closes_a_write_fails_and_lands_nothing(pair) -> None:  # type: ignore[no-untyped-def]
    a, _, b, b_mem = pair
    b.close()
    before = b_mem.copy()
    t = a.write_blocks("b", [0], [0])
    assert t is not None
    r = wait_ended(a, {t})
    assert r.failed == [t]
    time.sleep(0.05)
    assert np.array_equal(b_mem, before)


def test_remove_remote_peer_then_writes_return_none(pair) -> None:  # type: ignore[no-untyped-def]
    a, _, _, _ = pair
    a.remove_remote_peer("b")
    assert a.write_blocks("b", [0], [0]) is None


def test_layouts_and_foreign_metadata_are_refused() -> None:
    _, v1 = region(0)
    small = np.zeros((BLOCKS, BLOCK // 2), dtype=np.uint8)
    a = FerryTransport("p2p-d", v1)
    s = FerryTransport("p2p-e", memoryview(small))
    try:
        with pytest.raises(TransportError, match="block_len"):
            a.add_remote_peer("e", s.get_agent_metadata())
        with pytest.raises(TransportError):
            a.add_remote_peer("x", b"not json")
        with pytest.raises(TransportError):
            a.add_remote_peer("x", json.dumps({"ferry": "other"}).encode())
    finally:
        a.close()
        s.close()
    assert not a.available
    with pytest.raises(TransportError):
        a.get_agent_metadata()


def test_config_fingerprints_must_match() -> None:
    _, v1 = region(0)
    _, v2 = region(0)
    a = FerryTransport("p2p-f", v1, {"model": "x", "layers": 2})
    b = FerryTransport("p2p-g", v2, {"model": "y", "layers": 2})
    try:
        assert a.config_fingerprint and a.config_fingerprint != b.config_fingerprint
        with pytest.raises(TransportError, match="fingerprint"):
            a.add_remote_peer("g", b.get_agent_metadata())
    finally:
        a.close()
        b.close()


def test_between_two_processes() -> None:
    """The peer (tests/p2p_peer.py) exposes its region; this process writes
    into it; the peer checks every block and reports."""
    peer = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "p2p_peer.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    a_mem, a_view = region(0)
    a = FerryTransport("p2p-h", a_view)
    try:
        assert peer.stdin is not None and peer.stdout is not None
        meta = peer.stdout.readline().strip()
        assert meta, "the peer said nothing"
        a.add_remote_peer("peer", bytes.fromhex(meta))
        for i in range(BLOCKS):
            stamp(a_mem, i, 5)
        pairs = [(i, BLOCKS - 1 - i) for i in range(0, BLOCKS, 3)]
        t = a.write_blocks("peer", [p[0] for p in pairs], [p[1] for p in pairs])
        assert t is not None
        r = wait_ended(a, {t})
        assert r.done == [t], r
        peer.stdin.write(json.dumps(pairs) + "\n")
        peer.stdin.flush()
        assert peer.stdout.readline().strip() == "ok"
    finally:
        a.close()
        peer.kill()
        peer.wait(10)


def test_a_peer_that_never_answers_the_claim_is_an_error_not_a_hang() -> None:
    """The peer process is stopped (SIGSTOP) after it published its
    metadata: add_remote_peer gives up after ADD_PEER_TIMEOUT with a
    TransportError, and the transport goes on working."""
    import signal

    peer = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "p2p_peer.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    _, a_view = region(0)
    a = FerryTransport("p2p-stopped", a_view)
    a.ADD_PEER_TIMEOUT = 0.5
    try:
        assert peer.stdout is not None
        meta = peer.stdout.readline().strip()
        assert meta, "the peer said nothing"
        os.kill(peer.pid, signal.SIGSTOP)
        t = time.monotonic()
        with pytest.raises(TransportError, match="did not answer"):
            a.add_remote_peer("stopped", bytes.fromhex(meta))
        assert time.monotonic() - t < 5
        assert a.write_blocks("stopped", [0], [0]) is None  # never added
    finally:
        os.kill(peer.pid, signal.SIGCONT)
        a.close()
        peer.kill()
        peer.wait(10)
