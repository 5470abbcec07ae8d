"""The other worker of the test_caller_*.py modules (see callers.py).

Run as ``python caller_peer.py MODULE_FILE FUNCTION LOOP``: imports the test
module at MODULE_FILE and runs its FUNCTION with a :class:`callers.Channel`
to the test process, on LOOP: ``uvloop`` (``uvloop.run``, as Dynamo's
workers do), ``asyncio`` (``asyncio.run``) or ``sync`` (a plain call). The
channel is this process's stdin and stdout (JSON lines); ``print`` goes to
stderr. When FUNCTION returns, the peer sends ``{"event": "exit", "ok":
true}``; when it raises, ``ok`` is false and ``error`` holds the traceback.
When the test process goes away (stdin closes), the peer exits at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import callers  # noqa: E402


def main() -> None:
    module_file, function, loop = sys.argv[1:4]
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # stdout is the channel's
    chan = callers.Channel(sys.stdin.buffer, out, on_eof=lambda: os._exit(0))
    ok, error = True, ""
    try:
        name = "_peer_" + os.path.splitext(os.path.basename(module_file))[0]
        spec = importlib.util.spec_from_file_location(name, module_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        fn = getattr(module, function)
        if loop == "sync":
            fn(chan)
        elif loop == "uvloop":
            callers.run_uvloop(fn(chan), timeout=callers.TIMEOUT * 2)
        elif loop == "asyncio":
            asyncio.run(asyncio.wait_for(fn(chan), callers.TIMEOUT * 2))
        else:
            raise ValueError(f"unknown loop {loop!r}")
    except BaseException:
        ok, error = False, traceback.format_exc()
    try:
        chan.send("exit", ok=ok, error=error)
    finally:
        sys.stderr.flush()
        # Not a normal exit: nothing (a connector's threads, a pending
        # operation) may keep this process alive once the function is done.
        os._exit(0)


if __name__ == "__main__":
    main()
