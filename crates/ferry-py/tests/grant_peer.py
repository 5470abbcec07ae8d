"""The holder process of the grant tests (tests/test_grants.py).

Run as ``python grant_peer.py WORKER_ID``: a connector with that worker id,
driven by JSON lines on stdin, one answer line on stdout each. Every answer
is ``{"ok": true, ...}`` or ``{"ok": false, "error": class name, "message":
...}``. Commands:

- ``open`` (``metadata``: the grant's JSON): opens the grant.
- ``read`` (``remote``: indices or ``[index, generation]`` pairs): reads
  those blocks into a fresh local pool; answers ``blocks``, each block's
  bytes as hex.
- ``write`` (``fills``: one byte value per block, ``remote``, ``notify``:
  text or null): writes blocks filled with those values; answers ok.
- ``refs`` (``indices``): answers ``refs``, the blocks' current
  ``[index, generation]`` pairs.
- ``exit``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, Dict, Optional

import ferry

connector = ferry.Connector(sys.argv[1], listen="127.0.0.1:0")
remote: Optional[ferry.RemoteGrant] = None


def refs(items: Any) -> Any:
    return [tuple(x) if isinstance(x, list) else x for x in items]


async def serve(req: Dict[str, Any]) -> Dict[str, Any]:
    global remote
    cmd = req["cmd"]
    if cmd == "open":
        remote = await connector.open_grant(req["metadata"])
        return {"ok": True, "block_size": remote.block_size}
    assert remote is not None
    bs = remote.block_size
    if cmd == "read":
        n = len(req["remote"])
        mem = bytearray(n * bs)
        pool = ferry.Pool(mem, bs)
        await remote.read_blocks(refs(req["remote"]), pool, list(range(n)))
        return {"ok": True, "blocks": [mem[i * bs : (i + 1) * bs].hex() for i in range(n)]}
    if cmd == "write":
        fills = req["fills"]
        mem = bytearray(b"".join(bytes([f]) * bs for f in fills))
        pool = ferry.Pool(mem, bs)
        notify = req.get("notify")
        await remote.write_blocks(
            pool,
            list(range(len(fills))),
            refs(req["remote"]),
            notify=None if notify is None else notify.encode(),
        )
        return {"ok": True}
    if cmd == "refs":
        return {"ok": True, "refs": [list(r) for r in remote.block_refs(req["indices"])]}
    raise ValueError(f"unknown command {cmd!r}")


async def main() -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        req = json.loads(line)
        if req["cmd"] == "exit":
            return
        try:
            answer = await serve(req)
        except Exception as e:  # reported to the test
            answer = {"ok": False, "error": type(e).__name__, "message": str(e)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


asyncio.run(main())
