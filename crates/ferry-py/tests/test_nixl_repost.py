"""ferry.nixl's hot path, NIXL's model of a transfer made once and
re-posted: each post moves the bytes as they are then (in the call up to
2 MiB, on Ferry's runtime beyond), a repost while one is in progress is
refused, telemetry comes from the post's own times, and once what the
transfer names is gone (a deregistered region, a removed agent) a post is
refused with NIXL's error and moves nothing. Two agents of this process,
on Ferry's engine (cross-memory attach)."""

from __future__ import annotations

import itertools
import time
from typing import Any, Iterator, Tuple

import numpy as np
import pytest

import ferry.nixl._bindings as nixl
from ferry.nixl._api import nixl_agent, nixl_agent_config

SIZE = 8 << 20
_N = itertools.count()


def wait_done(agent: nixl_agent, h: Any) -> None:
    deadline = time.monotonic() + 30
    while True:
        s = agent.check_xfer_state(h)
        if s == "DONE":
            return
        assert s == "PROC", agent.get_xfer_error(h)
        assert time.monotonic() < deadline


@pytest.fixture
def pair() -> Iterator[Tuple[nixl_agent, nixl_agent, Any, Any, Any, Any]]:
    n = next(_N)
    conf = nixl_agent_config(True, False, 0, capture_telemetry=True)
    target = nixl_agent(f"repost-target-{n}", conf)
    me = nixl_agent(f"repost-init-{n}", conf)
    theirs = np.zeros(SIZE, dtype=np.uint8)
    ours = np.zeros(SIZE, dtype=np.uint8)
    treg = target.register_memory(target.get_reg_descs([(theirs.ctypes.data, SIZE, 0, "")], "DRAM"))
    oreg = me.register_memory(me.get_reg_descs([(ours.ctypes.data, SIZE, 0, "")], "DRAM"))
    me.add_remote_agent(target.get_agent_metadata())
    target.add_remote_agent(me.get_agent_metadata())
    yield target, me, theirs, ours, treg, oreg
    me.close()
    target.close()


def handle(me: nixl_agent, target: nixl_agent, op: str, ours: Any, theirs: Any, n: int) -> Any:
    local = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(ours.ctypes.data, n, 0)], "DRAM")
    far = me.prep_xfer_dlist(target.name, [(theirs.ctypes.data, n, 0)], "DRAM")
    return me.make_prepped_xfer(op, local, [0], far, [0], b"")


def test_each_post_moves_the_bytes_as_they_are_then(pair: Any) -> None:
    target, me, theirs, ours, _, _ = pair
    for n in (4096, SIZE):  # in the call, then on the runtime
        h = handle(me, target, "READ", ours, theirs, n)
        refused = 0
        for seed in range(5):
            theirs[:n] = (np.arange(n) + seed) % 251
            s = me.transfer(h)
            assert s in ("DONE", "PROC")
            if n > 2 << 20:
                # A repost while in progress is refused (NIXL's rule); this
                # one comes microseconds after the post of 8 MiB, which
                # takes a millisecond or more, but may come after its end.
                try:
                    again = me.transfer(h)
                except nixl.nixlRepostActiveError:
                    refused += 1
                else:
                    assert again in ("DONE", "PROC")
            wait_done(me, h)
            # The post went the hot path (a prepared transfer posting itself).
            assert me._core.req(h._handle).fast is not None
            assert np.array_equal(ours[:n], theirs[:n])
            t = me.get_xfer_telemetry(h)
            assert t.totalBytes == n and t.postDuration >= 1 and t.xferDuration >= t.postDuration
            assert abs(t.startTime - time.time_ns() // 1000) < 60_000_000
        me.release_xfer_handle(h)
        assert n <= 2 << 20 or refused > 0
    # WRITE, with a notification changed between posts.
    h = handle(me, target, "WRITE", ours, theirs, 4096)
    for seed, note in ((5, b"one"), (6, b"two")):
        ours[:4096] = (np.arange(4096) * 3 + seed) % 251
        assert me.transfer(h, note) == "DONE"
        assert np.array_equal(theirs[:4096], ours[:4096])
        deadline = time.monotonic() + 10
        while not target.check_remote_xfer_done(me.name, note):
            assert time.monotonic() < deadline
    me.release_xfer_handle(h)
    # Released handles let their region go.
    assert all(not r.fast for r in me._core.local)


def test_a_deregistered_region_refuses_the_next_post(pair: Any) -> None:
    target, me, theirs, ours, _, oreg = pair
    h = handle(me, target, "READ", ours, theirs, 4096)
    theirs[:4096] = 7
    assert me.transfer(h) == "DONE" and (ours[:4096] == 7).all()
    theirs[:4096] = 8
    me.deregister_memory(oreg)
    with pytest.raises(nixl.nixlNotFoundError, match="deregistered"):
        me.transfer(h)
    assert me.check_xfer_state(h) == "ERR"
    assert (ours[:4096] == 7).all()


def test_a_removed_agent_refuses_the_next_post(pair: Any) -> None:
    target, me, theirs, ours, _, _ = pair
    h = handle(me, target, "WRITE", ours, theirs, 4096)
    ours[:4096] = 3
    assert me.transfer(h) == "DONE" and (theirs[:4096] == 3).all()
    ours[:4096] = 4
    me.remove_remote_agent(target.name)
    with pytest.raises(nixl.nixlNotFoundError, match="removed"):
        me.transfer(h)
    assert me.check_xfer_state(h) == "ERR"
    assert (theirs[:4096] == 3).all()


def test_max_holders_bounds_the_agents_that_add_a_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_NIXL_MAX_HOLDERS", "1")
    conf = nixl_agent_config(True, False, 0)
    target = nixl_agent("cap-target", conf)
    mem = np.zeros(N_CAP, dtype=np.uint8)
    target.register_memory(target.get_reg_descs([(mem.ctypes.data, N_CAP, 0, "")], "DRAM"))
    first = nixl_agent("cap-first", conf)
    second = nixl_agent("cap-second", conf)
    first.add_remote_agent(target.get_agent_metadata())
    with pytest.raises(nixl.nixlBackendError, match="holders"):
        second.add_remote_agent(target.get_agent_metadata())
    monkeypatch.setenv("FERRY_NIXL_MAX_HOLDERS", "none")
    with pytest.raises(nixl.nixlBackendError, match="FERRY_NIXL_MAX_HOLDERS"):
        nixl_agent("cap-bad", conf)
    for a in (first, second, target):
        a.close()


N_CAP = 4096


def test_a_transfer_over_several_regions_posts_as_one_group() -> None:
    """vLLM's NixlConnector layout: a region per layer on both sides; one
    transfer spans them all, with a notification the target sees after
    every byte."""
    conf = nixl_agent_config(True, False, 0)
    target = nixl_agent("group-target", conf)
    me = nixl_agent("group-init", conf)
    layers, n = 4, 64 << 10
    theirs = [((np.arange(n) + 11 * k) % 251).astype(np.uint8) for k in range(layers)]
    ours = [np.zeros(n, dtype=np.uint8) for _ in range(layers)]
    regs = []
    for t, o in zip(theirs, ours):
        target.register_memory(target.get_reg_descs([(t.ctypes.data, n, 0, "")], "DRAM"))
        regs.append(me.register_memory(me.get_reg_descs([(o.ctypes.data, n, 0, "")], "DRAM")))
    me.add_remote_agent(target.get_agent_metadata())
    target.add_remote_agent(me.get_agent_metadata())
    bs = 4096
    local = me.prep_xfer_dlist("NIXL_INIT_AGENT", [(o.ctypes.data + i * bs, bs, 0) for o in ours for i in range(n // bs)], "DRAM")
    far = me.prep_xfer_dlist(target.name, [(t.ctypes.data + i * bs, bs, 0) for t in theirs for i in range(n // bs)], "DRAM")
    per = n // bs
    idx = [k * per + i for k in range(layers) for i in (1, 5, 9)]
    h = me.make_prepped_xfer("READ", local, idx, far, idx, b"req-1")
    for round_ in range(2):
        note = f"req-{round_}".encode()
        assert me.transfer(h, note) in ("DONE", "PROC")
        wait_done(me, h)
        assert type(me._core.req(h._handle).fast).__name__ == "PreparedGroup"
        for k in range(layers):
            for i in (1, 5, 9):
                assert np.array_equal(ours[k][i * bs : (i + 1) * bs], theirs[k][i * bs : (i + 1) * bs])
        deadline = time.monotonic() + 10
        while not target.check_remote_xfer_done(me.name, note):
            assert time.monotonic() < deadline, "no notification"
        for k in range(layers):
            ours[k][:] = 0
    # One layer's region deregistered: the next post is refused, nothing moves.
    me.deregister_memory(regs[2])
    with pytest.raises(nixl.nixlNotFoundError, match="deregistered"):
        me.transfer(h)
    assert all((o == 0).all() for o in ours)
    me.close()
    target.close()
