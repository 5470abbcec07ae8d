"""The connector: one worker's entry point, which creates the four
operations."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Type, Union

from . import _ferry
from ._connection import _ConnectorBase
from ._grant import Grant, GrantMetadata, RemoteGrant, Rights, _make_grant, _metadata_arg
from ._metadata import RdmaMetadata
from ._offer import Offer, OfferMetadata, _make_offer, _offer_metadata_arg
from ._operations import (
    Descriptors,
    PendingOperation,
    ReadableOperation,
    ReadOperation,
    WritableOperation,
    WriteOperation,
    _Op,
    _check_writable,
    _descriptor_list,
    _new_active,
    _read_args,
    _write_args,
)
from ._pool import AnyDescriptor, Pool


class Connector(_ConnectorBase):
    """One worker's entry point to Ferry: creates the four operations, owns
    the listener, the pooled connections to remote workers and the table of
    exposed memory.

    `worker_id` defaults to a random id. `listen` (``"ip:port"``, default
    ``"0.0.0.0:0"``: every interface, an ephemeral port) is where remote
    workers connect; the metadata carries this host's addresses.

    A connector belongs to no event loop: it can be created outside any,
    then used from several loops (asyncio's, uvloop) and threads at once.
    Connectors compare (and hash) by worker id.

    Operations keep their connector alive. When the connector is dropped
    with nothing else holding it, it shuts down.
    """

    __slots__ = ()

    def create_readable(
        self, local_descriptors: Descriptors, *, expires_after: Optional[float] = None
    ) -> PendingOperation[ReadableOperation]:
        """Exposes `local_descriptors` for one remote worker to read; hand it
        the operation's ``metadata()``. With `expires_after` (seconds), the
        exposure ends by itself then unless the operation has ended: its
        memory is withdrawn as on a cancel, and both sides raise
        :class:`ExpiredError` (the remote :class:`RemoteExpiredError`)."""
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        expiry = _expiry_arg(expires_after)
        return self._expose(ReadableOperation, descs, lambda raw: self._core.create_readable(raw, expiry))

    def create_writable(
        self, local_descriptors: Descriptors, *, expires_after: Optional[float] = None
    ) -> PendingOperation[WritableOperation]:
        """Exposes `local_descriptors` for one remote worker to write; hand
        it the operation's ``metadata()``. `expires_after` as for
        :meth:`create_readable`."""
        descs = _descriptor_list(local_descriptors, "local_descriptors")
        _check_writable(descs, "WritableOperation")
        expiry = _expiry_arg(expires_after)
        return self._expose(WritableOperation, descs, lambda raw: self._core.create_writable(raw, expiry))

    def grant(
        self,
        pool: Pool,
        rights: Rights,
        *,
        holder: Optional[str] = None,
        bearer: bool = False,
        expires_after: Optional[float] = None,
        spin_us: Optional[float] = None,
        revoke_deadline: Optional[float] = None,
    ) -> Grant:
        """Grants one remote worker `rights` (``"read"``, ``"write"`` or
        ``"read_write"``) over the blocks of `pool`, one-sidedly, until the
        grant is revoked, dropped or expires (see :class:`Grant` and
        ``docs/grants.md``). Hand ``grant.metadata()`` to the holder, which
        opens it with :meth:`open_grant`.

        `holder` binds it to the worker with that id; ``bearer=True`` makes
        it a bearer grant instead (whoever holds the metadata opens it; one
        holder process at a time): one of the two is needed.
        `expires_after` (seconds) ends it by itself. `spin_us` is the
        low-latency mode: the owner's notification thread spins that many
        microseconds after each notification before it parks (default:
        parks at once, no CPU while idle). `revoke_deadline` (seconds,
        default 1.5) bounds how long :meth:`Grant.revoke` waits for a
        stopped holder's transfer in flight."""
        return _make_grant(self._core, pool, rights, holder, bearer, expires_after, spin_us, revoke_deadline)

    async def open_grant(self, metadata: Union[GrantMetadata, str, bytes]) -> RemoteGrant:
        """Opens a grant another worker made for this one (its metadata, or
        the metadata's JSON): checks that it is bound to this worker
        (:class:`GrantNotYoursError`) or a bearer grant, unexpired, live, and
        that a lane reaches its owner (:class:`NoGrantLaneError`), and
        claims it (one holder at a time)."""
        return RemoteGrant._new(await self._core.open_grant(_metadata_arg(metadata)))

    def open_grant_blocking(self, metadata: Union[GrantMetadata, str, bytes]) -> RemoteGrant:
        """:meth:`open_grant`, blocking (without the GIL)."""
        return RemoteGrant._new(self._core.open_grant_blocking(_metadata_arg(metadata)))

    def offer(
        self,
        pool: Pool,
        rights: Rights,
        *,
        expires_after: Optional[float] = None,
        spin_us: Optional[float] = None,
        revoke_deadline: Optional[float] = None,
        max_holders: Optional[int] = None,
    ) -> Offer:
        """Offers the blocks of `pool` to any worker that has the offer's
        metadata: each claims a grant of its own (:meth:`claim`) with
        `rights` (``"read"``, ``"write"`` or ``"read_write"``), which this
        connector's runtime makes, bound to the claiming worker (see
        :class:`Offer` and ``docs/grants.md``, "Offers"). `expires_after`
        (seconds) ends the offer and its grants by themselves; `spin_us` and
        `revoke_deadline` as for :meth:`grant`. At most `max_holders`
        workers (256 unless told) hold grants of it at once: another
        worker's claim is refused (:class:`OfferFullError`) until a
        holder's grant ends."""
        return _make_offer(self._core, pool, rights, expires_after, spin_us, revoke_deadline, max_holders)

    async def claim(self, metadata: Union[OfferMetadata, str, bytes]) -> RemoteGrant:
        """Claims a grant of the offer `metadata` (or its JSON) for this
        worker from the offer's owner, and opens it (as :meth:`open_grant`).
        Claiming again gets a fresh grant, which replaces the previous one.
        Refused with :class:`GrantForgedError` (not the offer's token),
        :class:`GrantRevokedError` or :class:`GrantExpiredError`."""
        return RemoteGrant._new(await self._core.claim(_offer_metadata_arg(metadata)))

    def claim_blocking(self, metadata: Union[OfferMetadata, str, bytes]) -> RemoteGrant:
        """:meth:`claim`, blocking (without the GIL)."""
        return RemoteGrant._new(self._core.claim_blocking(_offer_metadata_arg(metadata)))

    def begin_read(
        self, remote_metadata: RdmaMetadata, local_descriptors: Descriptors
    ) -> PendingOperation[ReadOperation]:
        """Starts reading the remote readable `remote_metadata` describes
        into `local_descriptors` (counts and sizes must match). The two
        arguments may also come the other way round. The metadata of a
        writable is a :class:`WrongPairingError`."""
        meta, descs = _read_args(remote_metadata, local_descriptors)
        raw = [d._raw for d in descs]
        return PendingOperation(
            self,
            lambda: self._core.begin_read(meta._core, raw),
            lambda: self._core.begin_read_blocking(meta._core, raw),
            lambda op, conn: _new_active(ReadOperation, op, descs, self, conn, meta),
        )

    def begin_write(
        self, local_descriptors: Descriptors, remote_metadata: RdmaMetadata
    ) -> PendingOperation[WriteOperation]:
        """Starts writing `local_descriptors` into the remote writable
        `remote_metadata` describes (counts and sizes must match). The two
        arguments may also come the other way round. The metadata of a
        readable is a :class:`WrongPairingError`."""
        descs, meta = _write_args(local_descriptors, remote_metadata)
        raw = [d._raw for d in descs]
        return PendingOperation(
            self,
            lambda: self._core.begin_write(raw, meta._core),
            lambda: self._core.begin_write_blocking(raw, meta._core),
            lambda op, conn: _new_active(WriteOperation, op, descs, self, conn, meta),
        )

    def _expose(
        self,
        cls: Type[_Op],
        descs: List[AnyDescriptor],
        create: Callable[[List[Any]], _ferry.Operation],
    ) -> PendingOperation[_Op]:
        raw = [d._raw for d in descs]
        return PendingOperation(
            self, None, lambda: create(raw), lambda op, conn: cls._new(op, descs, self, conn)
        )


def _expiry_arg(expires_after: Optional[float]) -> Optional[float]:
    if expires_after is None:
        return None
    if isinstance(expires_after, bool) or not isinstance(expires_after, (int, float)):
        raise TypeError(f"expires_after must be a number of seconds, not {type(expires_after).__name__}")
    return float(expires_after)
