"""Standing grants: :class:`Grant` (the owner's side), :class:`RemoteGrant`
(the holder's), :class:`GrantMetadata` (what the owner hands to the holder),
:class:`BlockRef` and :class:`GrantNotification`.

The owner of a :class:`Pool` grants one remote worker READ, WRITE or both
over its blocks once (:meth:`Connector.grant`); the holder then reads and
writes blocks *by index*, one-sidedly, with no round trip through the
owner per transfer, until the owner revokes. Each block has a generation:
before reusing blocks the owner retires them, and a transfer that names an
old generation is refused (:class:`StaleGenerationError`) and moves nothing.
See ``docs/grants.md``.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _ferry
from ._pool import BlockIds, Pool, _ids_arg
from ._pydantic import core_schema_for, json_schema_for
from ._ranges import LocalPlaces, NotificationKind, RemoteRanges, _local_places_arg, _remote_ranges_arg
from ._types import OperationKind

__all__ = [
    "BlockRef",
    "Grant",
    "GrantMetadata",
    "GrantNotification",
    "RemoteGrant",
    "Rights",
    "RemoteBlocks",
]

Rights = str
"""What a grant allows: ``"read"``, ``"write"`` or ``"read_write"``."""

_RIGHTS = {"read": 1, "write": 2, "read_write": 3}
_RIGHTS_NAMES = {v: k for k, v in _RIGHTS.items()}


class BlockRef(NamedTuple):
    """One block of granted memory as a transfer names it: its index and
    the generation the holder believes it has (a ``(index, generation)``
    tuple)."""

    # (The field hides tuple.index, as the Rust BlockRef names it.)
    index: int  # type: ignore[assignment]
    generation: int


RemoteBlocks = Iterable[Union[int, BlockRef, Tuple[int, int]]]
"""The owner's blocks a transfer names: each an index (at the block's
generation when the transfer starts) or a :class:`BlockRef` /
``(index, generation)`` pair (refused if the block was retired since)."""


class GrantNotification(NamedTuple):
    """What the owner learns of a holder's write that carried a
    notification, in the order the holder's writes completed."""

    seq: int
    """The holder's number for it: 1, 2, 3..."""
    kind: NotificationKind
    """What the holder did: :attr:`NotificationKind.WRITE`, ``READ`` (a
    read that asked for a notification) or ``MESSAGE`` (a bare
    notification, no block: `first_block` and `block_count` are 0). READ
    and WRITE equal :class:`OperationKind`'s members."""
    first_block: int
    """The first of the owner's blocks the write named."""
    block_count: int
    """How many blocks it named."""
    payload: bytes
    """The holder's payload (at most 256 bytes)."""
    holder: Optional[str] = None
    """The worker whose write it is: the grant's bound holder (for a grant
    of an :class:`Offer`, the worker that claimed it); ``None`` for a
    bearer grant."""


def _notification(
    raw: Optional[Tuple[int, int, int, int, bytes, Optional[str]]],
) -> Optional[GrantNotification]:
    if raw is None:
        return None
    seq, kind, first, count, payload, holder = raw
    return GrantNotification(seq, NotificationKind(kind), first, count, payload, holder)


def _rights_arg(rights: Rights) -> int:
    bits = _RIGHTS.get(rights) if isinstance(rights, str) else None
    if bits is None:
        raise ValueError(f"rights must be 'read', 'write' or 'read_write', not {rights!r}")
    return bits


def _seconds_arg(name: str, value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    return float(value)


def _indices(blocks: Iterable[int], what: str) -> List[int]:
    out = []
    for i, x in enumerate(blocks):
        if isinstance(x, bool) or not hasattr(x, "__index__"):
            raise TypeError(f"{what} are ints: entry {i} is a {type(x).__name__}")
        out.append(x.__index__())
    return out


class GrantMetadata:
    """What a :class:`Grant` hands to its holder, through any side channel
    (at most 1 KiB of JSON whatever the pool's size), so that the holder
    can open it with :meth:`Connector.open_grant`.

    It is a capability: whoever holds it may do what the grant allows (a
    bound grant: only the worker it names). Its ``repr`` hides the token;
    treat its JSON like a password.

    Move it as text (:meth:`to_json` / :meth:`from_json`, or ``str()``), as
    bytes (:meth:`to_bytes` / :meth:`from_bytes`, or ``bytes()``), pickled,
    or as a field of a pydantic v2 model (``model_dump`` /
    ``model_validate``). Bad metadata raises ``ValueError``.
    """

    __slots__ = ("_core",)
    _core: _ferry.GrantMetadata

    def __init__(self) -> None:
        raise TypeError(
            "GrantMetadata comes from grant.metadata(), or GrantMetadata.from_json(...) on the holder"
        )

    @classmethod
    def _wrap(cls, core: _ferry.GrantMetadata) -> GrantMetadata:
        m = cls.__new__(cls)
        m._core = core
        return m

    @classmethod
    def from_json(cls, data: Union[str, bytes, bytearray]) -> GrantMetadata:
        """Parses and validates grant metadata JSON; ``ValueError`` if it is
        bad."""
        return cls._wrap(_ferry.GrantMetadata.from_json(data))

    from_bytes = from_json

    def to_json(self) -> str:
        """The JSON to hand to the holder."""
        return self._core.to_json()

    def to_bytes(self) -> bytes:
        """The JSON as UTF-8 bytes."""
        return self._core.to_json().encode()

    def __str__(self) -> str:
        return self._core.to_json()

    def __bytes__(self) -> bytes:
        return self.to_bytes()

    @classmethod
    def model_validate(cls, obj: Union[GrantMetadata, Dict[str, Any]]) -> GrantMetadata:
        """Metadata from the dictionary :meth:`model_dump` gives."""
        if isinstance(obj, GrantMetadata):
            return obj
        if not isinstance(obj, dict):
            raise TypeError(f"model_validate takes a dict, not {type(obj).__name__}")
        return cls.from_json(json.dumps(obj))

    def model_dump(self, *, mode: str = "python") -> Dict[str, Any]:
        """The metadata as a dictionary of JSON values."""
        result: Dict[str, Any] = json.loads(self._core.to_json())
        return result

    @classmethod
    def model_validate_json(cls, data: Union[str, bytes, bytearray]) -> GrantMetadata:
        """pydantic's name for :meth:`from_json`."""
        return cls.from_json(data)

    def model_dump_json(self) -> str:
        """pydantic's name for :meth:`to_json`."""
        return self._core.to_json()

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema_for(cls, cls.model_validate, cls.model_dump)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Dict[str, Any]:
        return json_schema_for(
            cls, schema, handler, {"description": "Ferry's grant metadata (GrantMetadata.model_dump())"}
        )

    @property
    def owner(self) -> str:
        """The owner's worker id."""
        return self._core.owner

    @property
    def holder(self) -> Optional[str]:
        """The worker the grant is bound to; ``None`` for a bearer grant."""
        return self._core.holder

    @property
    def grant_id(self) -> int:
        """The grant's number in its owner's process."""
        return self._core.grant_id

    @property
    def rights(self) -> Rights:
        """``"read"``, ``"write"`` or ``"read_write"``."""
        return _RIGHTS_NAMES[self._core.rights]

    @property
    def expires_at(self) -> Optional[float]:
        """When the grant ends by itself (seconds since the epoch, as
        ``time.time()``), or ``None``."""
        ms = self._core.expires_at_ms
        return None if ms is None else ms / 1000.0

    @property
    def block_size(self) -> int:
        """Bytes per block."""
        return self._core.block_size

    @property
    def block_count(self) -> int:
        """How many blocks the grant covers."""
        return self._core.block_count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GrantMetadata):
            return NotImplemented
        return self._core.to_json() == other._core.to_json()

    def __hash__(self) -> int:
        return hash(self._core.to_json())

    def __reduce__(self) -> Any:
        return (GrantMetadata.from_json, (self._core.to_json(),))

    def __repr__(self) -> str:
        # Never the token, nor the addresses.
        return (
            f"GrantMetadata(owner={self.owner!r}, holder={self.holder!r}, rights={self.rights!r}, "
            f"block_count={self.block_count}, block_size={self.block_size}, "
            f"expires_at={self.expires_at})"
        )


def _metadata_arg(meta: Union[GrantMetadata, str, bytes, bytearray]) -> _ferry.GrantMetadata:
    if isinstance(meta, GrantMetadata):
        return meta._core
    if isinstance(meta, (str, bytes, bytearray)):
        return _ferry.GrantMetadata.from_json(meta)
    raise TypeError(f"grant metadata must be GrantMetadata, str or bytes, not {type(meta).__name__}")


class Grant:
    """A standing grant over a :class:`Pool`, on its owner's side: made by
    :meth:`Connector.grant`; hand :meth:`metadata` to the holder.

    The holder reads and writes the pool's blocks by index until
    :meth:`revoke`, the grant's expiry, or the drop of this object (which
    revokes it; ``async with grant:`` revokes on leaving). The grant does
    not take the pool's blocks: the owner keeps using them, and hands a
    block on only once it knows the holder is done with it (a
    notification), or :meth:`retire`\\ s it before reusing it.

    The holder's writes that carry a payload reach the owner as
    :class:`GrantNotification`\\ s, in order: ``async for n in
    grant.notifications()``, :meth:`next_notification`, or
    :meth:`poll_notification` without waiting.
    """

    __slots__ = ("_core", "_pool")
    _core: _ferry.Grant
    _pool: Pool

    def __init__(self) -> None:
        raise TypeError("a Grant comes from connector.grant(pool, rights, holder=...)")

    @classmethod
    def _new(cls, core: _ferry.Grant, pool: Pool) -> Grant:
        g = cls.__new__(cls)
        g._core = core
        g._pool = pool
        return g

    def metadata(self) -> GrantMetadata:
        """What to hand to the holder (a capability)."""
        return GrantMetadata._wrap(self._core.metadata())

    @property
    def pool(self) -> Pool:
        """The pool the grant is over."""
        return self._pool

    @property
    def rights(self) -> Rights:
        """What the grant allows."""
        return self.metadata().rights

    @property
    def revoked(self) -> bool:
        """Whether the grant was revoked (or expired)."""
        return self._core.revoked

    async def revoke(self) -> None:
        """Revokes the grant. When it returns, no byte moves in or out of the
        pool through it: the holder's transfers in flight have ended (they
        were waited for, without the GIL), and its next use raises
        :class:`GrantRevokedError`. Idempotent. :class:`GrantStalledError`
        if a transfer of a live but stopped holder is still in flight after
        the grant's ``revoke_deadline``."""
        await self._core.revoke()

    def revoke_blocking(self) -> None:
        """:meth:`revoke`, blocking (without the GIL)."""
        self._core.revoke_blocking()

    async def retire(self, blocks: Iterable[int]) -> List[BlockRef]:
        """Retires blocks (indices) before the owner reuses them: their
        generations move on, then the holder's transfers in flight that may
        have named the old ones are waited for. When it returns, a transfer
        that names an old generation is refused
        (:class:`StaleGenerationError`) and moves nothing. Returns the
        blocks' new references, to hand to the holder with the blocks."""
        pairs = await self._core.retire(_indices(blocks, "blocks"))
        return [BlockRef(i, g) for i, g in pairs]

    def generation(self, index: int) -> int:
        """Block `index`'s generation now."""
        return self._core.generation(index)

    def block_refs(self, indices: Iterable[int]) -> List[BlockRef]:
        """The current references of blocks `indices`."""
        return [BlockRef(i, self._core.generation(i)) for i in _indices(indices, "indices")]

    async def next_notification(self) -> Optional[GrantNotification]:
        """The next notification, in order, waiting for it (without the GIL
        or a thread: the owner's notification thread hands it over); ``None``
        once the grant can have no more."""
        return _notification(await self._core.next_notification())

    def poll_notification(self) -> Optional[GrantNotification]:
        """A notification already handed over, or ``None``, without
        waiting."""
        return _notification(self._core.try_next_notification())

    async def notifications(self) -> AsyncIterator[GrantNotification]:
        """The holder's notifications, in order, as they come (``async for
        n in grant.notifications()``); ends once the grant can have no
        more."""
        while True:
            n = await self.next_notification()
            if n is None:
                return
            yield n

    async def __aenter__(self) -> Grant:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.revoke()

    def __repr__(self) -> str:
        m = self.metadata()
        return (
            f"Grant(rights={m.rights!r}, holder={m.holder!r}, blocks={m.block_count}, "
            f"block_size={m.block_size}, revoked={self.revoked})"
        )


class RemoteGrant:
    """A grant opened by its holder (:meth:`Connector.open_grant`): reads
    and writes blocks of the owner's memory by index, from and into blocks
    of a local :class:`Pool`, one-sidedly (no round trip through the owner).

    Remote blocks are :data:`RemoteBlocks`: an index stands for the block at
    its generation when the transfer starts; a :class:`BlockRef` (what
    ``retire`` returns on the owner's side, or :meth:`block_refs` here) pins
    one, so that a transfer into a block the owner has reused since is
    refused. Local blocks are ids of the local pool, taken for the copy as
    an operation takes them (:class:`BlockBusyError` if an operation in
    progress uses them). Counts must match pairwise, and so must the two
    pools' block sizes.

    Each transfer is refused, with nothing copied, if the grant was revoked
    (:class:`GrantRevokedError`) or expired (:class:`GrantExpiredError`),
    lacks the right (:class:`GrantRightsError`), or names a block out of
    range (:class:`GrantBlockRangeError`) or at an old generation
    (:class:`StaleGenerationError`). Awaiting releases the GIL; copies
    under 1 MiB run in place, larger ones on a thread of Ferry's.
    """

    __slots__ = ("_core",)
    _core: _ferry.RemoteGrant

    def __init__(self) -> None:
        raise TypeError("a RemoteGrant comes from await connector.open_grant(metadata)")

    @classmethod
    def _new(cls, core: _ferry.RemoteGrant) -> RemoteGrant:
        g = cls.__new__(cls)
        g._core = core
        return g

    def metadata(self) -> GrantMetadata:
        """The grant's metadata."""
        return GrantMetadata._wrap(self._core.metadata())

    @property
    def rights(self) -> Rights:
        """What the grant allows."""
        return self.metadata().rights

    @property
    def block_count(self) -> int:
        """How many blocks the grant covers."""
        return self._core.metadata().block_count

    @property
    def block_size(self) -> int:
        """Bytes per block."""
        return self._core.metadata().block_size

    @property
    def revoked(self) -> bool:
        """Whether the owner revoked the grant (or it expired), as its
        control page says now."""
        return self._core.revoked

    def generation(self, index: int) -> int:
        """Block `index`'s generation now (read from the owner's control
        page)."""
        return self._core.generation(index)

    def block_refs(self, indices: Iterable[int]) -> List[BlockRef]:
        """The current references of blocks `indices`."""
        return [BlockRef(i, self._core.generation(i)) for i in _indices(indices, "indices")]

    async def read_blocks(self, remote_blocks: RemoteBlocks, local_pool: Pool, local_blocks: BlockIds) -> None:
        """Reads the owner's blocks `remote_blocks` into blocks
        `local_blocks` of `local_pool`, pairwise."""
        await self._core.read_blocks(
            _remote_arg(remote_blocks), _pool_arg(local_pool), _ids_arg(local_blocks, local_pool.block_count)
        )

    def read_blocks_blocking(self, remote_blocks: RemoteBlocks, local_pool: Pool, local_blocks: BlockIds) -> None:
        """:meth:`read_blocks`, blocking (without the GIL)."""
        self._core.read_blocks_blocking(
            _remote_arg(remote_blocks), _pool_arg(local_pool), _ids_arg(local_blocks, local_pool.block_count)
        )

    async def write_blocks(
        self,
        local_pool: Pool,
        local_blocks: BlockIds,
        remote_blocks: RemoteBlocks,
        *,
        notify: Optional[bytes] = None,
    ) -> None:
        """Writes blocks `local_blocks` of `local_pool` into the owner's
        blocks `remote_blocks`, pairwise; with `notify` (at most 256 bytes,
        ``b""`` for none), the owner then receives a
        :class:`GrantNotification` with it, after the bytes landed."""
        await self._core.write_blocks(
            _pool_arg(local_pool),
            _ids_arg(local_blocks, local_pool.block_count),
            _remote_arg(remote_blocks),
            _notify_arg(notify),
        )

    def write_blocks_blocking(
        self,
        local_pool: Pool,
        local_blocks: BlockIds,
        remote_blocks: RemoteBlocks,
        *,
        notify: Optional[bytes] = None,
    ) -> None:
        """:meth:`write_blocks`, blocking (without the GIL)."""
        self._core.write_blocks_blocking(
            _pool_arg(local_pool),
            _ids_arg(local_blocks, local_pool.block_count),
            _remote_arg(remote_blocks),
            _notify_arg(notify),
        )

    async def read_ranges(
        self,
        remote: RemoteRanges,
        local_pool: Pool,
        local: LocalPlaces,
        *,
        notify: Optional[bytes] = None,
    ) -> None:
        """Reads the owner's byte ranges `remote` (:class:`BlockRange` objects
        or ``(block, offset, len)`` tuples) into `local_pool` at `local`
        (``(block, offset)`` pairs, one per range, none overlapping); with
        `notify` (at most 256 bytes), the owner then receives a
        :class:`GrantNotification` of kind ``READ``, after every byte was
        read. Refused as :meth:`read_blocks` is, and if a range is empty or
        passes its block's end, or a local place passes its block's end or
        overlaps another (:class:`ValueError`, as other misuse)."""
        await self._core.read_ranges(
            _remote_ranges_arg(remote), _pool_arg(local_pool), _local_places_arg(local), _notify_arg(notify)
        )

    def read_ranges_blocking(
        self,
        remote: RemoteRanges,
        local_pool: Pool,
        local: LocalPlaces,
        *,
        notify: Optional[bytes] = None,
    ) -> None:
        """:meth:`read_ranges`, blocking (without the GIL)."""
        self._core.read_ranges_blocking(
            _remote_ranges_arg(remote), _pool_arg(local_pool), _local_places_arg(local), _notify_arg(notify)
        )

    def prepare_ranges(
        self, write: bool, remote: RemoteRanges, local_pool: Pool, local: LocalPlaces
    ) -> _ferry.PreparedRanges:
        """A range transfer checked once and posted any number of times
        (NIXL's model: what ``ferry.nixl`` re-posts): `write` moves
        `local_pool` at `local` into the owner's ranges `remote`, else the
        owner's ranges into `local_pool` at `local`, with the arguments of
        :meth:`read_ranges` and :meth:`write_ranges`, refused the same way.

        Each post moves the bytes as they are when it runs:
        ``run_blocking(notify=None)`` in the call (raising the grant's
        error), ``start(notify=None)`` on Ferry's runtime (a pending with
        ``done()``, ``error()``, ``wait(timeout)``), ``post(notify=None)``
        one at a time (0 done, 1 in progress, 2 failed, 3 refused while
        the last post is in progress; the object then answers ``done()``,
        ``error()``, ``wait()`` for that post)::

            prep = remote.prepare_ranges(False, [(3, 0, 4096)], pool, [(0, 0)])
            for _ in range(1000):
                prep.run_blocking()  # a 4 KiB read, a few microseconds
        """
        return self._core.prepare_ranges(
            write, _remote_ranges_arg(remote), _pool_arg(local_pool), _local_places_arg(local)
        )

    async def write_ranges(
        self,
        local_pool: Pool,
        local: LocalPlaces,
        remote: RemoteRanges,
        *,
        notify: Optional[bytes] = None,
    ) -> None:
        """Writes `local_pool` at `local` (``(block, offset)`` pairs, one
        per range) into the owner's byte ranges `remote`; with `notify`,
        the owner then receives a :class:`GrantNotification` of kind
        ``WRITE``, after the bytes landed."""
        await self._core.write_ranges(
            _pool_arg(local_pool), _local_places_arg(local), _remote_ranges_arg(remote), _notify_arg(notify)
        )

    def write_ranges_blocking(
        self,
        local_pool: Pool,
        local: LocalPlaces,
        remote: RemoteRanges,
        *,
        notify: Optional[bytes] = None,
    ) -> None:
        """:meth:`write_ranges`, blocking (without the GIL)."""
        self._core.write_ranges_blocking(
            _pool_arg(local_pool), _local_places_arg(local), _remote_ranges_arg(remote), _notify_arg(notify)
        )

    async def notify(self, payload: bytes) -> None:
        """Sends the owner a notification that moves no byte (NIXL's
        ``send_notif``): a :class:`GrantNotification` of kind ``MESSAGE``
        with `payload` (at most 256 bytes), in order with this holder's
        other notifications. Any right sends one; refused if the grant was
        revoked or expired."""
        await self._core.notify(_payload_arg(payload))

    def notify_blocking(self, payload: bytes) -> None:
        """:meth:`notify`, blocking (without the GIL)."""
        self._core.notify_blocking(_payload_arg(payload))

    def __repr__(self) -> str:
        m = self.metadata()
        return (
            f"RemoteGrant(owner={m.owner!r}, rights={m.rights!r}, blocks={m.block_count}, "
            f"block_size={m.block_size}, revoked={self.revoked})"
        )


def _pool_arg(pool: Pool) -> _ferry.Pool:
    if not isinstance(pool, Pool):
        raise TypeError(f"the local pool must be a ferry.Pool, not {type(pool).__name__}")
    return pool._core


def _remote_arg(blocks: RemoteBlocks) -> Sequence[Union[int, Tuple[int, int]]]:
    if isinstance(blocks, (str, bytes, bytearray)):
        raise TypeError("remote blocks are ints or (index, generation) pairs, not text")
    if isinstance(blocks, BlockRef):
        # Else taken for two indices: the block's and its generation.
        raise TypeError("remote blocks are a list: pass [block_ref], not a BlockRef alone")
    numpy_like = hasattr(blocks, "tolist") and not isinstance(blocks, tuple)
    given: List[Any] = blocks.tolist() if numpy_like else list(blocks)  # type: ignore[attr-defined]
    items: List[Union[int, Tuple[int, int]]] = []
    for i, x in enumerate(given):
        if isinstance(x, bool):
            raise TypeError(f"remote blocks are ints or (index, generation) pairs: entry {i} is a bool")
        items.append(tuple(x) if isinstance(x, list) else x)
    return items


def _notify_arg(notify: Optional[bytes]) -> Optional[bytes]:
    if notify is None:
        return None
    if isinstance(notify, (bytes, bytearray, memoryview)):
        return bytes(notify)
    raise TypeError(f"notify must be bytes, not {type(notify).__name__}")


def _payload_arg(payload: bytes) -> bytes:
    p = _notify_arg(payload)
    if p is None:
        raise TypeError("notify's payload must be bytes, not None")
    return p


def _make_grant(
    core: _ferry.Connector,
    pool: Pool,
    rights: Rights,
    holder: Optional[str],
    bearer: bool,
    expires_after: Optional[float],
    spin_us: Optional[float],
    revoke_deadline: Optional[float],
) -> Grant:
    if not isinstance(pool, Pool):
        raise TypeError(f"a grant is over a ferry.Pool, not {type(pool).__name__}")
    if holder is not None and not isinstance(holder, str):
        raise TypeError(f"holder must be a worker id (str) or None, not {type(holder).__name__}")
    if holder is None and not bearer:
        raise ValueError(
            "a grant must name the worker it is for (holder=worker_id) or be a bearer grant (bearer=True)"
        )
    g = core.grant(
        pool._core,
        _rights_arg(rights),
        holder,
        bool(bearer),
        _seconds_arg("expires_after", expires_after),
        _seconds_arg("spin_us", spin_us),
        _seconds_arg("revoke_deadline", revoke_deadline),
    )
    return Grant._new(g, pool)
