"""ferry.nixl's API surface against NIXL's behaviour (nixl-cu12 1.5.1, read
and probed): descriptor lists, the configuration's forms, registration,
metadata, prepared and direct transfers, states, notifications, telemetry
and errors. The agents here run over the in-process engine of
tests/nixl_fake.py (Ferry's own engine: tests/test_nixl_ferry.py), so every
rule of the agent is tested without a second process."""

from __future__ import annotations

import pickle
import time
import uuid
from typing import Any, Iterator, Tuple

import numpy as np
import pytest

import ferry.nixl._bindings as nixl
import ferry.nixl._utils as nixl_utils
from ferry.nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t, nixl_xfer_handle

import nixl_fake


def agent(name: str = "", delay: int = 0, conf: Any = None) -> nixl_agent:
    return nixl_agent(name or str(uuid.uuid4()), conf, engine=nixl_fake.engine(delay))


@pytest.fixture
def pair() -> Iterator[Tuple[nixl_agent, nixl_agent]]:
    a, b = agent("target"), agent("initiator")
    yield a, b
    a.close()
    b.close()


# ---- descriptor lists ----


def test_xfer_list_as_nixl() -> None:
    descs = [(1000, 105, 0), (2000, 30, 0), (1010, 20, 0)]
    lst = nixl.nixlXferDList(nixl.DRAM_SEG, descs)
    assert lst.descCount() == 3 and len(lst) == 3
    assert pickle.loads(pickle.dumps(lst)) == lst
    assert lst.getType() == nixl.DRAM_SEG
    lst.remDesc(1)
    assert lst.descCount() == 2
    assert lst[0] == descs[0] and lst[1] == descs[2]
    assert lst.index((1010, 20, 0)) == 1
    with pytest.raises(nixl.nixlNotFoundError):
        lst.index((1, 2, 3))
    with pytest.raises(IndexError):
        lst.remDesc(99)
    with pytest.raises(IndexError):
        lst[2]  # NIXL returns what lies past the end
    lst.clear()
    assert lst.isEmpty() and bool(lst)  # truthy when empty, as NIXL's
    lst.addDesc((2000, 100, 0))
    lst.append((3000, 1, 0))
    assert list(lst) == [(2000, 100, 0), (3000, 1, 0)]
    with pytest.raises(IndexError):
        lst.addDesc((1, 2))
    lst[0] = (5, 6, 0)
    assert lst[0] == (5, 6, 0) and (5, 6, 0) in lst
    assert nixl.nixlXferDList(nixl.DRAM_SEG, 3).descCount() == 3
    with pytest.raises(TypeError):
        hash(lst)


def test_reg_list_trim_equality_and_numpy() -> None:
    reg = nixl.nixlRegDList(nixl.DRAM_SEG, [(1000, 105, 0, "a"), (2000, 30, 0, "bb")])
    assert reg[0] == (1000, 105, 0, b"a")
    assert reg.index((2000, 30, 0, "bb")) == 1
    with pytest.raises(IndexError):
        reg.addDesc((1, 2, 3))
    x = reg.trim()
    assert isinstance(x, nixl.nixlXferDList)
    assert x == nixl.nixlXferDList(nixl.DRAM_SEG, [(1000, 105, 0), (2000, 30, 0)])
    assert x != reg and not (x == reg)
    assert x != nixl.nixlXferDList(nixl.VRAM_SEG, [(1000, 105, 0), (2000, 30, 0)])
    arr = np.array([[1, 2, 0], [3, 4, 0]], dtype=np.uint64)
    assert nixl.nixlRegDList(nixl.DRAM_SEG, arr)[1] == (3, 4, 0, b"")
    assert nixl.nixlXferDList(nixl.DRAM_SEG, arr.astype(np.int64))[1] == (3, 4, 0)
    with pytest.raises(ValueError):
        nixl.nixlXferDList(nixl.DRAM_SEG, np.array([[-1, 2, 0]]))
    back = pickle.loads(pickle.dumps(reg))
    assert back == reg and back[1] == (2000, 30, 0, b"bb")
    assert str(nixl.DRAM_SEG) == "nixl_mem_t.DRAM_SEG" and nixl.DRAM_SEG == 0 and nixl.VRAM_SEG == 1


def test_constants_and_errors_as_nixl() -> None:
    assert nixl.NIXL_INIT_AGENT == "" and nixl.DEFAULT_COMM_PORT == 8888
    assert (int(nixl.NIXL_SUCCESS), int(nixl.NIXL_IN_PROG), int(nixl.NIXL_ERR_NOT_FOUND)) == (0, 1, -4)
    assert (int(nixl.NIXL_READ), int(nixl.NIXL_WRITE)) == (0, 1)
    for e in (nixl.nixlNotFoundError, nixl.nixlInvalidParamError, nixl.nixlBackendError, nixl.nixlMismatchError):
        assert issubclass(e, Exception)
    assert str(nixl.nixlNotFoundError()) == "NIXL_ERR_NOT_FOUND"
    assert str(nixl.nixlNotFoundError("why")) == "NIXL_ERR_NOT_FOUND: why"
    t = nixl.nixlXferTelemetry()
    assert (t.startTime, t.postDuration, t.xferDuration, t.totalBytes, t.descCount) == (0, 0, 0, 0, 0)


def test_utils() -> None:
    a, b = nixl_utils.malloc_passthru(256), nixl_utils.malloc_passthru(256)
    assert a % 4096 == 0
    nixl_utils.ba_buf(a, 256)
    nixl_utils.ba_buf(b, 256)
    nixl_utils.verify_transfer(a, b, 256)
    nixl_utils.ba_buf(b, 1)
    import ctypes

    ctypes.memset(b, 0, 1)
    with pytest.raises(AssertionError):
        nixl_utils.verify_transfer(a, b, 256)
    nixl_utils.free_passthru(a)
    nixl_utils.free_passthru(b)
    with pytest.raises(ValueError):
        nixl_utils.free_passthru(a)


# ---- the configuration and the agent ----


def test_config_forms() -> None:
    c = nixl_agent_config(True, True, 0)
    assert (c.enable_pthread, c.enable_listen, c.port, c.backends) == (True, True, 0, ["UCX"])
    c = nixl_agent_config(backends=[])
    assert (c.enable_listen, c.port, c.backends, c.sync_mode) == (False, 8888, [], None)
    c = nixl_agent_config(True, False, 5555, backends=["UCX"], capture_telemetry=True, num_threads=4)
    assert c.capture_telemetry and c.num_threads == 4
    c = nixl_agent_config(sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_RW)
    assert c.sync_mode == nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
    with pytest.raises(TypeError, match="sync_mode must be a nixl_thread_sync_t"):
        nixl_agent_config(sync_mode=1)  # type: ignore[arg-type]


def test_agent_names_plugins_backends() -> None:
    with pytest.raises(ValueError):
        agent_with_name = nixl_agent("", engine=nixl_fake.engine())
        del agent_with_name
    a = agent(conf=nixl_agent_config(backends=["UCX", "GDS"]))
    assert "UCX" in a.get_plugin_list() and "UCX" in a.backends and "GDS" not in a.backends
    assert a.get_plugin_mem_types("UVX") == [] and a.get_plugin_params("UVX") == {}
    assert a.get_backend_mem_types("UVX") == [] and a.get_backend_params("UVX") == {}
    assert a.get_backend_mem_types("UCX") == ["DRAM_SEG", "VRAM_SEG"]
    with pytest.raises(nixl.nixlNotFoundError):
        a.create_backend("UVX")
    with pytest.raises(KeyError):
        a.register_memory([(1, 2, 0, "")], "DRAM", backends=["LIBFABRIC"])
    a.close()


def test_improper_descs_as_nixl() -> None:
    a = agent()
    assert a.get_xfer_descs([(1, 2, 3, 4)], "DRAM") is None
    assert a.get_xfer_descs([(1, 2, 3)], mem_type=None) is None
    with pytest.raises(KeyError):
        a.get_xfer_descs([(1, 2, 3)], mem_type="V-RAM")
    assert a.get_xfer_descs(nixl.nixlRegDList(nixl.DRAM_SEG)) is None
    assert a.get_reg_descs([(1, 2, 3)], "DRAM") is None
    assert a.get_reg_descs([(1, 2, 3, 4)], mem_type=None) is None
    with pytest.raises(KeyError):
        a.get_reg_descs([(1, 2, 3, "")], mem_type="V-RAM")
    assert a.get_reg_descs(nixl.nixlXferDList(nixl.DRAM_SEG)) is None
    assert a.get_reg_descs(np.zeros((4, 256), dtype=np.uint8), "DRAM") is None  # Nx3 only
    arr = np.array([[100, 8, 0]], dtype=np.uint64)
    assert a.get_xfer_descs(arr, "DRAM") == nixl.nixlXferDList(nixl.DRAM_SEG, [(100, 8, 0)])
    with pytest.raises(KeyError):
        a.make_prepped_xfer("RD", None, [], None, [])  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        a.initialize_xfer("WR", nixl.nixlXferDList(nixl.DRAM_SEG), nixl.nixlXferDList(nixl.DRAM_SEG), "nobody")
    a.close()


def _regions(a: nixl_agent, b: nixl_agent) -> Tuple[np.ndarray, np.ndarray, Any, Any]:
    src = np.arange(16 * 256, dtype=np.uint32).view(np.uint8)[: 16 * 256].copy().reshape(16, 256)
    dst = np.zeros((16, 256), dtype=np.uint8)
    ra = a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    rb = b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    return src, dst, ra, rb


def test_metadata_add_remove(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, b = pair
    _src, _dst, _ra, _rb = _regions(a, b)
    md = a.get_agent_metadata()
    assert isinstance(md, bytes)
    assert not b.check_remote_metadata("target")
    assert b.add_remote_agent(md) == b"target"  # bytes, as NIXL
    assert b.add_remote_agent(md) == b"target"
    assert b.check_remote_metadata("target") and b.check_remote_metadata(b"target")
    with pytest.raises(nixl.nixlMismatchError):
        b.add_remote_agent(b"garbage")
    with pytest.raises(nixl.nixlInvalidParamError):
        a.add_remote_agent(md)
    b.make_connection("target")
    with pytest.raises(nixl.nixlNotFoundError):
        b.make_connection("nobody")
    b.remove_remote_agent("target")
    b.remove_remote_agent("target")
    assert not b.check_remote_metadata("target")


def test_register_deregister(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, _ = pair
    buf = np.zeros(4096, dtype=np.uint8)
    reg = a.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
    assert isinstance(reg, nixl.nixlRegDList)
    a.register_memory(reg)  # again: counted
    a.deregister_memory(reg)
    a.deregister_memory(reg)
    with pytest.raises(nixl.nixlNotFoundError):
        a.deregister_memory(reg)
    with pytest.raises(nixl.nixlNotSupportedError):
        a.register_memory([(buf.ctypes.data, 4096, 0, "f")], "FILE")


def test_read_write_prepped_with_notifications(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, b = pair
    src, dst, _ra, _rb = _regions(a, b)
    b.add_remote_agent(a.get_agent_metadata())
    a.add_remote_agent(b.get_agent_metadata())
    local = b.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.ctypes.data + i * 256, 256, 0) for i in range(16)], "DRAM")
    remote = b.prep_xfer_dlist("target", [(src.ctypes.data + i * 256, 256, 0) for i in range(16)], "DRAM")
    h = b.make_prepped_xfer("READ", local, [0, 1, 2], remote, np.array([5, 6, 7]), b"read 5-7")
    assert b.transfer(h) == "DONE" and b.check_xfer_state(h) == "DONE"
    assert (dst[0:3] == src[5:8]).all()
    assert a.get_new_notifs() == {"initiator": [b"read 5-7"]}
    assert a.get_new_notifs() == {}
    dst[10] = 0xAB
    w = b.make_prepped_xfer("WRITE", local, [10], remote, [15], "str notif")
    assert b.transfer(w) == "DONE"
    assert (src[15] == 0xAB).all()
    assert a.check_remote_xfer_done("initiator", b"str")
    assert not a.check_remote_xfer_done("initiator", b"str")
    # Errors at make, as NIXL's.
    with pytest.raises(nixl.nixlInvalidParamError):
        b.make_prepped_xfer("WRITE", local, [0, 99], remote, [1, 2])
    with pytest.raises(nixl.nixlInvalidParamError):
        b.make_prepped_xfer("WRITE", local, [0, -1], remote, [1, 2])
    with pytest.raises(nixl.nixlInvalidParamError):
        b.make_prepped_xfer("WRITE", local, [0], remote, [1, 2])
    with pytest.raises(nixl.nixlInvalidParamError):
        b.make_prepped_xfer("READ", remote, [0], local, [0])
    with pytest.raises(nixl.nixlNotFoundError):
        b.prep_xfer_dlist("nobody", [(src.ctypes.data, 256, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        b.prep_xfer_dlist("target", [(src.ctypes.data + 4000, 256, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        b.prep_xfer_dlist("", [(1234, 256, 0)], "DRAM")
    b.release_xfer_handle(h)
    b.release_xfer_handle(h)
    with pytest.raises(nixl.nixlInvalidParamError):
        b.check_xfer_state(h)
    b.release_dlist_handle(local)
    with pytest.raises(nixl.nixlInvalidParamError):
        b.make_prepped_xfer("WRITE", local, [0], remote, [0])


def test_initialize_xfer_merges_and_checks(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, b = pair
    src, dst, _ra, _rb = _regions(a, b)
    b.add_remote_agent(a.get_agent_metadata())
    a.add_remote_agent(b.get_agent_metadata())
    lx = b.get_xfer_descs([(dst.ctypes.data, 512, 0), (dst.ctypes.data + 512, 512, 0)], "DRAM")
    rx = b.get_xfer_descs([(src.ctypes.data + 256, 512, 0), (src.ctypes.data + 768, 512, 0)], "DRAM")
    h = b.initialize_xfer("READ", lx, rx, "target", b"hello")
    assert isinstance(h, nixl_xfer_handle)
    assert b.transfer(h) == "DONE"
    assert (dst.reshape(-1)[:1024] == src.reshape(-1)[256:1280]).all()
    assert b.transfer(h, b"again") == "DONE"
    assert a.get_new_notifs() == {"initiator": [b"hello", b"again"]}
    with pytest.raises(nixl.nixlNoTelemetryError):
        b.get_xfer_telemetry(h)
    assert b.estimate_xfer_cost(h) == (0, 0, "UNKNOWN")
    assert b.query_xfer_backend(h) == "UCX"
    outside = b.get_xfer_descs([(src.ctypes.data + 4096 - 100, 512, 0), (src.ctypes.data, 512, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        b.initialize_xfer("READ", lx, outside, "target")
    with pytest.raises(nixl.nixlNotFoundError):
        b.initialize_xfer("READ", b.get_xfer_descs([(12345, 512, 0), (12345, 512, 0)], "DRAM"), rx, "target")
    with pytest.raises(nixl.nixlNotFoundError):
        b.initialize_xfer("READ", lx, rx, "Z")
    short = b.get_xfer_descs([(src.ctypes.data, 100, 0), (src.ctypes.data, 512, 0)], "DRAM")
    with pytest.raises(nixl.nixlInvalidParamError):
        b.initialize_xfer("READ", lx, short, "target")
    with pytest.raises(nixl.nixlInvalidParamError):
        b.initialize_xfer("READ", lx, b.get_xfer_descs([(src.ctypes.data, 512, 0)], "DRAM"), "target")


def test_telemetry_states_and_repost() -> None:
    a = agent("target")
    b = agent("initiator", delay=5, conf=nixl_agent_config(capture_telemetry=True))
    src, dst, _ra, _rb = _regions(a, b)
    b.add_remote_agent(a.get_agent_metadata())
    lx = b.get_xfer_descs([(dst.ctypes.data, 128, 0), (dst.ctypes.data + 128, 128, 0)], "DRAM")
    rx = b.get_xfer_descs([(src.ctypes.data, 128, 0), (src.ctypes.data + 128, 128, 0)], "DRAM")
    h = b.initialize_xfer("WRITE", lx, rx, "target", b"telem")
    assert b.check_xfer_state(h) == "ERR"  # never posted: NIXL_ERR_NOT_POSTED
    assert b.transfer(h) == "PROC"
    with pytest.raises(nixl.nixlRepostActiveError):
        b.transfer(h)
    states = []
    while True:
        s = b.check_xfer_state(h)
        states.append(s)
        if s != "PROC":
            break
    assert states[-1] == "DONE" and "PROC" in states
    t = b.get_xfer_telemetry(h)
    assert t.descCount == 1  # the two descriptors follow each other on both sides: merged
    assert t.totalBytes == 256
    assert t.startTime > 0 and t.postDuration > 0 and t.xferDuration >= t.postDuration
    b.close()
    a.close()


def test_telemetry_env_overrides_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "no")
    b = agent(conf=nixl_agent_config(capture_telemetry=True))
    assert not b._core.telemetry
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "y")
    assert agent()._core.telemetry


def test_long_notifications_and_send_notif(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, b = pair
    src, dst, _ra, _rb = _regions(a, b)
    b.add_remote_agent(a.get_agent_metadata())
    a.add_remote_agent(b.get_agent_metadata())
    big = bytes(range(256)) * 40  # 10 KiB: 41 of Ferry's notifications
    b.send_notif("target", big)
    b.send_notif("target", b"")
    lx = b.get_xfer_descs([(dst.ctypes.data, 64, 0)], "DRAM")
    rx = b.get_xfer_descs([(src.ctypes.data, 64, 0)], "DRAM")
    h = b.initialize_xfer("READ", lx, rx, "target", big[:1000])
    assert b.transfer(h) == "DONE"
    assert a.get_new_notifs() == {"initiator": [big, b"", big[:1000]]}
    with pytest.raises(nixl.nixlNotFoundError):
        b.send_notif("nobody", b"x")
    found = False
    a.send_notif("initiator", b"whatever")
    while not found:
        found = b.check_remote_xfer_done("target", b"")  # an empty tag takes any message


def test_multi_region_transfer_one_notification(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, b = pair
    layers = [np.full((8, 64), i + 1, dtype=np.uint8) for i in range(3)]
    mine = [np.zeros((8, 64), dtype=np.uint8) for _ in range(3)]
    a.register_memory([(t.ctypes.data, t.nbytes, 0, "") for t in layers], "DRAM")
    b.register_memory([(t.ctypes.data, t.nbytes, 0, "") for t in mine], "DRAM")
    b.add_remote_agent(a.get_agent_metadata())
    rows = lambda ts: [(t.ctypes.data + i * 64, 64, 0) for t in ts for i in range(8)]  # noqa: E731
    local = b.prep_xfer_dlist("", rows(mine), "DRAM")
    remote = b.prep_xfer_dlist("target", rows(layers), "DRAM")
    ids = [l * 8 + i for l in range(3) for i in (1, 4)]
    h = b.make_prepped_xfer("READ", local, ids, remote, ids, b"req-1:0")
    assert b.transfer(h) == "DONE"
    for l in range(3):
        assert (mine[l][[1, 4]] == l + 1).all() and (mine[l][[0, 2, 3, 5, 6, 7]] == 0).all()
    posts = b._core.engine.posts  # type: ignore[attr-defined]
    assert posts[-1] == (False, 3, 1)  # three sub-operations, the notification after them
    assert a.get_new_notifs() == {"initiator": [b"req-1:0"]}


def test_deregistered_region_and_removed_agent_give_err(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, b = pair
    src, dst, ra, _rb = _regions(a, b)
    b.add_remote_agent(a.get_agent_metadata())
    lx = b.get_xfer_descs([(dst.ctypes.data, 64, 0)], "DRAM")
    rx = b.get_xfer_descs([(src.ctypes.data, 64, 0)], "DRAM")
    h = b.initialize_xfer("READ", lx, rx, "target")
    assert b.transfer(h) == "DONE"
    a.deregister_memory(ra)  # the owner's offer is revoked
    assert b.transfer(h) == "ERR" and b.check_xfer_state(h) == "ERR"
    assert "revoked" in str(b.get_xfer_error(h))
    b.remove_remote_agent("target")
    with pytest.raises(nixl.nixlNotFoundError):
        b.transfer(h)  # NIXL: not posting a stale handle
    assert b.check_xfer_state(h) == "ERR"


def test_release_in_flight_waits() -> None:
    a, b = agent("target"), agent("initiator", delay=1000)
    src, dst, _ra, rb = _regions(a, b)
    b.add_remote_agent(a.get_agent_metadata())
    h = b.initialize_xfer(
        "READ", b.get_xfer_descs([(dst.ctypes.data, 64, 0)], "DRAM"), b.get_xfer_descs([(src.ctypes.data, 64, 0)], "DRAM"), "target"
    )
    assert b.transfer(h) == "PROC"
    b.deregister_memory(rb)  # waits for the transfer in flight (the fake's wait ends it)
    h.release()
    assert h._released


def test_loopback(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, _ = pair
    buf = np.zeros(1024, dtype=np.uint8)
    buf[512:] = 7
    a.register_memory([(buf.ctypes.data, 1024, 0, "")], "DRAM")
    local = a.prep_xfer_dlist("", [(buf.ctypes.data, 256, 0)], "DRAM")
    remote = a.prep_xfer_dlist("target", [(buf.ctypes.data + 512, 256, 0)], "DRAM")
    h = a.make_prepped_xfer("READ", local, [0], remote, [0], b"self")
    assert a.transfer(h) == "DONE"
    assert (buf[:256] == 7).all()
    assert a.get_new_notifs() == {"target": [b"self"]}


def test_partial_metadata(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, b = pair
    bufs = [np.full(256, i, dtype=np.uint8) for i in range(4)]
    mine = np.zeros(256, dtype=np.uint8)
    r1 = a.get_reg_descs([(x.ctypes.data, 256, 0, "test") for x in bufs[:2]], "DRAM")
    r2 = a.get_reg_descs([(x.ctypes.data, 256, 0, "test") for x in bufs[2:]], "DRAM")
    a.register_memory(r1)
    a.register_memory(r2)
    b.register_memory([(mine.ctypes.data, 256, 0, "")], "DRAM")
    b.add_remote_agent(a.get_partial_agent_metadata(r1, True, ["UCX"]))
    assert b.check_remote_metadata("target", r1.trim())
    assert not b.check_remote_metadata("target", r2.trim())
    lx = b.get_xfer_descs([(mine.ctypes.data, 256, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError):
        b.initialize_xfer("READ", lx, nixl.nixlXferDList(nixl.DRAM_SEG, [r2.trim()[0]]), "target")
    b.add_remote_agent(a.get_partial_agent_metadata(r2, False))
    h = b.initialize_xfer("READ", lx, nixl.nixlXferDList(nixl.DRAM_SEG, [r2.trim()[1]]), "target", b"UUID1")
    assert b.transfer(h) == "DONE" and (mine == 3).all()
    assert a.check_remote_xfer_done("initiator", b"UUID1")


def test_serialized_descs_are_lists_only(pair: Tuple[nixl_agent, nixl_agent]) -> None:
    a, _ = pair
    descs = a.get_xfer_descs([(1, 2, 0), (3, 4, 0)], "DRAM")
    assert a.deserialize_descs(a.get_serialized_descs(descs)) == descs
    with pytest.raises(pickle.UnpicklingError):
        a.deserialize_descs(pickle.dumps(print))


def test_metadata_listener_exchange() -> None:
    a = agent("target", conf=nixl_agent_config(True, True, 0))
    b = agent("initiator", conf=nixl_agent_config(True, True, 0))
    assert a.listen_port and b.listen_port
    assert a.get_listen_port() == a.listen_port
    with pytest.raises(nixl.nixlNotAllowedError):
        agent("quiet", conf=nixl_agent_config(True, False, 0)).get_listen_port()
    b.fetch_remote_metadata("target", "127.0.0.1", a.listen_port)
    b.send_local_metadata("127.0.0.1", a.listen_port)
    deadline = time.monotonic() + 10
    while not (a.check_remote_metadata("initiator") and b.check_remote_metadata("target")):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    b.invalidate_local_metadata("127.0.0.1", a.listen_port)
    while a.check_remote_metadata("initiator"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(nixl.nixlNotSupportedError):
        b.send_local_metadata()
    a.close()
    b.close()


def test_metadata_parsing_is_total() -> None:
    from ferry.nixl import _meta

    good = agent("x").get_agent_metadata()
    assert _meta.decode(good).name == "x"
    bad = [
        b"",
        b"FERRYNIXL1\n",
        b"FERRYNIXL1\n[]",
        b"FERRYNIXL1\n{\"name\": 5, \"regions\": []}",
        b"FERRYNIXL1\n{\"name\": \"a\", \"regions\": [{\"addr\": -1, \"len\": 1, \"dev\": 0, \"mem\": 0, \"offer\": \"o\"}]}",
        b"FERRYNIXL1\n{\"name\": \"a\", \"regions\": [{\"addr\": 1, \"len\": 0, \"dev\": 0, \"mem\": 0, \"offer\": \"o\"}]}",
        b"FERRYNIXL1\n{\"name\": \"a\", \"regions\": [{\"addr\": 1, \"len\": 1, \"dev\": 0, \"mem\": 4, \"offer\": \"o\"}]}",
        b"FERRYNIXL1\n{\"name\": \"a\", \"regions\": [{\"addr\": 1, \"len\": 1, \"dev\": 0, \"mem\": 0, \"offer\": 3}]}",
        b"FERRYNIXL1\n{\"name\": \"a\", \"mailbox\": [], \"regions\": []}",
        b"FERRYNIXL1\n\xff\xfe",
        b"nixlSerDes|Agent...",
    ]
    rng = np.random.default_rng(3)
    bad += [good[: int(n)] for n in rng.integers(0, len(good), 20)]
    for b in bad:
        with pytest.raises(nixl.nixlMismatchError):
            _meta.decode(b)


def test_inbox_joins_parts_per_sender() -> None:
    from ferry.nixl._notify import Inbox, frame

    box = Inbox()
    long_a, long_b = b"a" * 600, b"b" * 300
    fa, fb = frame(long_a), frame(long_b)
    assert len(fa) == 3 and all(len(p) <= 256 for p in fa)
    # Two senders' parts interleaved; a whole message between them.
    for pa, pb in zip(fa, fb + [None]):  # type: ignore[operator]
        box.put("A", 1, pa)
        if pb is not None:
            box.put("B", 1, pb)
    box.put("A", 2, frame(b"short")[0])
    box.put(None, 1, b"\x07raw")  # not framed: handed on as it came
    assert box.take() == {"A": [long_a, b"short"], "B": [long_b], "": [b"\x07raw"]}
    assert box.take() == {}


def test_ferry_engine_over_a_stand_in() -> None:
    """FerryEngine's own logic (inline and background transfers, several
    regions, long notifications through the mailbox, revocation) over
    tests/nixl_fake.py's stand-in for Ferry's offers and ranges."""
    from ferry.nixl import _ferry_engine

    a = nixl_agent("target", engine=nixl_fake.sim_ferry_engine())
    b = nixl_agent("initiator", engine=nixl_fake.sim_ferry_engine())
    big_src = np.arange(4 << 20, dtype=np.uint32).view(np.uint8)[: 4 << 20].copy()
    small = [np.full(4096, i + 1, dtype=np.uint8) for i in range(2)]
    dst = np.zeros(4 << 20, dtype=np.uint8)
    ra = a.register_memory([(big_src.ctypes.data, big_src.nbytes, 0, "")] + [(s.ctypes.data, 4096, 0, "") for s in small], "DRAM")
    b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    b.add_remote_agent(a.get_agent_metadata())
    # Inline: one region pair, under INLINE_MAX.
    h = b.initialize_xfer("READ", b.get_xfer_descs([(dst.ctypes.data, 4096, 0)], "DRAM"),
                          b.get_xfer_descs([(big_src.ctypes.data + 4096, 4096, 0)], "DRAM"), "target", b"small")
    assert b.transfer(h) == "DONE"
    assert (dst[:4096] == big_src[4096:8192]).all()
    # Background: the whole 4 MiB (over INLINE_MAX), then three regions at once with a long notification.
    h2 = b.initialize_xfer("READ", b.get_xfer_descs([(dst.ctypes.data, 4 << 20, 0)], "DRAM"),
                           b.get_xfer_descs([(big_src.ctypes.data, 4 << 20, 0)], "DRAM"), "target")
    assert _ferry_engine.INLINE_MAX < (4 << 20)
    assert b.transfer(h2) in ("PROC", "DONE")
    assert wait(b, h2) == "DONE" and (dst == big_src).all()
    rows_l = [(dst.ctypes.data, 4096, 0), (dst.ctypes.data + 4096, 4096, 0), (dst.ctypes.data + 8192, 100, 0)]
    rows_r = [(small[0].ctypes.data, 4096, 0), (small[1].ctypes.data, 4096, 0), (big_src.ctypes.data, 100, 0)]
    h3 = b.initialize_xfer("READ", b.get_xfer_descs(rows_l, "DRAM"), b.get_xfer_descs(rows_r, "DRAM"), "target", b"L" * 700)
    b.transfer(h3)
    assert wait(b, h3) == "DONE"
    assert (dst[:4096] == 1).all() and (dst[4096:8192] == 2).all() and (dst[8192:8292] == big_src[:100]).all()
    b.send_notif("target", b"bare")
    assert a.get_new_notifs() == {"initiator": [b"small", b"L" * 700, b"bare"]}
    a.deregister_memory(ra)
    assert b.transfer(h) == "ERR" and "revoked" in str(b.get_xfer_error(h))
    b.transfer(h2)
    assert wait(b, h2) == "ERR"
    a.close()
    b.close()


def wait(a: nixl_agent, h: Any) -> str:
    deadline = time.monotonic() + 10
    while (s := a.check_xfer_state(h)) == "PROC":
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return s


def test_local_pieces_cut_at_blocks() -> None:
    from ferry.nixl._engine import LocalRegion, RemoteRegion, SubOp, pieces

    u = lambda *x: np.array(x, dtype=np.uint64)  # noqa: E731
    region = LocalRegion(1 << 20, 1 << 20, 0, nixl.DRAM_SEG)
    remote = RemoteRegion("r", 1 << 30, 1 << 20, 0, nixl.DRAM_SEG, "", None)
    # vLLM's KV blocks (32 KiB), one merged piece of two: blocks of 32 KiB.
    sub = SubOp(region, remote, u(0, 98304), u(32768, 0), u(65536, 32768))
    assert pieces(sub) == (32768, [(0, 32768, 32768), (0, 65536, 32768), (0, 0, 32768)], [(0, 0), (1, 0), (3, 0)])
    # Not multiples of one block: the region as one block, no cut.
    sub = SubOp(region, remote, u(100, 8192), u(0, 4096), u(4096, 4096))
    assert pieces(sub) == (1 << 20, [(0, 0, 4096), (0, 4096, 4096)], [(0, 100), (0, 8192)])
