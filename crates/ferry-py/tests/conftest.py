"""Fixtures: a helper worker process (tests/helper.py) and a client that talks
to it over a loopback socket, exchanging RdmaMetadata JSON as a real graph
would over HTTP or NATS."""

from __future__ import annotations

import asyncio
import ctypes.util
import itertools
import json
import os
import signal
import subprocess
import sys
from typing import Any, Dict, Iterator, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TIMEOUT = 60.0


def no_libcuda_here() -> bool:
    """Whether this host certainly has no CUDA driver for Ferry to load
    (then GPU memory can be simulated with host memory)."""
    return "FERRY_CUDA_LIB" not in os.environ and ctypes.util.find_library("cuda") is None


class HelperProcess:
    """A running tests/helper.py."""

    def __init__(self, env: Optional[Dict[str, str]] = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "helper.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"helper.py exited with {self.proc.wait()}")
        self.port = int(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class Peer:
    """One connection to a helper, inside the test's event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ids = itertools.count(1)
        self.queues: Dict[int, asyncio.Queue] = {}
        self.task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, helper: HelperProcess) -> "Peer":
        r, w = await asyncio.open_connection("127.0.0.1", helper.port, limit=1 << 24)
        return cls(r, w)

    async def _read(self) -> None:
        while True:
            line = await self.reader.readline()
            if not line:
                break
            msg = json.loads(line)
            self.queues[msg["id"]].put_nowait(msg)
        for q in self.queues.values():
            q.put_nowait({"event": "eof"})

    def send(self, cmd: str, **fields: Any) -> int:
        rid = next(self.ids)
        self.queues[rid] = asyncio.Queue()
        self.writer.write(json.dumps({"id": rid, "cmd": cmd, **fields}).encode() + b"\n")
        return rid

    async def expect(self, rid: int, event: str, timeout: float = TIMEOUT) -> Dict[str, Any]:
        msg = await asyncio.wait_for(self.queues[rid].get(), timeout)
        assert msg["event"] == event, msg
        return msg

    async def request(self, cmd: str, event: str = "done", **fields: Any) -> Dict[str, Any]:
        return await self.expect(self.send(cmd, **fields), event)

    async def close(self) -> None:
        self.writer.close()
        self.task.cancel()


@pytest.fixture(scope="session")
def helper() -> Iterator[HelperProcess]:
    """One helper process shared by the tests that do not kill it."""
    h = HelperProcess()
    yield h
    h.close()


@pytest.fixture
def own_helper() -> Iterator[HelperProcess]:
    """A helper process of the test's own, which it may kill."""
    h = HelperProcess()
    yield h
    h.close()


def run(coro: Any, timeout: Optional[float] = TIMEOUT) -> Any:
    """Runs a test coroutine in a fresh event loop, with a deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
