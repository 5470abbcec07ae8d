"""Ferry's exceptions.

Misuse (wrong pairing, count or size mismatch, a read-only destination, an
unsupported device, bad metadata JSON) raises :class:`ValueError` or
:class:`TypeError`; a deadline raises :class:`TimeoutError`. A transfer that
failed raises a :class:`FerryError`: the subclass says what happened, the
message says it in words (it is the Rust core's message).

Where the reference (Dynamo's NIXL Connect) raises another built-in type
for the same event, Ferry's class derives from both, so that an ``except``
written for either catches it:

- every :class:`FerryError` is a :class:`RuntimeError`: the reference's
  ``wait_for_completion`` raises ``RuntimeError`` for a failed transfer, and
  callers retry on it;
- :class:`WrongPairingError` (the metadata of a writable given to a read, or
  of a readable given to a write) is a :class:`ValueError` and a
  :class:`RuntimeError`, the reference's type for it;
- :class:`InvalidWorkerIdError` (an empty worker id) is a :class:`ValueError`
  and a :class:`TypeError`, the reference's type for it.

A descriptor of memory that the connector cannot move here raises a
:class:`DeviceMemoryError` (a :class:`ValueError`, as other misuse) when an
operation is created: :class:`CudaUnavailableError` for CUDA memory on a
host where CUDA is not available (the message says why, and what to install
or set), :class:`NotDeviceMemoryError` where the CUDA driver does not take
the memory for memory of the device it names, :class:`NoDeviceTransportError` (also a
:class:`NotImplementedError`) where CUDA is available but no transport of
the connector carries it to or from that remote: CUDA memory moves only by
CUDA IPC between processes of one host (GPU to GPU, GPU to host).

A :class:`Pool` or a block list that is refused raises a :class:`PoolError`
(a :class:`ValueError`, as other misuse): :class:`BlockRangeError` (also an
:class:`IndexError`) for a block id out of range or negative,
:class:`BlockIdTypeError` (also a :class:`TypeError`) for ids that are not
integers, :class:`BlockSliceError` for a part of a block that does not fit
it, :class:`BlockBusyError` for blocks that an operation in progress uses.

A passive operation created with ``expires_after`` that lapsed raises
:class:`ExpiredError` on its side, and :class:`RemoteExpiredError` (an
``ExpiredError`` and a :class:`RejectedError`) on its remote's.

A standing grant (:meth:`Connector.grant`) that refuses raises a
:class:`GrantError`, whose subclass says why: revoked, expired, a block
retired since the generation named (:class:`StaleGenerationError`: nothing
moved), another worker's grant, an index out of range, a right the grant
does not give. Misuse (malformed grant metadata, a grant bound to nobody,
block counts or sizes that differ, a notification over 256 bytes) raises
:class:`ValueError`.
"""

from __future__ import annotations

__all__ = [
    "FerryError",
    "UnreachableError",
    "ConnectionLostError",
    "PeerUnresponsiveError",
    "RejectedError",
    "RemoteCancelledError",
    "OperationCancelledError",
    "ProtocolError",
    "StaleMetadataError",
    "ShutdownError",
    "DigestMismatchError",
    "WrongPairingError",
    "InvalidWorkerIdError",
    "DeviceMemoryError",
    "CudaUnavailableError",
    "NotDeviceMemoryError",
    "NoDeviceTransportError",
    "ControlError",
    "MetadataNotFoundError",
    "NoServerError",
    "ServerGoneError",
    "BadReplyError",
    "MetadataRefusedError",
    "AlreadyPublishedError",
    "PoolError",
    "BlockRangeError",
    "BlockIdTypeError",
    "BlockSliceError",
    "BlockBusyError",
    "ExpiredError",
    "RemoteExpiredError",
    "GrantError",
    "GrantRevokedError",
    "GrantExpiredError",
    "StaleGenerationError",
    "GrantNotYoursError",
    "GrantClaimedError",
    "GrantBlockRangeError",
    "GrantRightsError",
    "GrantForgedError",
    "NoGrantLaneError",
    "NotificationsFullError",
    "GrantPeerGoneError",
    "GrantStalledError",
    "OfferFullError",
]


class FerryError(RuntimeError):
    """A transfer did not happen: the remote failed, refused or cancelled, or
    this side cancelled or shut down. A :class:`RuntimeError`, as the
    reference's failed transfers are."""


class UnreachableError(FerryError, ConnectionError):
    """No address in the metadata could be connected to (the remote worker
    is gone, or not reachable from here)."""


class ConnectionLostError(FerryError, ConnectionError):
    """The connection to the remote worker broke: it died, or the network
    failed."""


class PeerUnresponsiveError(ConnectionLostError):
    """Nothing at all (not even a heartbeat) arrived from the remote worker
    for the liveness bound while the operation was in progress: the remote
    is stopped, paused, wedged or unreachable. Every operation of that
    connection ended and the connection closed; the next operation connects
    again. The bound is ``FERRY_LIVENESS_MS`` (default 1500 ms)."""


class DigestMismatchError(FerryError):
    """The end-to-end digest (``FERRY_DIGEST=1``) found that the bytes that
    landed differ from the bytes that were sent: the destination's memory
    does not hold what was sent. Both sides report it."""


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


class WrongPairingError(ValueError, RuntimeError):
    """A read was given the metadata of a writable, or a write the metadata
    of a readable: pair READ with READABLE and WRITE with WRITABLE. Misuse,
    so a :class:`ValueError`; also the reference's :class:`RuntimeError`."""


class InvalidWorkerIdError(ValueError, TypeError):
    """An empty worker id. A :class:`ValueError`, and the reference's
    :class:`TypeError`."""


class DeviceMemoryError(ValueError):
    """A descriptor of memory outside the host (``cuda:N``, ``xpu:N``) that
    this connector cannot move, refused when the operation is created
    (nothing was attempted). Copy the data to host memory
    (``tensor.cpu()``) and describe that. Misuse, so a
    :class:`ValueError`; the subclasses say why."""


class CudaUnavailableError(DeviceMemoryError):
    """A descriptor of CUDA memory, on a host where CUDA is not available:
    no NVIDIA driver (``libcuda.so.1``), a driver that failed to
    initialise, or no device. The message says which, and what to install
    or set (``FERRY_CUDA_LIB``: the path of ``libcuda.so.1``)."""


class NoDeviceTransportError(DeviceMemoryError, NotImplementedError):
    """A descriptor of CUDA memory, on a host where CUDA is available, but
    no transport of this connector carries it here: host and CUDA memory
    (or two GPUs) mixed in one operation (the message says which). Also a
    :class:`NotImplementedError`."""


class NotDeviceMemoryError(DeviceMemoryError):
    """A descriptor of CUDA memory that the CUDA driver does not take for
    memory of its device: memory of another GPU (describe it with the
    device it is on, ``tensor.device``), host memory described as a GPU's,
    or a range whose last byte is not memory of that GPU. Checked when the operation is
    created, where the driver is here."""


class ControlError(RuntimeError):
    """The control plane (:mod:`ferry.control`) could not hand metadata
    over. A bad key or prefix raises :class:`ValueError` instead, the
    deadline :class:`TimeoutError`, a server that cannot listen
    :class:`OSError`."""


class MetadataNotFoundError(ControlError, LookupError):
    """Nobody published metadata under this key before the deadline: it is
    not published yet, was withdrawn, or the key, server or prefix differ."""


class NoServerError(ControlError, ConnectionError):
    """No control-plane server answered at this address before the
    deadline: start it, or check the address."""


class ServerGoneError(ControlError, ConnectionError):
    """The server closed the connection (or restarted) before answering and
    did not come back before the deadline."""


class BadReplyError(ControlError):
    """The server's reply is not a metadata reply (not HTTP, oversized):
    not a Ferry control-plane server, or a broken one."""


class MetadataRefusedError(ControlError):
    """The server refused the request (an HTTP status other than 200 and
    404)."""


class AlreadyPublishedError(ControlError, ValueError):
    """Metadata is already published under this key here: withdraw it
    first, or use another key."""


class PoolError(ValueError):
    """A :class:`Pool` or a block list was refused: a block size that does
    not fit the memory, no block ids (or too many), writable blocks of a
    read-only pool. The subclasses say more. Misuse, so a
    :class:`ValueError`."""


class BlockRangeError(PoolError, IndexError):
    """A block id that the pool does not have: negative, or past its last
    block. Also an :class:`IndexError`."""


class BlockIdTypeError(PoolError, TypeError):
    """Block ids that are not integers (a float or bool array, strings...).
    Also a :class:`TypeError`."""


class BlockSliceError(PoolError):
    """A part of each block (``offset``, ``length``) that does not lie
    within a block."""


class BlockBusyError(PoolError):
    """A block that an operation in progress writes into (or, for one that
    would write into it, reads), or that one operation would write twice:
    the two would race on its bytes. Wait for the other operation to end,
    or cancel it."""


class ExpiredError(FerryError):
    """A passive operation created with ``expires_after`` outlived it: its
    memory was withdrawn (status CANCELLED) and a transfer in progress was
    aborted. Raised on the passive side; the remote's side raises
    :class:`RemoteExpiredError`, a subclass. Ask for fresh metadata."""


class RemoteExpiredError(ExpiredError, RejectedError):
    """The remote's passive operation expired (its ``expires_after``
    lapsed): the remote refused the transfer, or ended it. Also a
    :class:`RejectedError`, as other refusals."""


class GrantError(FerryError):
    """A standing grant, or a one-sided transfer on one, was refused; the
    subclass says why, the message says it in words. Nothing moved unless
    the message says otherwise."""


class GrantRevokedError(GrantError):
    """The owner revoked the grant (``revoke()``, or dropped it): ask it for
    a new one."""


class GrantExpiredError(GrantError, ExpiredError):
    """The grant's ``expires_after`` has passed: ask the owner for a new
    grant. Also an :class:`ExpiredError`."""


class StaleGenerationError(GrantError):
    """A block was retired by its owner (reused) since the generation the
    transfer names: nothing moved. Ask for the block's current generation
    (``generation(i)``) once the owner hands it on again."""


class GrantNotYoursError(GrantError):
    """The grant is bound to another worker: open it from the worker it
    names (the connector's ``worker_id``)."""


class GrantClaimedError(GrantError):
    """Another process holds the grant already: a grant has one holder at a
    time."""


class GrantBlockRangeError(GrantError, IndexError):
    """A block index past the granted blocks (or negative). Also an
    :class:`IndexError`."""


class GrantRightsError(GrantError):
    """The grant does not give the right the transfer needs (a write on a
    READ grant, a read on a WRITE grant)."""


class GrantForgedError(GrantError):
    """The grant's secret or layout does not match what its owner keeps:
    forged, tampered with, or stale metadata."""


class NoGrantLaneError(GrantError):
    """No lane of the grant reaches this worker: the owner is on another
    host, or the memory is not host memory (this version has the same-host
    cross-memory attach lane), or the kernel does not let this process
    attach to the owner."""


class NotificationsFullError(GrantError):
    """The owner's notification queue stayed full: the write landed, but its
    notification was not queued. The owner is not reading its
    notifications."""


class GrantPeerGoneError(GrantError, ConnectionError):
    """The other side of the grant (its owner, or its holder) is gone."""


class OfferFullError(GrantError):
    """A claim was refused: the offer has as many holders as it takes
    (``max_holders``). Ask its owner to revoke one, or to offer with a
    larger ``max_holders``."""


class GrantStalledError(GrantError, TimeoutError):
    """``revoke()`` or ``retire()`` gave up waiting for a transfer in flight
    of a live holder that did not finish (stopped): when it resumes it may
    still complete that one transfer; its later ones are refused."""
