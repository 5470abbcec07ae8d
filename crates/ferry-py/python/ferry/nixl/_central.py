"""NIXL's central metadata store, through etcd and Ferry's control plane.

With ``NIXL_ETCD_ENDPOINTS`` set (and not empty) when an agent is made,
the metadata calls given no peer address go through etcd, as NIXL's do:

- ``send_local_metadata()`` stores the agent's metadata under the label
  ``"metadata"``; ``send_partial_agent_metadata(..., label=L)`` stores a
  partial one under ``L``;
- ``fetch_remote_metadata(name, label=L)`` fetches what agent ``name``
  stored under ``L`` (``"metadata"`` by default) in the background, waiting
  up to :data:`FETCH_WAIT` seconds for it to appear, and adds the agent
  (``check_remote_metadata`` says when);
- ``invalidate_local_metadata()`` withdraws everything the agent stored.

The store is ``ferry.control``'s etcd store (``EtcdStore.publish_bytes``):
values on a lease the agent keeps alive (they go with an agent that dies),
sealed with ``FERRY_SECRET`` when it is set, and refused over a network not
declared trusted without it (``FERRY_TRUSTED_NETWORK``). They are stored
under ``NIXL_ETCD_NAMESPACE`` (NIXL's, default ``/nixl/agents``) plus
``/ferry``, each at the SHA-256 of its agent's name and label: NIXL's own
agents' keys are never touched, and Ferry's values are not NIXL's.

Unlike NIXL, an agent is not told when a peer invalidates its metadata
(NIXL watches the keys): it keeps the peer until ``remove_remote_agent``,
and the peer's revoked offers end its transfers ``"ERR"``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from ._status import nixlBackendError, nixlInvalidParamError
from .logging import get_logger

__all__ = ["Central", "from_env", "DEFAULT_LABEL", "FETCH_WAIT"]

logger = get_logger(__name__)

DEFAULT_LABEL = "metadata"
"""NIXL's label for an agent's whole metadata."""

DEFAULT_NAMESPACE = "/nixl/agents"
"""NIXL's default ``NIXL_ETCD_NAMESPACE``."""

FETCH_WAIT = 30.0
"""Seconds a background fetch waits for the metadata to appear."""

CONNECT_WAIT = 10.0
"""Seconds the first use waits for etcd."""


def key(agent: str, label: str) -> str:
    """The store's key of `agent`'s metadata under `label`."""
    return hashlib.sha256(agent.encode() + b"\0" + label.encode()).hexdigest()


class Central:
    """One agent's client of the store (connected at first use)."""

    def __init__(self, endpoints: str, namespace: str, connect: Optional[Callable[..., Any]] = None) -> None:
        prefix = namespace.rstrip("/") + "/ferry"
        if not prefix.startswith("/"):
            prefix = "/" + prefix
        self._endpoints = endpoints
        self._prefix = prefix
        self._connect = connect
        self._lock = threading.Lock()
        self._store: Any = None
        self._published: Dict[Tuple[str, str], Any] = {}

    def _get(self) -> Any:
        with self._lock:
            if self._store is None:
                connect = self._connect
                if connect is None:
                    from .._ferry import EtcdStore

                    connect = EtcdStore.connect
                try:
                    self._store = connect(self._endpoints, CONNECT_WAIT, self._prefix)
                except ValueError as e:
                    raise nixlInvalidParamError(f"NIXL_ETCD_ENDPOINTS / NIXL_ETCD_NAMESPACE: {e}") from e
                except Exception as e:
                    raise nixlBackendError(f"cannot reach etcd at {self._endpoints}: {e}") from e
            return self._store

    def send(self, agent: str, label: str, blob: bytes) -> None:
        """Stores `blob` as `agent`'s metadata under `label`, in place of
        what it stored there before."""
        store = self._get()
        label = label or DEFAULT_LABEL
        with self._lock:
            old = self._published.pop((agent, label), None)
        try:
            if old is not None:
                store.withdraw(old)
            pub = store.publish_bytes(key(agent, label), blob)
        except Exception as e:
            raise nixlBackendError(f"storing the metadata of agent {agent!r} ({label}) in etcd failed: {e}") from e
        with self._lock:
            self._published[(agent, label)] = pub

    def fetch(self, agent: str, label: str, timeout: float = FETCH_WAIT) -> bytes:
        """What `agent` stored under `label`, waiting up to `timeout`
        seconds for it."""
        data: bytes = self._get().fetch_bytes(key(agent, label or DEFAULT_LABEL), timeout)
        return data

    def fetch_later(self, agent: str, label: str, load: Callable[[bytes], Any]) -> None:
        """:meth:`fetch` in the background, then `load` the metadata."""

        def run() -> None:
            try:
                load(self.fetch(agent, label))
            except Exception as e:
                logger.error("fetching the metadata of agent %r (%s) from etcd failed: %s", agent, label, e)

        threading.Thread(target=run, name="ferry-nixl-etcd-fetch", daemon=True).start()

    def invalidate(self, agent: str) -> None:
        """Withdraws everything `agent` stored."""
        with self._lock:
            mine = [k for k in self._published if k[0] == agent]
            pubs = [self._published.pop(k) for k in mine]
            store = self._store
        errors = []
        for p in pubs:
            try:
                store.withdraw(p)
            except Exception as e:
                errors.append(str(e))
        if errors:
            raise nixlBackendError(f"withdrawing the metadata of agent {agent!r} from etcd failed: {errors[0]}")

    def close(self) -> None:
        """Withdraws everything (in the background: leases end anyway)."""
        with self._lock:
            pubs = list(self._published.values())
            self._published.clear()
        for p in pubs:
            p.withdraw()


def from_env() -> Optional[Central]:
    """The store ``NIXL_ETCD_ENDPOINTS`` names, or ``None`` if unset or
    empty."""
    endpoints = os.environ.get("NIXL_ETCD_ENDPOINTS", "")
    if not endpoints:
        return None
    return Central(endpoints, os.environ.get("NIXL_ETCD_NAMESPACE", "") or DEFAULT_NAMESPACE)
