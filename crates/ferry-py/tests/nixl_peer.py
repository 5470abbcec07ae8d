"""The prefill side of tests/test_nixl_ferry.py: a ferry.nixl agent with a
KV cache of its own, driven by JSON lines on stdin, one answer line on
stdout each (``{"ok": true, ...}`` or ``{"ok": false, "error": class name,
"message": ...}``).

Its cache is ``layers`` regions of ``blocks`` blocks of ``block_len`` bytes,
registered as vLLM's NixlConnector registers its KV caches; byte ``i`` of
block ``b`` of layer ``l`` starts as :func:`pattern` ``(l, b)[i]``.

Commands: ``init`` (``name``, ``layers``, ``blocks``, ``block_len``):
answers the agent's metadata (hex) and the regions' base addresses;
``add`` (``metadata``, hex): adds the decode agent; ``notifs`` (``count``,
``timeout``): waits for that many notification messages, answers them by
sender (hex); ``block`` (``layer``, ``block``): answers the block's bytes
(hex); ``send`` (``agent``, ``msg``, hex): sends a notification; ``send_rows``
(``agent``): waits for its metadata (from the listener, ``init`` with
``listen``), then sends it the serialized list of layer 0's blocks;
``deregister``: deregisters the cache; ``exit``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

from ferry.nixl._api import nixl_agent, nixl_agent_config


def pattern(layer: int, block: int, block_len: int) -> np.ndarray:
    """The bytes block `block` of layer `layer` starts with."""
    i = np.arange(block_len, dtype=np.uint32)
    return ((i * 13 + layer * 131 + block * 7 + 1) % 251).astype(np.uint8)


agent: Optional[nixl_agent] = None
layers: List[np.ndarray] = []
reg: Any = None


def serve(req: Dict[str, Any]) -> Dict[str, Any]:
    global agent, reg
    cmd = req["cmd"]
    if cmd == "init":
        listen = bool(req.get("listen"))
        agent = nixl_agent(req["name"], nixl_agent_config(True, listen, 0, backends=["UCX"]))
        n, bl = req["blocks"], req["block_len"]
        for layer in range(req["layers"]):
            t = np.empty((n, bl), dtype=np.uint8)
            for b in range(n):
                t[b] = pattern(layer, b, bl)
            layers.append(t)
        caches = [(t.ctypes.data, t.nbytes, 0, "") for t in layers]
        reg = agent.get_reg_descs(caches, "DRAM")
        agent.register_memory(reg, backends=["UCX"])
        return {
            "ok": True,
            "metadata": agent.get_agent_metadata().hex(),
            "bases": [t.ctypes.data for t in layers],
            "port": agent.listen_port,
        }
    assert agent is not None
    if cmd == "add":
        return {"ok": True, "name": agent.add_remote_agent(bytes.fromhex(req["metadata"])).decode()}
    if cmd == "notifs":
        got: Dict[str, List[str]] = {}
        deadline = time.monotonic() + req.get("timeout", 10)
        while sum(len(v) for v in got.values()) < req["count"] and time.monotonic() < deadline:
            for who, msgs in agent.get_new_notifs().items():
                got.setdefault(who, []).extend(m.hex() for m in msgs)
            time.sleep(0.001)
        return {"ok": True, "notifs": got}
    if cmd == "block":
        return {"ok": True, "bytes": layers[req["layer"]][req["block"]].tobytes().hex()}
    if cmd == "send":
        agent.send_notif(req["agent"], bytes.fromhex(req["msg"]))
        return {"ok": True}
    if cmd == "send_rows":
        # As NIXL's basic example: once the agent's metadata has come, send
        # it the serialized transfer list of the first layer's blocks.
        deadline = time.monotonic() + req.get("timeout", 10)
        while not agent.check_remote_metadata(req["agent"]):
            if time.monotonic() > deadline:
                raise TimeoutError("no metadata of " + req["agent"])
            time.sleep(0.001)
        rows = [(layers[0].ctypes.data + b * layers[0].shape[1], layers[0].shape[1], 0) for b in range(layers[0].shape[0])]
        agent.send_notif(req["agent"], agent.get_serialized_descs(agent.get_xfer_descs(rows, "DRAM")))
        return {"ok": True}
    if cmd == "deregister":
        agent.deregister_memory(reg)
        return {"ok": True}
    raise ValueError(f"unknown command {cmd!r}")


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "exit":
            break
        try:
            answer = serve(req)
        except Exception as e:  # reported to the test
            answer = {"ok": False, "error": type(e).__name__, "message": str(e)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    if agent is not None:
        agent.close()


if __name__ == "__main__":
    main()
