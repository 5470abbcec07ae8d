"""Notifications: NIXL's messages of any length over Ferry's of at most 256
bytes, and the agent's queue of those received.

Each Ferry notification the agent sends starts with one byte: ``0`` a whole
message follows, ``1`` a part of a message (more parts follow), ``2`` its
last part. A message of up to 255 bytes is one notification (it may go with
the transfer's last operation); a longer one is several parts, sent in order
through the remote agent's mailbox offer, whose notifications arrive in
order, so the receiver joins them. A message is at most
:data:`MAX_NOTIF_MSG` bytes.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

from ._engine import MAX_NOTIF_PART
from ._status import nixlInvalidParamError

__all__ = ["MAX_NOTIF_MSG", "frame", "message_arg", "Inbox"]

MAX_NOTIF_MSG = 1 << 20
"""The longest notification message, in bytes (NIXL has no limit)."""

_WHOLE, _PART, _LAST = 0, 1, 2
_ROOM = MAX_NOTIF_PART - 1


def message_arg(msg: Any) -> bytes:
    """A notification message as bytes (``str`` is encoded as UTF-8, as NIXL
    does)."""
    if isinstance(msg, str):
        out = msg.encode()
    elif isinstance(msg, (bytes, bytearray, memoryview)):
        out = bytes(msg)
    else:
        raise TypeError(f"a notification message is bytes or str, not {type(msg).__name__}")
    if len(out) > MAX_NOTIF_MSG:
        raise nixlInvalidParamError(f"a notification message of {len(out)} bytes: at most {MAX_NOTIF_MSG}")
    return out


def frame(msg: bytes) -> List[bytes]:
    """The notifications that carry `msg`."""
    if len(msg) <= _ROOM:
        return [bytes([_WHOLE]) + msg]
    parts = [msg[i : i + _ROOM] for i in range(0, len(msg), _ROOM)]
    return [bytes([_PART]) + p for p in parts[:-1]] + [bytes([_LAST]) + parts[-1]]


class Inbox:
    """The messages received and not yet taken, by sending agent, in
    order; parts of a longer message are kept per (sender, offer) until its
    last part."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: Dict[str, List[bytes]] = {}
        self._parts: Dict[Tuple[str, int], List[bytes]] = {}

    def put(self, sender: Optional[str], source: int, payload: bytes) -> None:
        """Takes one notification from `sender` through offer `source`."""
        who = sender or ""
        with self._lock:
            kind = payload[0] if payload else -1
            if kind == _WHOLE:
                self._ready.setdefault(who, []).append(payload[1:])
            elif kind in (_PART, _LAST):
                key = (who, source)
                parts = self._parts.setdefault(key, [])
                parts.append(payload[1:])
                if kind == _LAST:
                    del self._parts[key]
                    self._ready.setdefault(who, []).append(b"".join(parts))
            else:
                # Not framed by a ferry.nixl agent: handed on as it came.
                self._ready.setdefault(who, []).append(payload)

    def put_local(self, sender: str, msg: bytes) -> None:
        """A message of this agent to itself (a loopback transfer's)."""
        with self._lock:
            self._ready.setdefault(sender, []).append(msg)

    def take(self) -> Dict[str, List[bytes]]:
        """Every message received since the last take, by sender."""
        with self._lock:
            out, self._ready = self._ready, {}
            return out
