"""Latency and bandwidth of Ferry from Python, measured as `ferry demo` does.

    python crates/ferry-py/bench.py [--size MiB] [--ops N]

Starts a second Python process (this script with --peer) and talks to it over
its stdin/stdout pipes, as the demo talks to `ferry peer`:

- 4 KiB WRITE and READ, end to end: this process creates a writable (or a
  readable), hands the metadata JSON to the peer through the pipe, the peer
  starts the write (read) and waits for it, answers, and this process waits
  for its own side and the answer. p50 and p99 of --ops operations.
- A baseline in the same run: a 4 KiB message echoed through the same pipe
  (no Ferry), so that the figures above can be read as a ratio.
- --size MiB (default 64) READ and WRITE, end to end, in GB/s (10^9 bytes/s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

import ferry
from ferry import Descriptor, RdmaMetadata


def resident(size: int) -> bytearray:
    """A buffer of random bytes, every page mapped. `bytearray(size)` maps
    pages only when first touched, and pages of one repeated byte may be
    merged by the kernel (copy-on-write): either way, page faults would be
    measured with the transfer."""
    block = os.urandom(min(size, 1 << 20))
    return (bytearray(block) * (size // len(block) + 1))[:size] if size else bytearray()


async def peer() -> None:
    """The other worker: serves requests from stdin, one at a time."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    c = ferry.Connector(listen="127.0.0.1:0")
    cache: Dict[int, bytearray] = {}
    while True:
        line = await reader.readline()
        if not line:
            return
        req = json.loads(line)
        if req["cmd"] == "echo":
            writer.write(line)
            continue
        size = req["size"]
        if size not in cache:
            cache[size] = resident(size)
        buf = cache[size]
        meta = RdmaMetadata.from_json(req["metadata"])
        if req["cmd"] == "write":
            op = await c.begin_write(Descriptor(buf), meta)
        else:
            op = await c.begin_read(meta, Descriptor(buf))
        with op:
            await op.wait_for_completion()
        writer.write(b'{"done": true}\n')


class Peer:
    def __init__(self, proc: Any) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> "Peer":
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            os.path.abspath(__file__),
            "--peer",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 26,
        )
        return cls(proc)

    async def call(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the peer process died")
        result: Dict[str, Any] = json.loads(line)
        return result

    async def close(self) -> None:
        self.proc.stdin.close()
        await self.proc.wait()


async def transfer(c: ferry.Connector, p: Peer, buf: bytearray, cmd: str) -> float:
    """One operation end to end; seconds."""
    t = time.perf_counter()
    if cmd == "write":  # the peer writes into our writable
        op = await c.create_writable(Descriptor(buf))
    else:  # the peer reads our readable
        op = await c.create_readable(Descriptor(buf))
    with op:
        answer = asyncio.ensure_future(p.call({"cmd": cmd, "size": len(buf), "metadata": op.metadata().to_json()}))
        await op.wait_for_completion()
        await answer
    return time.perf_counter() - t


def percentiles(xs: List[float]) -> str:
    us = sorted(x * 1e6 for x in xs)
    return f"p50 {statistics.median(us):.0f} us, p99 {us[min(len(us) - 1, len(us) * 99 // 100)]:.0f} us"


async def main(size_mib: int, ops: int, reps: int) -> None:
    c = ferry.Connector(listen="127.0.0.1:0")
    p = await Peer.start()
    small = bytearray(os.urandom(4096))
    size = size_mib << 20
    for _ in range(20):  # warm up: connection, caches
        await transfer(c, p, small, "write")
        await transfer(c, p, small, "read")

    echo = []
    payload = {"cmd": "echo", "data": small.hex()}
    for _ in range(ops):
        t = time.perf_counter()
        await p.call(payload)
        echo.append(time.perf_counter() - t)
    writes = [await transfer(c, p, small, "write") for _ in range(ops)]
    reads = [await transfer(c, p, small, "read") for _ in range(ops)]
    print(f"4 KiB WRITE, end to end incl. metadata hand-over through a pipe: {percentiles(writes)} ({ops} operations)")
    print(f"4 KiB READ,  end to end incl. metadata hand-over through a pipe: {percentiles(reads)} ({ops} operations)")
    print(f"baseline: 4 KiB echoed through the same pipe, no Ferry:         {percentiles(echo)}")

    big = resident(size)
    for cmd, name in (("read", "READ "), ("write", "WRITE")):
        best = min([await transfer(c, p, big, cmd) for _ in range(reps)])
        print(f"{size_mib} MiB {name}, end to end: {best * 1e3:.1f} ms, {size / best / 1e9:.2f} GB/s (best of {reps})")
    await p.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=64, help="MiB for the bandwidth figures (default 64)")
    ap.add_argument("--ops", type=int, default=200, help="operations for the latency figures (default 200)")
    ap.add_argument("--reps", type=int, default=5, help="transfers per bandwidth figure, best kept (default 5)")
    args = ap.parse_args()
    asyncio.run(peer() if args.peer else main(args.size, args.ops, args.reps))
