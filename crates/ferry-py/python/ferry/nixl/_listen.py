"""Agent metadata between peers by address, as NIXL's listener thread does
it: ``send_local_metadata(ip, port)`` hands this agent's metadata to the
agent listening there, ``fetch_remote_metadata(name, ip, port)`` asks it for
its own, ``invalidate_local_metadata(ip, port)`` tells it to forget this
one. Like NIXL's, each call returns at once and the exchange goes on in the
background (``check_remote_metadata`` tells when it has landed); a failure
is logged.

The wire: one request per connection, ``op`` (one byte: ``S``, ``F``,
``I``), a 4-byte big-endian length and the body; one answer, a status byte
(0: done) and a length-prefixed body. Offers in metadata are capabilities,
so the listener binds the loopback address unless the network is declared
trusted (``FERRY_CONTROL_TRUSTED_NETWORK=1``, as Ferry's control plane), or
``FERRY_NIXL_LISTEN_ADDR`` names the address to bind. Without an address
(NIXL's central store, etcd): ``nixlNotSupportedError`` until Ferry's
control plane carries agent metadata.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Optional

from ._status import nixlNotSupportedError
from .logging import get_logger

if TYPE_CHECKING:
    from ._agent import AgentCore

__all__ = ["Listener", "exchange", "CONNECT_FOR"]

logger = get_logger(__name__)

CONNECT_FOR = 10.0
"""Seconds an exchange keeps trying to reach a peer that is not listening
yet."""
_MAX_BODY = 16 << 20
_IO_TIMEOUT = 10.0


def _bind_addr() -> str:
    addr = os.environ.get("FERRY_NIXL_LISTEN_ADDR")
    if addr:
        return addr
    if os.environ.get("FERRY_CONTROL_TRUSTED_NETWORK", "").strip().lower() in ("1", "true", "yes", "on"):
        return "0.0.0.0"
    return "127.0.0.1"


def _read_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        out += chunk
    return bytes(out)


def _read_body(s: socket.socket) -> bytes:
    (n,) = struct.unpack(">I", _read_exact(s, 4))
    if n > _MAX_BODY:
        raise ValueError(f"a body of {n} bytes")
    return _read_exact(s, n)


def _send(s: socket.socket, head: bytes, body: bytes) -> None:
    s.sendall(head + struct.pack(">I", len(body)) + body)


class Listener:
    """An agent's listener (``enable_listen_thread``)."""

    def __init__(self, core: AgentCore, port: int) -> None:
        self._core = core
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((_bind_addr(), port))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"ferry-nixl-listen-{core.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(_IO_TIMEOUT)
                try:
                    self._serve(conn)
                except Exception as e:  # one bad peer never stops the listener
                    logger.warning("metadata listener of %s: %s", self._core.name, e)

    def _serve(self, conn: socket.socket) -> None:
        op = _read_exact(conn, 1)
        body = _read_body(conn)
        status, answer = 0, b""
        try:
            if op == b"S":
                self._core.load(body)
            elif op == b"F":
                if body.decode() != self._core.name:
                    status, answer = 1, b"no such agent here"
                else:
                    answer = self._core.metadata()
            elif op == b"I":
                self._core.remove(body.decode())
            else:
                status, answer = 1, b"unknown request"
        except Exception as e:
            status, answer = 1, str(e).encode()
        _send(conn, bytes([status]), answer)

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def _request(ip: str, port: int, op: bytes, body: bytes) -> bytes:
    deadline = time.monotonic() + CONNECT_FOR
    while True:
        try:
            s = socket.create_connection((ip, port), timeout=_IO_TIMEOUT)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with s:
        _send(s, op, body)
        status = _read_exact(s, 1)[0]
        answer = _read_body(s)
    if status != 0:
        raise RuntimeError(answer.decode(errors="replace"))
    return answer


def exchange(core: AgentCore, what: str, ip: str, port: int, body: bytes) -> None:
    """Starts one exchange with the agent at `ip`:`port` in the background
    (see the module)."""
    if not ip:
        raise nixlNotSupportedError(
            "no peer address, and no central metadata store: pass ip_addr and port of the peer's listener, "
            "set NIXL_ETCD_ENDPOINTS (etcd) before making the agent, or exchange get_agent_metadata() yourself"
        )
    op = {"send": b"S", "fetch": b"F", "invalidate": b"I"}[what]

    def run() -> None:
        try:
            answer = _request(ip, port, op, body)
            if what == "fetch":
                core.load(answer)
        except Exception as e:
            logger.error("%s of metadata with %s:%d failed: %s", what, ip, port, e)

    threading.Thread(target=run, name=f"ferry-nixl-{what}", daemon=True).start()


def bound_port(listener: Optional[Listener]) -> Optional[int]:
    """The port a listener took (``listen_port=0``: an ephemeral one)."""
    return None if listener is None else listener.port
