"""The other worker process of the cross-process tests.

Run as ``python helper.py``: it listens on a loopback TCP port, prints the
port on stdout, and serves any number of connections. Each connection carries
JSON lines: requests ``{"id", "cmd", ...}`` and answers ``{"id", "event",
...}``; requests are served concurrently. Commands:

- ``readable`` / ``writable`` (``sizes``, ``kind``, ``seed``): expose buffers
  (holding ``seed``'s pattern for a readable, zeroed for a writable); answer
  ``metadata`` (JSON), then ``done`` (``status``, ``error``, and for a
  writable ``verified``: whether the pattern arrived).
- ``read`` / ``write`` (``metadata``, ``sizes``, ``kind``, ``seed``): start
  the operation against the given metadata; answer ``done`` (``verified``
  for a read). ``cancel``: cancel it right after it started.
- ``readable_many`` / ``writable_many`` (``count``, ``size``, ``seed``):
  ``count`` operations of one descriptor each; answer ``metadata`` with a
  list, then ``done`` with ``completed`` (how many completed) and
  ``verified``.
- ``read_many`` / ``write_many`` (``metadata``: a list, ``size``, ``seed``):
  start them all at once with asyncio.gather; answer ``done``.
- ``ping``: answer ``pong`` with the ``pid``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import buffers  # noqa: E402

import ferry  # noqa: E402

connector: ferry.Connector


def describe_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


async def wait(op: Any) -> Dict[str, Any]:
    try:
        await op.wait_for_completion()
        error = None
    except Exception as e:  # reported to the test
        error = describe_error(e)
    return {"status": op.status.name, "error": error, "transport": op.transport}


async def serve(req: Dict[str, Any], send: Any) -> None:
    rid, cmd = req["id"], req["cmd"]
    kind = req.get("kind", "bytearray")
    seed = req.get("seed", 0)  # None: zeros
    sizes = req.get("sizes", [])
    try:
        if cmd == "ping":
            send({"id": rid, "event": "pong", "pid": os.getpid()})
        elif cmd in ("readable", "writable"):
            bufs = buffers.make(kind, sizes, seed if cmd == "readable" else None)
            descs = [buffers.descriptor(kind, b) for b in bufs]
            create = connector.create_readable if cmd == "readable" else connector.create_writable
            with await create(descs) as op:
                send({"id": rid, "event": "metadata", "metadata": op.metadata().model_dump_json()})
                done = await wait(op)
            if cmd == "writable":
                done["verified"] = buffers.verify(kind, bufs, seed)
            send({"id": rid, "event": "done", **done})
        elif cmd in ("read", "write"):
            meta = ferry.RdmaMetadata.model_validate_json(req["metadata"])
            bufs = buffers.make(kind, sizes, seed if cmd == "write" else None)
            descs = [buffers.descriptor(kind, b) for b in bufs]
            if cmd == "read":
                pending = connector.begin_read(meta, descs)
            else:
                pending = connector.begin_write(descs, meta)
            async with pending as op:
                if req.get("cancel"):
                    op.cancel()
                done = await wait(op)
            if cmd == "read":
                done["verified"] = buffers.verify(kind, bufs, seed)
            send({"id": rid, "event": "done", **done})
        elif cmd in ("readable_many", "writable_many"):
            count, size = req["count"], req["size"]
            readable = cmd == "readable_many"
            bufs = [bytearray(buffers.pattern(seed, i, size)) if readable else bytearray(size) for i in range(count)]
            create = connector.create_readable if readable else connector.create_writable
            ops = [await create(ferry.Descriptor(b)) for b in bufs]
            send({"id": rid, "event": "metadata", "metadata": [op.metadata().to_json() for op in ops]})
            results = await asyncio.gather(*(wait(op) for op in ops))
            completed = sum(r["status"] == "COMPLETE" for r in results)
            verified = readable or all(bytes(b) == buffers.pattern(seed, i, size) for i, b in enumerate(bufs))
            errors = sorted({r["error"] for r in results if r["error"]})
            send({"id": rid, "event": "done", "completed": completed, "verified": verified, "errors": errors})
        elif cmd in ("read_many", "write_many"):
            metas = [ferry.RdmaMetadata.from_json(m) for m in req["metadata"]]
            size = req["size"]
            reading = cmd == "read_many"
            bufs = [bytearray(size) if reading else bytearray(buffers.pattern(seed, i, size)) for i in range(len(metas))]
            if reading:
                ops = await asyncio.gather(*(connector.begin_read(m, ferry.Descriptor(b)) for m, b in zip(metas, bufs)))
            else:
                ops = await asyncio.gather(*(connector.begin_write(ferry.Descriptor(b), m) for m, b in zip(metas, bufs)))
            results = await asyncio.gather(*(wait(op) for op in ops))
            completed = sum(r["status"] == "COMPLETE" for r in results)
            verified = not reading or all(bytes(b) == buffers.pattern(seed, i, size) for i, b in enumerate(bufs))
            errors = sorted({r["error"] for r in results if r["error"]})
            send({"id": rid, "event": "done", "completed": completed, "verified": verified, "errors": errors})
        else:
            send({"id": rid, "event": "error", "error": f"unknown command {cmd!r}"})
    except Exception as e:
        send({"id": rid, "event": "done", "status": "NOT_STARTED", "error": describe_error(e)})


async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    def send(msg: Dict[str, Any]) -> None:
        writer.write(json.dumps(msg).encode() + b"\n")

    tasks = set()
    while True:
        line = await reader.readline()
        if not line:
            break
        task = asyncio.ensure_future(serve(json.loads(line), send))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in list(tasks):
        task.cancel()
    writer.close()


async def main() -> None:
    global connector
    connector = ferry.Connector(listen="127.0.0.1:0")
    server = await asyncio.start_server(client, "127.0.0.1", 0, limit=1 << 24)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


def exit_with_parent() -> None:
    # The test process holds our stdin: when it goes, so do we.
    sys.stdin.read()
    os._exit(0)


if __name__ == "__main__":
    threading.Thread(target=exit_with_parent, daemon=True).start()
    asyncio.run(main())
