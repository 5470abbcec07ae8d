"""KV-cache shapes between two Python processes: ``python -m ferry.bench_kv``.

The Python twin of ``ferry bench --workload kv``. This process (the
initiator) spawns another (``python -m ferry.bench_kv --serve``, driven by
JSON lines on its stdin), and both register a NumPy array of ``blocks x
block`` bytes as a :class:`ferry.Pool` (NumPy asks the kernel for
transparent huge pages for large arrays, as ``Pool::allocate`` does in
Rust). Each round, the other process exposes a shuffled list of block ids
(a readable for READ shapes, a writable for WRITE ones) and hands its
metadata over the pipe; this process reads them into (or writes them from)
another shuffled list of its own blocks. The first round checks every byte.

Columns: GB/s over the wall time from the first operation's creation to
the last one's completion (median of the rounds); the median time to create
one operation (``pool.blocks(ids)`` and ``await connector.begin_read`` /
``begin_write``, until it returns); the metadata's JSON bytes. Next to each
row, the same shape measured by the Rust bench in the same run (``ferry
bench --workload kv --shapes NAME --inflight N --via T``; give the
``ferry`` binary with ``--ferry`` or ``FERRY_BIN``), and the ratio.

``--tiny`` runs small READ and WRITE shapes, checking every byte: a test,
not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import ferry

try:
    import numpy
except ImportError:  # pragma: no cover - the bench needs NumPy
    numpy = None  # type: ignore[assignment]


class Shape(NamedTuple):
    name: str
    block: int
    blocks: int
    write: bool


# The shapes of `ferry bench --workload kv` (crates/ferry-cli/src/kv.rs),
# with every block id on its own.
SHAPES = [
    Shape("kv-vllm", 32 << 10, 16_384, False),
    Shape("kv-tp8", 4 << 10, 16_384, False),
    Shape("kv-cross-layer", 2 << 20, 256, False),
    Shape("kv-sglang-page1", 2 << 10, 262_144, True),
]

TINY = [Shape("tiny-read", 4 << 10, 512, False), Shape("tiny-write", 2 << 10, 1024, True)]

# Whether pools are page-aligned (--page-aligned; children inherit it).
ALIGN = os.environ.get("FERRY_BENCH_PAGE_ALIGNED") == "1"

# What the initiator's seed differs by from the other process's.
LOCAL = 0xA5A5


def block_ids(n: int, seed: int) -> Any:
    """A permutation of ``0..n`` (seeded): both processes compute it."""
    return numpy.random.default_rng(seed).permutation(n).astype(numpy.uint32)


def make_pool(shape: Shape) -> Tuple[Any, ferry.Pool]:
    """``blocks x block`` bytes, block `id` holding its id in its first
    eight bytes and ``id & 0xff`` in the rest (so written once: its pages
    are real), registered as a pool."""
    n, b = shape.blocks, shape.block
    if ALIGN:
        # Page-aligned (NumPy's own large arrays start 16 bytes into a page).
        raw = numpy.empty(n * b + 4096, dtype=numpy.uint8)
        skip = -raw.ctypes.data % 4096
        array = raw[skip : skip + n * b].reshape(n, b)
    else:
        array = numpy.empty((n, b), dtype=numpy.uint8)
    ids = numpy.arange(n, dtype=numpy.uint64)
    array[:] = (ids & 0xFF).astype(numpy.uint8)[:, None]
    k = min(8, b)
    array[:, :k] = ids.astype("<u8").view(numpy.uint8).reshape(n, 8)[:, :k]
    return array, ferry.Pool(array)


def check(array: Any, dst: Any, src: Any) -> Optional[str]:
    """None if blocks `dst` of `array` hold what blocks `src` of the other
    side held (see :func:`make_pool`), else what is wrong."""
    b = array.shape[1]
    k = min(8, b)
    step = max(1, (64 << 20) // b)
    for start in range(0, len(dst), step):
        d, s = dst[start : start + step], src[start : start + step].astype(numpy.uint64)
        got = array[d]
        head = s.astype("<u8").view(numpy.uint8).reshape(len(s), 8)[:, :k]
        bad = ~((got[:, :k] == head).all(axis=1) & (got[:, k:] == (s & 0xFF).astype(numpy.uint8)[:, None]).all(axis=1))
        if bad.any():
            i = int(numpy.argmax(bad))
            return f"block {int(d[i])} (entry {start + i}) does not hold block {int(s[i])} of the other side"
    return None


# ---- the other process ----


async def serve() -> None:
    """Serves requests (JSON lines on stdin) until stdin closes."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[Optional[str]] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()

    def send(obj: Dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    connector = ferry.Connector(listen="127.0.0.1:0")
    pools: Dict[Shape, Tuple[Any, ferry.Pool]] = {}
    tasks = set()
    while True:
        line = await lines.get()
        if line is None:
            break
        r = json.loads(line)
        shape = Shape(*r["shape"])
        if shape not in pools:
            pools.clear()
            pools[shape] = make_pool(shape)
        array, pool = pools[shape]
        mine = block_ids(shape.blocks, r["seed"])[r["from"] : r["to"]]
        try:
            if shape.write:
                op: Any = await connector.create_writable(pool.blocks(mine))
            else:
                op = await connector.create_readable(pool.shared_blocks(mine))
        except Exception as e:
            send({"id": r["id"], "error": f"{type(e).__name__}: {e}", "done": True})
            continue
        send({"id": r["id"], "metadata": op.metadata().to_json()})

        async def finish(r: Dict[str, Any], op: Any, array: Any, mine: Any) -> None:
            error = None
            with op:
                try:
                    await op.wait_for_completion()
                except Exception as e:
                    error = f"{type(e).__name__}: {e}"
            if error is None and r["verify"]:
                theirs = block_ids(len(array), r["seed"] ^ LOCAL)[r["from"] : r["to"]]
                error = check(array, mine, theirs)
            send({"id": r["id"], "error": error, "done": True})

        task = asyncio.ensure_future(finish(r, op, array, mine))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


# ---- the initiator ----


class Peer:
    """The other process, and its answers."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.next = 1
        self.waiting: Dict[Tuple[int, bool], asyncio.Future[Dict[str, Any]]] = {}
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls) -> Peer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ferry.bench_kv", "--serve",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        return cls(proc)

    async def _read(self) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            a = json.loads(line)
            f = self.waiting.pop((a["id"], bool(a.get("done"))), None)
            if f is not None and not f.done():
                f.set_result(a)
        for f in self.waiting.values():
            if not f.done():
                f.set_exception(RuntimeError("the other bench process exited"))

    async def expose(self, req: Dict[str, Any]) -> Tuple[str, asyncio.Future[Dict[str, Any]]]:
        rid = self.next
        self.next += 1
        loop = asyncio.get_running_loop()
        meta, done = loop.create_future(), loop.create_future()
        self.waiting[(rid, False)], self.waiting[(rid, True)] = meta, done
        self.proc.stdin.write((json.dumps({**req, "id": rid}) + "\n").encode())
        await self.proc.stdin.drain()
        await asyncio.wait({meta, done}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not meta.done():
            if not done.done():
                raise RuntimeError("the other process did not answer within 60 s")
            raise RuntimeError(f"the other process: {done.result().get('error')}")
        return meta.result()["metadata"], done

    async def close(self) -> None:
        self.proc.stdin.close()
        await self.proc.wait()
        await self.reader


class Row(NamedTuple):
    shape: str
    op: str
    inflight: int
    transport: str
    gbps: float
    create_us: float
    metadata_bytes: int


def median(v: List[float]) -> float:
    s = sorted(v)
    return s[len(s) // 2] if s else 0.0


async def measure(c: ferry.Connector, peer: Peer, pool: ferry.Pool, array: Any, s: Shape, inflight: int, rounds: int) -> Row:
    walls: List[float] = []
    creates: List[float] = []
    transports = set()
    meta_bytes = 0
    n = s.blocks
    per = -(-n // inflight)
    for rnd in range(rounds):
        seed = 0x5EED + rnd
        local, remote = block_ids(n, seed ^ LOCAL), block_ids(n, seed)
        verify = rnd == 0
        # The other side's metadata first (a side channel's work, not timed).
        metas = []
        for k in range(inflight):
            lo, hi = min(k * per, n), min((k + 1) * per, n)
            req = {"shape": list(s), "seed": seed, "from": lo, "to": hi, "verify": verify and s.write}
            text, done = await peer.expose(req)
            meta_bytes = len(text)
            metas.append((ferry.RdmaMetadata.from_json(text), done, local[lo:hi]))
        start = time.perf_counter()
        ops = []
        for meta, done, mine in metas:
            t0 = time.perf_counter()
            if s.write:
                op: Any = await c.begin_write(pool.shared_blocks(mine), meta)
            else:
                op = await c.begin_read(meta, pool.blocks(mine))
            creates.append((time.perf_counter() - t0) * 1e6)
            ops.append((op, done))
        for op, _ in ops:
            await op.wait_for_completion()
        walls.append(time.perf_counter() - start)
        for op, done in ops:
            transports.add(op.transport)
            op.__exit__(None, None, None)
            answer = await asyncio.wait_for(done, 60)
            if answer.get("error"):
                raise RuntimeError(f"{s.name}: the other process: {answer['error']}")
        # Dropped here, untimed (as in Rust), not when the next round's
        # first `op` replaces this one.
        del op
        ops.clear()
        if verify and not s.write:
            error = check(array, local, remote)
            if error is not None:
                raise RuntimeError(f"{s.name}: {error}")
    return Row(s.name, "write" if s.write else "read", inflight, ",".join(sorted(map(str, transports))), s.block * n / median(walls) / 1e9, median(creates), meta_bytes)


async def run_python(shapes: List[Shape], inflights: List[int], rounds: int) -> List[Row]:
    c = ferry.Connector(listen="127.0.0.1:0")
    peer = await Peer.start()
    rows = []
    try:
        for s in shapes:
            array, pool = make_pool(s)
            # Not measured: connects (Rust's contiguous row does it there).
            await measure(c, peer, pool, array, s, 1, 1)
            for k in inflights:
                rows.append(await measure(c, peer, pool, array, s, k, rounds))
            del pool, array
    finally:
        await peer.close()
    return rows


def find_ferry(given: Optional[str]) -> Optional[str]:
    """The ``ferry`` binary: `given`, ``FERRY_BIN``, or ``ferry`` on the PATH."""
    if given == "none":
        return None
    path = given or os.environ.get("FERRY_BIN") or shutil.which("ferry")
    return path if path and os.access(path, os.X_OK) else None


def run_rust(ferry_bin: str, shape: str, inflight: int, via: str) -> Optional[Dict[str, Any]]:
    """The Rust bench's row for `shape` (READ or WRITE as the shape has it)."""
    cmd = [ferry_bin, "bench", "--workload", "kv", "--shapes", shape, "--inflight", str(inflight), "--via", via, "--json", "-"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row["shape"] == shape and row["inflight"] == inflight:
                return dict(row)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ferry.bench_kv", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="kv-vllm", help="comma-separated, among " + ", ".join(s.name for s in SHAPES) + " (default: kv-vllm)")
    p.add_argument("--inflight", default="1", help="operations in flight, e.g. 1,8 (default 1)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=1, help="runs of Python then Rust, alternated (the machine's speed drifts)")
    p.add_argument("--ferry", help="the ferry binary for the Rust figures ('none': skip them)")
    p.add_argument("--tiny", action="store_true", help="small READ and WRITE shapes, every byte checked (a test)")
    p.add_argument("--page-aligned", action="store_true", help="pools start on a page boundary (NumPy's large arrays start 16 bytes into one; Rust's are aligned)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if numpy is None:
        print("ferry.bench_kv needs NumPy", file=sys.stderr)
        return 2
    if a.page_aligned:
        global ALIGN
        ALIGN = True
        os.environ["FERRY_BENCH_PAGE_ALIGNED"] = "1"
    if a.serve:
        asyncio.run(serve())
        return 0
    if a.tiny:
        shapes, rounds = TINY, 2
    else:
        names = a.shapes.split(",")
        known = {s.name: s for s in SHAPES}
        unknown = [n for n in names if n not in known]
        if unknown:
            p.error(f"unknown shape(s) {unknown}: among {list(known)}")
        shapes, rounds = [known[n] for n in names], a.rounds
    inflights = [1, 4] if a.tiny else [int(x) for x in a.inflight.split(",")]
    ferry_bin = None if a.tiny and not a.ferry else find_ferry(a.ferry)
    print(f"{'shape':<18} {'op':<5} {'inflight':>8} {'via':<5} {'py GB/s':>8} {'rust GB/s':>9} {'ratio':>6} "
          f"{'py create us':>12} {'rust create us':>14} {'meta B':>7}")
    for _ in range(max(1, a.repeat)):
        for row in asyncio.run(run_python(shapes, inflights, rounds)):
            rust = None
            if ferry_bin is not None and row.transport in ("cma", "tcp"):
                rust = run_rust(ferry_bin, row.shape, row.inflight, row.transport)
            rg = f"{rust['gbps']:.2f}" if rust else "-"
            ratio = f"{row.gbps / rust['gbps']:.2f}" if rust else "-"
            rc = f"{rust['create_us']:.0f}" if rust else "-"
            print(f"{row.shape:<18} {row.op:<5} {row.inflight:>8} {row.transport:<5} {row.gbps:>8.2f} {rg:>9} {ratio:>6} "
                  f"{row.create_us:>12.0f} {rc:>14} {row.metadata_bytes:>7}", flush=True)
    if a.tiny:
        print("tiny: every byte checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
