"""What the test_caller_*.py modules share.

Each of those modules replays, between two processes, the sequence of
``dynamo.nixl_connect`` calls that one real caller in Dynamo 1.6.1 makes,
with the module imported the promised way::

    import ferry as nixl_connect

This file gives them:

- :class:`Peer`: the other worker. Like ``helper.py`` (see
  ``test_cross_process.py``), it is a second Python process speaking JSON
  lines and exiting with the test process; unlike ``helper.py``, which has a
  fixed set of commands, it runs one function of the calling test module
  (``caller_peer.py MODULE FUNCTION LOOP``), so that both halves of a caller
  live side by side in that module. Messages are dictionaries with an
  ``event`` key; a receive names the event it awaits (others wait their
  turn); a failure in the peer reaches the test at its next receive, with
  the peer's traceback.
- tensors: ``torch`` tensors on the CPU when torch is importable, otherwise
  NumPy arrays standing in for them (same shapes, dtypes and bytes).
- :func:`run_uvloop` / :func:`run_asyncio`: run a test coroutine on the
  event loop the caller uses, with a deadline; :func:`run_async`: Dynamo's
  ``dynamo.common.utils.runtime.run_async`` semantics (a coroutine function
  run to completion from synchronous code: with ``asyncio.run`` when no loop
  runs in this thread, else in a worker thread with its own loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy

try:
    import torch
except ImportError:
    torch = None

try:
    import uvloop
except ImportError:  # a hard requirement of these tests: Dynamo's workers run on uvloop
    uvloop = None

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_SCRIPT = os.path.join(HERE, "caller_peer.py")

TIMEOUT = 20.0
"""Seconds any one wait of these tests may take before it fails (nothing
here needs more than a fraction of that)."""


# ---------------------------------------------------------------- channel


class PeerFailed(AssertionError):
    """The other process raised; the message is its traceback."""


class Channel:
    """JSON lines over a pair of pipes; usable from sync and async code."""

    def __init__(self, rfile: Any, wfile: Any, on_eof: Optional[Callable[[], None]] = None) -> None:
        self._w = wfile
        self._wlock = threading.Lock()
        self._q: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self._on_eof = on_eof
        self._backlog: List[Dict[str, Any]] = []
        threading.Thread(target=self._pump, args=(rfile,), daemon=True).start()

    def _pump(self, rfile: Any) -> None:
        try:
            for line in iter(rfile.readline, b""):
                try:
                    msg = json.loads(line)
                except ValueError:  # not ours (something printed to stdout): pass it on
                    sys.stderr.write(f"[channel] {line!r}\n")
                    continue
                self._q.put(msg)
        finally:
            self._q.put(None)
        if self._on_eof is not None:
            self._on_eof()

    def send(self, event: str, **fields: Any) -> None:
        data = json.dumps({"event": event, **fields}).encode() + b"\n"
        with self._wlock:
            self._w.write(data)
            self._w.flush()

    def _take(self, msg: Optional[Dict[str, Any]], event: Optional[str]) -> Optional[Dict[str, Any]]:
        """`msg` if it is the one awaited; otherwise keeps it for later (a
        peer may answer several requests in any order) and returns None."""
        if msg is None:
            raise PeerFailed("the other process closed the channel")
        if msg["event"] == "exit":
            if not msg.get("ok"):
                raise PeerFailed("the other process failed:\n" + msg.get("error", "?"))
            if event != "exit":
                raise PeerFailed(f"the other process returned without sending {event or 'a message'!r}")
        if event is None or msg["event"] == event:
            return msg
        self._backlog.append(msg)
        return None

    def _from_backlog(self, event: Optional[str]) -> Optional[Dict[str, Any]]:
        for i, msg in enumerate(self._backlog):
            if event is None or msg["event"] == event:
                return self._backlog.pop(i)
        return None

    def recv(self, event: Optional[str] = None, timeout: float = TIMEOUT) -> Dict[str, Any]:
        """The next message whose ``event`` is `event` (any if None),
        blocking; other messages are kept for later receives."""
        msg = self._from_backlog(event)
        deadline = time.monotonic() + timeout
        while msg is None:
            try:
                got = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {event or 'message'} from the other process in {timeout} s") from None
            msg = self._take(got, event)
        return msg

    async def arecv(self, event: Optional[str] = None, timeout: float = TIMEOUT) -> Dict[str, Any]:
        """As :meth:`recv`, without blocking the event loop (nor leaving a
        thread behind that asyncio.run would wait for)."""
        msg = self._from_backlog(event)
        deadline = time.monotonic() + timeout
        while msg is None:
            try:
                got = self._q.get_nowait()
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {event or 'message'} from the other process in {timeout} s") from None
                await asyncio.sleep(0.002)
                continue
            msg = self._take(got, event)
        return msg


class Peer:
    """The other worker: ``caller_peer.py`` running `function` of the module
    at `module_file` on `loop` ("uvloop", "asyncio" or "sync").

    Use as a context manager: leaving the block kills the peer if it is
    still running. :meth:`finish` waits for the function to return and
    raises its exception if it failed.
    """

    def __init__(self, module_file: str, function: str, loop: str = "uvloop") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, PEER_SCRIPT, os.path.abspath(module_file), function, loop],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.chan = Channel(self.proc.stdout, self.proc.stdin)

    def send(self, event: str, **fields: Any) -> None:
        try:
            self.chan.send(event, **fields)
        except (BrokenPipeError, ValueError):
            self.recv("exit", timeout=5)  # the peer is gone: raise its traceback if it failed
            raise

    def recv(self, event: Optional[str] = None, timeout: float = TIMEOUT) -> Dict[str, Any]:
        return self.chan.recv(event, timeout)

    async def arecv(self, event: Optional[str] = None, timeout: float = TIMEOUT) -> Dict[str, Any]:
        return await self.chan.arecv(event, timeout)

    def finish(self, timeout: float = TIMEOUT) -> None:
        """Waits for the peer's function to return (raises if it failed)."""
        self.recv("exit", timeout)
        self.proc.wait(timeout)

    async def afinish(self, timeout: float = TIMEOUT) -> None:
        await self.arecv("exit", timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()  # type: ignore[union-attr]
            except OSError:
                pass


# ---------------------------------------------------------------- loops


def run_uvloop(coro: Any, timeout: float = TIMEOUT) -> Any:
    """Runs `coro` on uvloop, as Dynamo's workers do (``uvloop.run(worker())``)."""
    if uvloop is None:
        raise RuntimeError("these tests need uvloop (pip install uvloop): Dynamo's workers run on it")
    return uvloop.run(asyncio.wait_for(coro, timeout))


def run_asyncio(coro: Any, timeout: float = TIMEOUT) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def run_async(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """An async function run as if synchronous, the way Dynamo's
    ``run_async`` does it: ``asyncio.run`` when no loop runs in this thread,
    otherwise ``asyncio.run`` in a worker thread (a second, short-lived loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(func(*args, **kwargs))
    with concurrent.futures.ThreadPoolExecutor() as pool:
        return pool.submit(asyncio.run, func(*args, **kwargs)).result()


# ---------------------------------------------------------------- tensors

# dtype names as the callers write them into their JSON ("float16", "int8"...).
DTYPES = ["float16", "float32", "int8", "uint8", "bfloat16", "int64"]


def _np_dtype(name: str) -> Any:
    name = name.removeprefix("torch.")
    return numpy.dtype("uint16" if name == "bfloat16" else name)  # same width


def _torch_dtype(name: str) -> Any:
    return getattr(torch, name.removeprefix("torch."))


def dtype_name(t: Any) -> str:
    """``torch.float16`` -> ``"float16"``; the NumPy stand-in's likewise."""
    if torch is not None and isinstance(t, torch.Tensor):
        return str(t.dtype).removeprefix("torch.")
    return str(t.dtype)


def zeros(shape: Sequence[int], dtype: str) -> Any:
    if torch is not None:
        return torch.zeros(*shape, dtype=_torch_dtype(dtype))
    return numpy.zeros(tuple(shape), dtype=_np_dtype(dtype))


def empty(shape: Sequence[int], dtype: str) -> Any:
    if torch is not None:
        return torch.empty(*shape, dtype=_torch_dtype(dtype))
    return numpy.empty(tuple(shape), dtype=_np_dtype(dtype))


def filled(shape: Sequence[int], dtype: str, seed: int) -> Any:
    """A tensor of `shape` holding reproducible bytes of `seed`."""
    n = int(numpy.prod(shape)) * _np_dtype(dtype).itemsize
    raw = numpy.random.default_rng(seed).integers(0, 256, n, dtype=numpy.uint8)
    if dtype.startswith("float"):
        # No NaN payloads: keep every element a finite value.
        raw = raw & numpy.uint8(0x3F)
    if torch is not None:
        return torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8).view(_torch_dtype(dtype)).reshape(*shape).clone()
    return raw.view(_np_dtype(dtype)).reshape(tuple(shape)).copy()


def frombuffer_u8(data: bytearray) -> Any:
    """``torch.frombuffer(bytearray(...), dtype=torch.uint8)``."""
    if torch is not None:
        return torch.frombuffer(data, dtype=torch.uint8)
    return numpy.frombuffer(data, dtype=numpy.uint8)


def as_bytes(t: Any) -> bytes:
    if torch is not None and isinstance(t, torch.Tensor):
        return t.contiguous().view(torch.uint8).numpy().tobytes()
    return numpy.ascontiguousarray(t).tobytes()


def nbytes(t: Any) -> int:
    if torch is not None and isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    return int(t.nbytes)


def shape_of(t: Any) -> List[int]:
    return [int(s) for s in t.shape]


def itemsize(dtype: str) -> int:
    return int(_np_dtype(dtype).itemsize)


def view_as(flat: Any, dtype: str, shape: Sequence[int]) -> Any:
    """``flat.view(dtype=...).view(shape)`` on a 1-D byte-sized tensor."""
    if torch is not None and isinstance(flat, torch.Tensor):
        return flat.view(dtype=_torch_dtype(dtype)).view(*shape)
    return flat.view(_np_dtype(dtype)).reshape(tuple(shape))


def to_numpy(t: Any) -> Any:
    """``tensor.numpy()`` (zero-copy)."""
    if torch is not None and isinstance(t, torch.Tensor):
        return t.numpy()
    return t
