"""ferry.nixl on Ferry's engine, two processes: the call sequence vLLM's
NixlConnector makes, with this process as the decode worker and
tests/nixl_peer.py as the prefill worker. Register a KV pool, exchange
agent metadata, prepare block lists, post READs and WRITEs with
notifications, poll the states, read the notifications, release, remove
the agent, deregister; every byte checked. Then the failures: a
deregistered region, a removed agent and a killed peer end ``"ERR"`` (or
NIXL's exception) within a second, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

import ferry
import ferry.nixl._bindings as nixl
from ferry.nixl._api import nixl_agent, nixl_agent_config

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nixl_peer import pattern  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(ferry.Connector, "offer") or not hasattr(ferry.RemoteGrant, "read_ranges"),
    reason="this Ferry has no offers or byte ranges",
)

LAYERS, BLOCKS, BLOCK_LEN = 4, 64, 4096


class Peer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "nixl_peer.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, **req: Any) -> Dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the peer exited"
        answer: Dict[str, Any] = json.loads(line)
        assert answer["ok"], answer
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


def blocks_data(bases: List[int]) -> List[Any]:
    """vLLM's descriptors: every block of every layer, layer by layer."""
    return [(base + b * BLOCK_LEN, BLOCK_LEN, 0) for base in bases for b in range(BLOCKS)]


def desc_ids(block_ids: List[int]) -> np.ndarray:
    """vLLM's descriptor ids of blocks, in every layer."""
    return np.array([layer * BLOCKS + b for layer in range(LAYERS) for b in block_ids], dtype=np.int64)


def wait_state(agent: nixl_agent, handle: Any, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        s = agent.check_xfer_state(handle)
        if s != "PROC":
            return s
        assert time.monotonic() < deadline, "a transfer still in progress"
        time.sleep(0.0005)


class Decode:
    """This process's side: an agent and a KV cache of zeros, registered and
    prepared as vLLM's NixlConnector does."""

    def __init__(self, peer: Peer) -> None:
        self.agent = nixl_agent(str(uuid.uuid4()), nixl_agent_config(backends=["UCX"]))
        self.kv = [np.zeros((BLOCKS, BLOCK_LEN), dtype=np.uint8) for _ in range(LAYERS)]
        caches = [(t.ctypes.data, t.nbytes, 0, "") for t in self.kv]
        self.reg = self.agent.get_reg_descs(caches, "DRAM")
        self.agent.register_memory(self.reg, backends=["UCX"])
        descs = self.agent.get_xfer_descs(blocks_data([t.ctypes.data for t in self.kv]), "DRAM")
        self.local = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", descs)
        init = peer.call(cmd="init", name="prefill-" + uuid.uuid4().hex[:8], layers=LAYERS, blocks=BLOCKS, block_len=BLOCK_LEN)
        self.remote_name = self.agent.add_remote_agent(bytes.fromhex(init["metadata"]))
        rdescs = self.agent.get_xfer_descs(blocks_data(init["bases"]), "DRAM")
        self.remote = self.agent.prep_xfer_dlist(self.remote_name, rdescs)

    def read(self, local_ids: List[int], remote_ids: List[int], notif: bytes) -> Any:
        h = self.agent.make_prepped_xfer("READ", self.local, desc_ids(local_ids), self.remote, desc_ids(remote_ids), notif_msg=notif)
        assert self.agent.transfer(h) in ("DONE", "PROC")
        return h


def test_vllm_connector_sequence(peer: Peer) -> None:
    d = Decode(peer)
    a = d.agent
    rng = np.random.default_rng(7)
    # READ: 12 random prefill blocks into 12 decode blocks, every layer.
    remote_ids = rng.choice(BLOCKS, 12, replace=False).tolist()
    local_ids = rng.choice(BLOCKS, 12, replace=False).tolist()
    h = d.read(local_ids, remote_ids, b"req-1:1")
    assert wait_state(a, h) == "DONE"
    a.release_xfer_handle(h)
    for layer in range(LAYERS):
        for lb, rb in zip(local_ids, remote_ids):
            assert (d.kv[layer][lb] == pattern(layer, rb, BLOCK_LEN)).all()
    untouched = sorted(set(range(BLOCKS)) - set(local_ids))
    assert not d.kv[0][untouched].any()
    # 8 READs in flight at once, into distinct blocks of the same regions.
    handles = [d.read([40 + i], [i], f"req-{i + 2}:1".encode()) for i in range(8)]
    for i, h in enumerate(handles):
        assert wait_state(a, h) == "DONE"
        a.release_xfer_handle(h)
        for layer in range(LAYERS):
            assert (d.kv[layer][40 + i] == pattern(layer, i, BLOCK_LEN)).all()
    # WRITE: decode blocks into prefill's, with a notification.
    for layer in range(LAYERS):
        d.kv[layer][50] = 0xA5
        d.kv[layer][51] = 0x5A
    w = a.make_prepped_xfer("WRITE", d.local, desc_ids([50, 51]), d.remote, desc_ids([60, 61]), "write-1")
    assert a.transfer(w) in ("DONE", "PROC")
    assert wait_state(a, w) == "DONE"
    notifs = peer.call(cmd="notifs", count=10)["notifs"]
    assert {k: [bytes.fromhex(m) for m in v] for k, v in notifs.items()} == {
        a.name: [b"req-1:1"] + [f"req-{i + 2}:1".encode() for i in range(8)] + [b"write-1"]
    } or sorted(bytes.fromhex(m) for m in notifs[a.name]) == sorted(
        [b"req-1:1", b"write-1"] + [f"req-{i + 2}:1".encode() for i in range(8)]
    )
    for layer in range(LAYERS):
        assert peer.call(cmd="block", layer=layer, block=60)["bytes"] == "a5" * BLOCK_LEN
        assert peer.call(cmd="block", layer=layer, block=61)["bytes"] == "5a" * BLOCK_LEN
        assert bytes.fromhex(peer.call(cmd="block", layer=layer, block=62)["bytes"]) == pattern(layer, 62, BLOCK_LEN).tobytes()
    # A notification with no transfer (vLLM's, for a request with no blocks),
    # and a long one (NIXL has no limit; Ferry's are 256 bytes each).
    a.send_notif(d.remote_name, b"req-9:1")
    a.send_notif(d.remote_name, b"x" * 5000)
    notifs = peer.call(cmd="notifs", count=2)["notifs"]
    assert [bytes.fromhex(m) for m in notifs[a.name]] == [b"req-9:1", b"x" * 5000]
    # Telemetry is off unless asked for, as NIXL's.
    with pytest.raises(nixl.nixlNoTelemetryError):
        a.get_xfer_telemetry(w)
    # Teardown, in vLLM's order.
    a.release_xfer_handle(w)
    a.release_dlist_handle(d.local)
    a.release_dlist_handle(d.remote)
    a.remove_remote_agent(d.remote_name)
    a.deregister_memory(d.reg)
    a.close()


def test_deregistered_region_then_removed_agent(peer: Peer) -> None:
    d = Decode(peer)
    a = d.agent
    h = d.read([0], [1], b"first")
    assert wait_state(a, h) == "DONE"
    peer.call(cmd="deregister")
    t0 = time.monotonic()
    state = a.transfer(h)
    if state == "PROC":
        state = wait_state(a, h, timeout=1.0)
    assert state == "ERR" and time.monotonic() - t0 < 1.0
    assert a.get_xfer_error(h) is not None
    a.remove_remote_agent(d.remote_name)
    with pytest.raises(nixl.nixlNotFoundError):
        a.transfer(h)
    assert a.check_xfer_state(h) == "ERR"
    with pytest.raises(nixl.nixlNotFoundError):
        a.make_prepped_xfer("READ", d.local, [0], d.remote, [0])
    a.close()


def test_killed_peer_gives_err_not_a_hang(peer: Peer) -> None:
    d = Decode(peer)
    a = d.agent
    h = d.read(list(range(BLOCKS)), list(range(BLOCKS)), b"all")
    assert wait_state(a, h) == "DONE"
    peer.proc.kill()
    peer.proc.wait()
    t0 = time.monotonic()
    try:
        state = a.transfer(h)
        if state == "PROC":
            state = wait_state(a, h, timeout=1.0)
    except nixl.nixlError:
        state = "ERR"
    assert state == "ERR"
    assert time.monotonic() - t0 < 1.0
    a.close()


def test_metadata_by_address_and_serialized_descs(peer: Peer) -> None:
    """NIXL's basic two-peer example's sequence: metadata through the
    listeners, the target's descriptors as a notification, one READ."""
    init = peer.call(cmd="init", name="target", layers=1, blocks=BLOCKS, block_len=BLOCK_LEN, listen=True)
    a = nixl_agent("initiator-" + uuid.uuid4().hex[:6], nixl_agent_config(True, True, 0))
    mine = np.zeros((BLOCKS, BLOCK_LEN), dtype=np.uint8)
    reg = a.register_memory([(mine.ctypes.data, mine.nbytes, 0, "")], "DRAM")
    a.fetch_remote_metadata("target", "127.0.0.1", init["port"])
    a.send_local_metadata("127.0.0.1", init["port"])
    peer.call(cmd="send_rows", agent=a.name)
    deadline = time.monotonic() + 10
    notifs: Dict[str, List[bytes]] = {}
    while "target" not in notifs:
        assert time.monotonic() < deadline
        notifs = a.get_new_notifs()
    target_descs = a.deserialize_descs(notifs["target"][0])
    assert target_descs.descCount() == BLOCKS
    while not a.check_remote_metadata("target"):
        assert time.monotonic() < deadline
    mine_descs = a.get_xfer_descs([(mine.ctypes.data + b * BLOCK_LEN, BLOCK_LEN, 0) for b in range(BLOCKS)], "DRAM")
    h = a.initialize_xfer("READ", mine_descs, target_descs, "target", "Done_reading")
    assert a.transfer(h) != "ERR"
    assert wait_state(a, h) == "DONE"
    for b in range(BLOCKS):
        assert (mine[b] == pattern(0, b, BLOCK_LEN)).all()
    assert [bytes.fromhex(m) for m in peer.call(cmd="notifs", count=1)["notifs"][a.name]] == [b"Done_reading"]
    a.remove_remote_agent("target")
    a.release_xfer_handle(h)
    a.invalidate_local_metadata("127.0.0.1", init["port"])
    a.deregister_memory(reg)
    a.close()


def test_peer_killed_mid_transfer_ends_without_a_hang(peer: Peer) -> None:
    """A READ of 64 MiB posted and the owner killed at once: the transfer
    ends, DONE (it won the race) or ERR, within a second of the kill."""
    init = peer.call(cmd="init", name="prefill-big", layers=1, blocks=64, block_len=1 << 20)
    a = nixl_agent("decode-" + uuid.uuid4().hex[:6])
    mine = np.zeros(64 << 20, dtype=np.uint8)
    a.register_memory([(mine.ctypes.data, mine.nbytes, 0, "")], "DRAM")
    name = a.add_remote_agent(bytes.fromhex(init["metadata"]))
    h = a.initialize_xfer(
        "READ",
        a.get_xfer_descs([(mine.ctypes.data, 64 << 20, 0)], "DRAM"),
        a.get_xfer_descs([(init["bases"][0], 64 << 20, 0)], "DRAM"),
        name,
    )
    state = a.transfer(h)
    peer.proc.kill()
    t0 = time.monotonic()
    peer.proc.wait()
    if state == "PROC":
        state = wait_state(a, h, timeout=1.0)
    assert state in ("DONE", "ERR") and time.monotonic() - t0 < 1.0
    a.release_xfer_handle(h)
    a.close()
