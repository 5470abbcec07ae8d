"""Standing grants from Python: this process owns a pool and grants it;
tests/grant_peer.py, a second Python process, holds the grant and reads and
writes blocks of the pool by index, one-sidedly (cross-memory attach). A
few tests that need no second process run both sides here."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import select
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List

import pytest
from conftest import run

import ferry
from ferry import BlockRef, GrantMetadata, OperationKind, Pool

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 4096
BLOCKS = 16


def cma_allowed() -> bool:
    """Whether this process may attach to another of its user (Yama's
    ptrace scope 0 or 1 with a child is not enough for an unrelated peer,
    but the peer here is our child: scope <= 1 does)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip()) <= 1
    except OSError:
        return True


pytestmark = pytest.mark.skipif(not cma_allowed(), reason="cross-memory attach is not allowed here")


class Holder:
    """A running tests/grant_peer.py with worker id `worker`."""

    def __init__(self, worker: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "grant_peer.py"), worker],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, cmd: str, timeout: float = 30.0, **fields: Any) -> Dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"grant_peer.py did not answer {cmd!r} within {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"grant_peer.py exited with {self.proc.wait()}"
        answer: Dict[str, Any] = json.loads(line)
        return answer

    def ok(self, cmd: str, **fields: Any) -> Dict[str, Any]:
        answer = self.call(cmd, **fields)
        assert answer["ok"], answer
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def holder() -> Iterator[Holder]:
    h = Holder("decode-0")
    yield h
    h.close()


def owner_pool(block: int = BLOCK, blocks: int = BLOCKS) -> "tuple[bytearray, Pool]":
    """A pool whose block i holds bytes of value i + 1."""
    mem = bytearray(b"".join(bytes([i + 1]) * block for i in range(blocks)))
    return mem, Pool(mem, block)


def block(mem: bytearray, i: int, size: int = BLOCK) -> bytes:
    return bytes(mem[i * size : (i + 1) * size])


def test_read_and_write_blocks_between_processes(holder: Holder) -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-0")
        mem, pool = owner_pool()
        grant = owner.grant(pool, "read_write", holder="decode-0")
        meta = grant.metadata()
        assert len(meta.to_json()) <= 1024
        assert (meta.owner, meta.holder, meta.rights, meta.block_count) == ("prefill-0", "decode-0", "read_write", BLOCKS)
        holder.ok("open", metadata=meta.to_json())
        # Indices (current generation) and (index, generation) pairs.
        got = holder.ok("read", remote=[3, 7, [12, 0]])["blocks"]
        assert [bytes.fromhex(b) for b in got] == [block(mem, 3), block(mem, 7), block(mem, 12)]
        holder.ok("write", fills=[0xA1, 0xA2], remote=[9, [2, 0]], notify=None)
        assert block(mem, 9) == b"\xa1" * BLOCK and block(mem, 2) == b"\xa2" * BLOCK
        assert block(mem, 10) == b"\x0b" * BLOCK  # untouched neighbour
        assert grant.poll_notification() is None  # no payload, no notification
        await grant.revoke()

    run(main())


def test_large_blocks_between_processes(holder: Holder) -> None:
    """Blocks of 1 MiB: copied on a thread of Ferry's, not in place."""

    async def main() -> None:
        size = 1 << 20
        owner = ferry.Connector("prefill-0")
        mem, pool = owner_pool(size, 4)
        grant = owner.grant(pool, "read_write", holder="decode-0")
        holder.ok("open", metadata=str(grant.metadata()))
        got = holder.ok("read", remote=[1, 3])["blocks"]
        assert [bytes.fromhex(b) for b in got] == [block(mem, 1, size), block(mem, 3, size)]
        holder.ok("write", fills=[0x5A], remote=[0], notify="big")
        assert block(mem, 0, size) == b"\x5a" * size
        n = await asyncio.wait_for(grant.next_notification(), 10)
        assert n is not None and (n.first_block, n.payload) == (0, b"big")

    run(main())


def test_notifications_arrive_in_order(holder: Holder) -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-0")
        mem, pool = owner_pool()
        grant = owner.grant(pool, "write", holder="decode-0")
        holder.ok("open", metadata=bytes(grant.metadata()).decode())
        for i in range(20):
            holder.ok("write", fills=[i], remote=[i % BLOCKS], notify=f"layer {i}")
        got: List[ferry.GrantNotification] = []
        async for n in grant.notifications():
            got.append(n)
            if len(got) == 20:
                break
        assert [n.seq for n in got] == list(range(1, 21))
        assert [n.payload for n in got] == [f"layer {i}".encode() for i in range(20)]
        assert [n.first_block for n in got] == [i % BLOCKS for i in range(20)]
        assert all(n.kind == OperationKind.WRITE and n.block_count == 1 for n in got)
        assert grant.poll_notification() is None
        holder.ok("write", fills=[1], remote=[0], notify="polled")
        deadline = time.monotonic() + 10
        n = grant.poll_notification()
        while n is None and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
            n = grant.poll_notification()
        assert n is not None and (n.seq, n.payload) == (21, b"polled")

    run(main())


def test_revoke_refuses_the_holders_next_use(holder: Holder) -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-0")
        mem, pool = owner_pool()
        grant = owner.grant(pool, "read_write", holder="decode-0")
        holder.ok("open", metadata=grant.metadata().to_json())
        holder.ok("read", remote=[0])
        await grant.revoke()
        assert grant.revoked
        before = bytes(mem)
        for cmd, fields in (("read", {"remote": [0]}), ("write", {"fills": [0xEE], "remote": [1], "notify": "x"})):
            answer = holder.call(cmd, **fields)
            assert answer["error"] == "GrantRevokedError", answer
            assert "revoked" in answer["message"]
        assert bytes(mem) == before
        await grant.revoke()  # idempotent

    run(main())


def test_retired_generation_is_refused_and_moves_nothing(holder: Holder) -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-0")
        mem, pool = owner_pool()
        grant = owner.grant(pool, "read_write", holder="decode-0")
        holder.ok("open", metadata=grant.metadata().to_json())
        old = holder.ok("refs", indices=[4])["refs"]
        assert old == [[4, 0]]
        fresh = await grant.retire([4])
        assert fresh == [BlockRef(4, 1)] and grant.generation(4) == 1
        answer = holder.call("write", fills=[0xCC], remote=old, notify="late")
        assert answer["error"] == "StaleGenerationError", answer
        assert block(mem, 4) == b"\x05" * BLOCK
        assert grant.poll_notification() is None
        answer = holder.call("read", remote=old)
        assert answer["error"] == "StaleGenerationError", answer
        holder.ok("write", fills=[0xCC], remote=[list(r) for r in fresh], notify=None)
        assert block(mem, 4) == b"\xcc" * BLOCK

    run(main())


def test_bound_grant_is_refused_to_another_worker() -> None:
    intruder = Holder("intruder")
    try:
        owner = ferry.Connector("prefill-0")
        _, pool = owner_pool()
        grant = owner.grant(pool, "read", holder="decode-0")
        answer = intruder.call("open", metadata=grant.metadata().to_json())
        assert answer["error"] == "GrantNotYoursError", answer
        assert "decode-0" in answer["message"] and "intruder" in answer["message"]
        # A bearer grant: whoever holds it.
        bearer = owner.grant(pool, "read", bearer=True)
        assert bearer.metadata().holder is None
        intruder.ok("open", metadata=bearer.metadata().to_json())
    finally:
        intruder.close()


# ---- both sides in this process ----


def test_typed_refusals_in_process() -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-1")
        me = ferry.Connector("decode-1")
        mem, pool = owner_pool()
        grant = owner.grant(pool, "read", holder="decode-1")
        remote = await me.open_grant(grant.metadata())
        local = bytearray(2 * BLOCK)
        mine = Pool(local, BLOCK)
        with pytest.raises(ferry.GrantRightsError, match="WRITE"):
            await remote.write_blocks(mine, [0], [1])
        with pytest.raises(ferry.GrantBlockRangeError) as e:
            await remote.read_blocks([BLOCKS], mine, [0])
        assert isinstance(e.value, IndexError) and isinstance(e.value, ferry.GrantError)
        with pytest.raises(ferry.GrantBlockRangeError):
            await remote.read_blocks([(-1, 0)], mine, [0])
        with pytest.raises(ValueError):  # counts differ: misuse
            await remote.read_blocks([1, 2], mine, [0])
        with pytest.raises(ferry.GrantClaimedError):
            await ferry.Connector("decode-1").open_grant(grant.metadata())
        with pytest.raises(TypeError, match="BlockRef alone"):
            await remote.read_blocks(BlockRef(5, 0), mine, [0])  # type: ignore[arg-type]
        remote.read_blocks_blocking([BlockRef(5, 0)], mine, [1])
        assert bytes(local[BLOCK:]) == block(mem, 5)
        with pytest.raises(ValueError, match="holder=worker_id"):
            owner.grant(pool, "read")
        with pytest.raises(ValueError, match="rights"):
            owner.grant(pool, "all", holder="x")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            GrantMetadata.from_json("{}")

    run(main())


def test_grant_expires() -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-2")
        me = ferry.Connector("decode-2")
        _, pool = owner_pool()
        grant = owner.grant(pool, "read", holder="decode-2", expires_after=0.2)
        remote = await me.open_grant(grant.metadata())
        mine = Pool(bytearray(BLOCK), BLOCK)
        await remote.read_blocks([0], mine, [0])
        await asyncio.sleep(0.3)
        with pytest.raises(ferry.GrantExpiredError) as e:
            await remote.read_blocks([0], mine, [0])
        assert isinstance(e.value, ferry.ExpiredError)

    run(main())


def test_metadata_travels_as_text_bytes_pickle_and_dict() -> None:
    owner = ferry.Connector("prefill-3")
    _, pool = owner_pool()
    grant = owner.grant(pool, "read_write", holder="decode-3", expires_after=60, spin_us=20)
    meta = grant.metadata()
    assert GrantMetadata.from_json(meta.to_json()) == meta
    assert GrantMetadata.from_bytes(bytes(meta)) == meta
    assert GrantMetadata.from_json(str(meta)) == meta
    assert pickle.loads(pickle.dumps(meta)) == meta
    assert GrantMetadata.model_validate(meta.model_dump()) == meta
    assert meta.expires_at is not None and meta.expires_at > time.time()
    assert "token" not in repr(meta)


def test_local_blocks_in_use_are_busy() -> None:
    """A transfer takes its local blocks as an operation does."""

    async def main() -> None:
        owner = ferry.Connector("prefill-4")
        me = ferry.Connector("decode-4")
        _, pool = owner_pool()
        grant = owner.grant(pool, "read", holder="decode-4")
        remote = await me.open_grant(grant.metadata())
        mine = Pool(bytearray(2 * BLOCK), BLOCK)
        with await me.create_writable(mine.blocks([0])):
            with pytest.raises(ferry.BlockBusyError):
                await remote.read_blocks([1], mine, [0])
            await remote.read_blocks([1], mine, [1])

    run(main())


# ---- expires_after on exposed operations ----


def test_expires_after_ends_a_readable_on_both_sides() -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-5", listen="127.0.0.1:0")
        reader = ferry.Connector("decode-5", listen="127.0.0.1:0")
        data = bytearray(b"x" * 4096)
        op = await owner.create_readable(ferry.Descriptor(data), expires_after=0.2)
        meta = op.metadata()
        with pytest.raises(ferry.ExpiredError) as e:
            await op.wait_for_completion()
        assert not isinstance(e.value, ferry.RemoteExpiredError)
        assert "expired" in str(e.value)
        dest = bytearray(4096)
        with pytest.raises(ferry.RemoteExpiredError) as r:
            read = await reader.begin_read(meta, ferry.Descriptor(dest))
            await read.wait_for_completion()
        assert isinstance(r.value, ferry.ExpiredError) and isinstance(r.value, ferry.RejectedError)
        with pytest.raises(TypeError):
            owner.create_writable(ferry.Descriptor(data), expires_after="soon")  # type: ignore[arg-type]

    run(main())


def test_the_python_example_of_docs_grants_md() -> None:
    """docs/grants.md's Python example runs as written."""
    path = os.path.join(HERE, "..", "..", "..", "docs", "grants.md")
    if not os.path.exists(path):
        pytest.skip("docs/grants.md is not next to the tests")
    with open(path) as f:
        text = f.read()
    start = text.index("```python\n") + len("```python\n")
    code = text[start : text.index("```", start)]
    exec(compile(code, "docs/grants.md", "exec"), {"__name__": "docs_grants"})
