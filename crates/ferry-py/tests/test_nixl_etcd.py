"""ferry.nixl's central metadata store: with NIXL_ETCD_ENDPOINTS set, the
metadata calls given no peer address go through a real etcd the test
starts (the flow of NIXL's partial_md_example.py --etcd): partial metadata
sent under two labels and fetched one at a time, a transfer refused before
its region's metadata arrived, full metadata, values sealed with
FERRY_SECRET, and invalidation withdrawing every value."""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable

import numpy as np
import pytest
from test_control_etcd import SECRET, Etcd, etcd  # noqa: F401 (the fixture)

import ferry.nixl._bindings as nixl
from ferry.nixl._api import nixl_agent, nixl_agent_config

NAMESPACE = "/test/agents"
N = 4096


def stored_at(agent: str, label: str) -> str:
    return f"{NAMESPACE}/ferry/" + hashlib.sha256(agent.encode() + b"\0" + label.encode()).hexdigest()


def until(cond: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def read(init: nixl_agent, target: str, ours: Any, theirs_addr: int, notif: bytes) -> None:
    local = init.get_xfer_descs([(ours.ctypes.data, N, 0)], "DRAM")
    far = init.get_xfer_descs([(theirs_addr, N, 0)], "DRAM")
    h = init.initialize_xfer("READ", local, far, target, notif)
    assert init.transfer(h) != "ERR"
    until(lambda: init.check_xfer_state(h) == "DONE", "the READ")
    init.release_xfer_handle(h)


@pytest.mark.parametrize("sealed", [False, True])
def test_partial_metadata_through_etcd(etcd: Etcd, monkeypatch: pytest.MonkeyPatch, sealed: bool) -> None:  # noqa: F811
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", etcd.url)
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", NAMESPACE)
    if sealed:
        monkeypatch.setenv("FERRY_SECRET", SECRET)
    tname, iname = f"etcd-target-{sealed}", f"etcd-init-{sealed}"
    target = nixl_agent(tname, nixl_agent_config(True, False, 0))
    init = nixl_agent(iname, nixl_agent_config(True, False, 0))
    a = (np.arange(N) % 251).astype(np.uint8)
    b = ((np.arange(N) * 7) % 251).astype(np.uint8)
    ours = np.zeros(N, dtype=np.uint8)
    reg_a = target.register_memory(target.get_reg_descs([(a.ctypes.data, N, 0, "")], "DRAM"))
    reg_b = target.register_memory(target.get_reg_descs([(b.ctypes.data, N, 0, "")], "DRAM"))
    init.register_memory(init.get_reg_descs([(ours.ctypes.data, N, 0, "")], "DRAM"))

    # Region a's metadata under label_1: fetched, a's bytes read.
    target.send_partial_agent_metadata(reg_a, True, ["UCX"], label="label_1")
    raw = etcd.get(stored_at(tname, "label_1"))
    assert raw is not None
    # Sealed with the secret: etcd never holds it in clear.
    assert (tname.encode() in raw) is not sealed
    init.fetch_remote_metadata(tname, label="label_1")
    until(lambda: init.check_remote_metadata(tname, init.get_xfer_descs([(a.ctypes.data, N, 0)], "DRAM")), "label_1")
    read(init, tname, ours, a.ctypes.data, b"UUID1")
    assert np.array_equal(ours, a)
    until(lambda: target.check_remote_xfer_done(iname, b"UUID1"), "the notification")
    # Region b's metadata has not been sent: a transfer from it is refused.
    with pytest.raises(nixl.nixlNotFoundError):
        read(init, tname, ours, b.ctypes.data, b"UUID2")
    target.send_partial_agent_metadata(reg_b, True, ["UCX"], label="label_2")
    init.fetch_remote_metadata(tname, label="label_2")
    until(lambda: init.check_remote_metadata(tname, init.get_xfer_descs([(b.ctypes.data, N, 0)], "DRAM")), "label_2")
    read(init, tname, ours, b.ctypes.data, b"UUID2")
    assert np.array_equal(ours, b)

    # The whole metadata, under NIXL's default label; sent again, replaced.
    target.send_local_metadata()
    target.send_local_metadata()
    assert etcd.get(stored_at(tname, "metadata")) is not None
    # Invalidation withdraws every value the agent stored.
    target.invalidate_local_metadata()
    for label in ("label_1", "label_2", "metadata"):
        assert etcd.get(stored_at(tname, label)) is None
    # A peer made without the store still refuses an address-less call.
    monkeypatch.delenv("NIXL_ETCD_ENDPOINTS")
    lone = nixl_agent(f"etcd-lone-{sealed}", nixl_agent_config(True, False, 0))
    with pytest.raises(nixl.nixlNotSupportedError, match="NIXL_ETCD_ENDPOINTS"):
        lone.send_local_metadata()
    for agent in (lone, init, target):
        agent.close()
