"""Event loops: how a result of Ferry's runtime reaches the loop awaiting it.

A result of Ferry's runtime that is not ready at once reaches the event
loop awaiting it through that loop's Bridge: a socket pair the loop watches
(`add_reader`), so a result wakes the loop directly and no thread of ours
takes the GIL. Any loop that supports `add_reader` will do (asyncio's
selector loops, uvloop), in any thread, and a connector is bound to none:
it can be created outside any loop and used from several at once.

One bridge per loop, found by the loop's id and checked by identity; the
loop is held weakly (strongly if it takes no weak reference), and a bridge
goes with its loop, or once the loop is closed.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, Tuple

from . import _ferry

_bridges: Dict[int, Tuple[Callable[[], Any], _ferry.Bridge]] = {}
_bridges_lock = threading.Lock()


def _bridge_for(loop: Any) -> _ferry.Bridge:
    """The bridge of `loop`, made on first use (called by the compiled core,
    on the loop's own thread, while it runs)."""
    entry = _bridges.get(id(loop))
    if entry is not None and entry[0]() is loop:
        return entry[1]
    with _bridges_lock:
        entry = _bridges.get(id(loop))
        if entry is not None and entry[0]() is loop:
            return entry[1]
        _forget_closed_loops()
        bridge = _ferry.Bridge()
        try:
            loop.add_reader(bridge.fileno(), bridge.drain)
        except NotImplementedError:
            raise RuntimeError(
                f"ferry needs an event loop that supports add_reader; {type(loop).__name__} "
                "does not (use asyncio's default loop or uvloop)"
            ) from None
        key = id(loop)
        held: Callable[[], Any]
        try:
            held = weakref.ref(loop, lambda r: _forget(key, r))
        except TypeError:  # a loop that takes no weak reference: held until closed
            held = lambda: loop  # noqa: E731
        _bridges[key] = (held, bridge)
        return bridge


def _forget(key: int, held: Any) -> None:
    # A weak reference's callback, run while the loop is freed (before its
    # id can be reused): takes no lock, which the freeing thread may hold.
    entry = _bridges.get(key)
    if entry is not None and entry[0] is held:
        _bridges.pop(key, None)


def _forget_closed_loops() -> None:
    """Drops the bridges of loops that are closed (or gone); under the lock."""
    for key, (held, _) in list(_bridges.items()):
        loop = held()
        if loop is None or loop.is_closed():
            _forget(key, held)
