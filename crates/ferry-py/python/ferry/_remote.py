"""A remote worker, as seen through a local connection."""

from __future__ import annotations

import threading
from typing import Any, Union

from ._connection import Connection
from ._metadata import RdmaMetadata


class Remote:
    """A remote worker, as seen through a local :class:`Connection`, as the
    reference names it: ``name`` is the remote's worker id. The remote of a
    :class:`ReadOperation` or :class:`WriteOperation` is its ``remote``.

    `nixl_metadata` is what a remote's :class:`RdmaMetadata` carries there
    (Ferry's metadata, JSON), that :class:`RdmaMetadata` itself, or the
    remote worker's id. Each Remote counts as one holder of that worker on
    the connection (``connection.acquire_remote_ref``) and lets go of it
    once: leaving its ``with`` block, ``_release()`` or its destruction,
    whichever comes first (from any thread). Ferry keeps nothing else per
    remote.
    """

    def __init__(self, connection: Connection, nixl_metadata: Union[RdmaMetadata, str, bytes]) -> None:
        if not isinstance(connection, Connection):
            raise TypeError(f"connection must be a ferry.Connection, not {type(connection).__name__}")
        self._connection = connection
        self._name = _remote_name(nixl_metadata)
        self._release_lock = threading.Lock()
        self._released = False
        connection.acquire_remote_ref(self._name)
        self._acquired = True

    @property
    def connection(self) -> Connection:
        """The local connection the remote is used through."""
        return self._connection

    @property
    def name(self) -> str:
        """The remote worker's id."""
        return self._name

    def _release(self) -> None:
        """Lets go of the remote, once (the reference also forgets the
        remote's NIXL agent when it was the last holder; callers may replace
        this method)."""
        if not getattr(self, "_acquired", False):
            return  # __init__ did not finish
        with self._release_lock:
            if self._released:
                return
            self._released = True
        self._connection.release_remote_ref(self._name)

    def __del__(self) -> None:
        if getattr(self, "_acquired", False):  # __init__ finished
            self._release()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._release()

    def __repr__(self) -> str:
        return f"Remote(name={self._name}, connection={self._connection.name})"

    def __str__(self) -> str:
        return self._name


def _remote_name(value: Any) -> str:
    """The worker id in a Remote's `nixl_metadata`."""
    if isinstance(value, RdmaMetadata):
        return value.worker_id
    if not isinstance(value, (str, bytes)):
        raise TypeError(
            "nixl_metadata must be a str or bytes (an RdmaMetadata's nixl_metadata, or a worker "
            f"id) or a ferry.RdmaMetadata, not {type(value).__name__}"
        )
    if len(value) == 0:
        raise ValueError("nixl_metadata must not be empty")
    text = value if isinstance(value, str) else value.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        # Ferry's metadata, as RdmaMetadata.nixl_metadata gives it.
        return RdmaMetadata(nixl_metadata=text).worker_id
    return text
