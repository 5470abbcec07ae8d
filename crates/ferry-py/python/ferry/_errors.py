"""Ferry's exceptions.

Misuse (wrong pairing, count or size mismatch, a read-only destination, an
unsupported device, bad metadata JSON) raises :class:`ValueError` or
:class:`TypeError`; a deadline raises :class:`TimeoutError`. A transfer that
failed raises a :class:`FerryError`: the subclass says what happened, the
message says it in words (it is the Rust core's message).
"""

from __future__ import annotations

__all__ = [
    "FerryError",
    "UnreachableError",
    "ConnectionLostError",
    "RejectedError",
    "RemoteCancelledError",
    "OperationCancelledError",
    "ProtocolError",
    "StaleMetadataError",
    "ShutdownError",
]


class FerryError(Exception):
    """A transfer did not happen: the remote failed, refused or cancelled, or
    this side cancelled or shut down."""


class UnreachableError(FerryError, ConnectionError):
    """No address in the metadata could be connected to (the remote worker
    is gone, or not reachable from here)."""


class ConnectionLostError(FerryError, ConnectionError):
    """The connection to the remote worker broke: it died, or the network
    failed."""


class RejectedError(FerryError):
    """The remote refused the operation: the metadata is forged or stale
    (its operation has ended), or another remote already uses it."""


class RemoteCancelledError(FerryError):
    """The remote side cancelled (or dropped) its operation."""


class OperationCancelledError(FerryError):
    """This side cancelled the operation (``cancel()``, or leaving its
    ``with`` block before it completed)."""


class ProtocolError(FerryError):
    """The remote broke Ferry's protocol; the connection was closed."""


class StaleMetadataError(FerryError):
    """The worker at the metadata's address is not the one that wrote it:
    the metadata is stale or meant for another worker."""


class ShutdownError(FerryError):
    """The connector shut down while the operation was pending."""
