"""Ferry moves memory between the workers of a distributed inference graph.

This package has the API of Dynamo's NIXL Connect (``dynamo.nixl_connect``),
so that code written for it runs with only the import changed::

    import ferry as nixl_connect

A worker creates a :class:`Connector`. To let a remote worker read local
memory it creates a :class:`ReadableOperation` over :class:`Descriptor`
objects and hands the operation's :class:`RdmaMetadata` (JSON) to the remote
through any side channel; the remote starts a :class:`ReadOperation` with it.
Writing works the same way with a :class:`WritableOperation` and a
:class:`WriteOperation`. Both sides learn of completion, failure and
cancellation; waiting is event driven and releases the GIL.

A standing :class:`Grant` (``connector.grant(pool, "read_write",
holder=...)``) lets one remote worker read and write blocks of a
:class:`Pool` by index, one-sidedly, with no round trip per transfer, until
it is revoked: the holder opens its :class:`GrantMetadata` with
``await connector.open_grant(meta)`` and gets a :class:`RemoteGrant`.
An :class:`Offer` (``connector.offer(pool, "read_write")``) lets any
number of workers each claim a grant of their own from its
:class:`OfferMetadata` (``await connector.claim(meta)``).
"""

from ._connection import Connection
from ._connector import Connector
from ._operations import (
    AbstractOperation,
    ActiveOperation,
    PassiveOperation,
    PendingOperation,
    ReadableOperation,
    ReadOperation,
    WritableOperation,
    WriteOperation,
)
from ._remote import Remote
from ._grant import BlockRef, Grant, GrantMetadata, GrantNotification, RemoteGrant
from ._ranges import BlockRange, NotificationKind
from ._offer import Offer, OfferMetadata
from ._errors import (
    BlockBusyError,
    BlockIdTypeError,
    BlockRangeError,
    BlockSliceError,
    ConnectionLostError,
    CudaUnavailableError,
    DeviceMemoryError,
    DigestMismatchError,
    ExpiredError,
    FerryError,
    GrantBlockRangeError,
    GrantClaimedError,
    GrantError,
    GrantExpiredError,
    GrantForgedError,
    GrantNotYoursError,
    GrantPeerGoneError,
    GrantRevokedError,
    GrantRightsError,
    GrantStalledError,
    OfferFullError,
    NoGrantLaneError,
    NotificationsFullError,
    RemoteExpiredError,
    StaleGenerationError,
    InvalidWorkerIdError,
    NoDeviceTransportError,
    NotDeviceMemoryError,
    OperationCancelledError,
    PeerUnresponsiveError,
    PoolError,
    ProtocolError,
    RejectedError,
    RemoteCancelledError,
    ShutdownError,
    StaleMetadataError,
    UnreachableError,
    WrongPairingError,
)
from ._ferry import __version__
from ._metadata import DescriptorInfo, ForeignMetadataError, RdmaMetadata
from ._descriptor import Descriptor, SerializedDescriptor
from ._sequence import DescriptorSequence
from ._pool import PagedDescriptor, Pool
from ._types import Device, DeviceKind, OperationKind, OperationStatus
from . import control

__all__ = [
    "control",
    "AbstractOperation",
    "ActiveOperation",
    "Connection",
    "Connector",
    "Descriptor",
    "DescriptorInfo",
    "DescriptorSequence",
    "PagedDescriptor",
    "Pool",
    "Device",
    "DeviceKind",
    "OperationKind",
    "OperationStatus",
    "PassiveOperation",
    "PendingOperation",
    "RdmaMetadata",
    "SerializedDescriptor",
    "ReadOperation",
    "ReadableOperation",
    "Remote",
    "WritableOperation",
    "WriteOperation",
    "FerryError",
    "UnreachableError",
    "ConnectionLostError",
    "PeerUnresponsiveError",
    "DigestMismatchError",
    "RejectedError",
    "RemoteCancelledError",
    "OperationCancelledError",
    "ProtocolError",
    "StaleMetadataError",
    "ShutdownError",
    "ForeignMetadataError",
    "WrongPairingError",
    "InvalidWorkerIdError",
    "DeviceMemoryError",
    "CudaUnavailableError",
    "NoDeviceTransportError",
    "NotDeviceMemoryError",
    "PoolError",
    "BlockRangeError",
    "BlockIdTypeError",
    "BlockSliceError",
    "BlockBusyError",
    "ExpiredError",
    "RemoteExpiredError",
    "BlockRef",
    "Grant",
    "GrantMetadata",
    "GrantNotification",
    "RemoteGrant",
    "BlockRange",
    "NotificationKind",
    "Offer",
    "OfferMetadata",
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
    "__version__",
]
