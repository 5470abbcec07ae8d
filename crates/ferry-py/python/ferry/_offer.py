"""Offers: :class:`Offer` (the owner's side) and :class:`OfferMetadata`
(what the owner publishes).

The owner of a :class:`Pool` offers its blocks once
(:meth:`Connector.offer`); any worker that has the offer's metadata claims a
grant of its own (``await connector.claim(meta)``), which the owner's
runtime makes, with no call of the owner's application: bound to the
claiming connection's worker id (authenticated with a shared secret), with
the offer's rights and expiry. The claimer gets a :class:`RemoteGrant`; the
owner sees every holder's notifications merged, each naming its
``holder``. See ``docs/grants.md``, "Offers".
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, Iterable, List, Optional, Union

from . import _ferry
from ._grant import GrantNotification, Rights, _indices, _notification, _rights_arg, _seconds_arg, _RIGHTS_NAMES
from ._pool import Pool

__all__ = ["Offer", "OfferMetadata"]


class OfferMetadata:
    """What an :class:`Offer` publishes (at most 1 KiB of JSON whatever the
    pool's size): any worker that has it may claim a grant of its own with
    :meth:`Connector.claim`. It is a capability for every reader: publish it
    only where each reader may have the offered rights. Its ``repr`` hides
    the token.

    Move it as text (:meth:`to_json` / :meth:`from_json`, or ``str()``), as
    bytes (:meth:`to_bytes` / :meth:`from_bytes`, or ``bytes()``), pickled,
    or as a dictionary (:meth:`model_dump` / :meth:`model_validate`). Bad
    metadata raises ``ValueError``.
    """

    __slots__ = ("_core",)
    _core: _ferry.OfferMetadata

    def __init__(self) -> None:
        raise TypeError("OfferMetadata comes from offer.metadata(), or OfferMetadata.from_json(...)")

    @classmethod
    def _wrap(cls, core: _ferry.OfferMetadata) -> OfferMetadata:
        m = cls.__new__(cls)
        m._core = core
        return m

    @classmethod
    def from_json(cls, data: Union[str, bytes, bytearray]) -> OfferMetadata:
        """Parses and validates offer metadata JSON; ``ValueError`` if it is
        bad."""
        return cls._wrap(_ferry.OfferMetadata.from_json(data))

    from_bytes = from_json

    def to_json(self) -> str:
        """The JSON to publish."""
        return self._core.to_json()

    def to_bytes(self) -> bytes:
        """The JSON as UTF-8 bytes."""
        return self._core.to_json().encode()

    def __str__(self) -> str:
        return self._core.to_json()

    def __bytes__(self) -> bytes:
        return self.to_bytes()

    @classmethod
    def model_validate(cls, obj: Union[OfferMetadata, Dict[str, Any]]) -> OfferMetadata:
        """Metadata from the dictionary :meth:`model_dump` gives."""
        if isinstance(obj, OfferMetadata):
            return obj
        if not isinstance(obj, dict):
            raise TypeError(f"model_validate takes a dict, not {type(obj).__name__}")
        return cls.from_json(json.dumps(obj))

    def model_dump(self, *, mode: str = "python") -> Dict[str, Any]:
        """The metadata as a dictionary of JSON values."""
        result: Dict[str, Any] = json.loads(self._core.to_json())
        return result

    @property
    def owner(self) -> str:
        """The owner's worker id."""
        return self._core.owner

    @property
    def offer_id(self) -> int:
        """The offer's number in its owner's process."""
        return self._core.offer_id

    @property
    def rights(self) -> Rights:
        """``"read"``, ``"write"`` or ``"read_write"``: what each claimer's
        grant allows."""
        return _RIGHTS_NAMES[self._core.rights]

    @property
    def expires_at(self) -> Optional[float]:
        """When the offer and its grants end by themselves (seconds since
        the epoch), or ``None``."""
        ms = self._core.expires_at_ms
        return None if ms is None else ms / 1000.0

    @property
    def block_size(self) -> int:
        """Bytes per block."""
        return self._core.block_size

    @property
    def block_count(self) -> int:
        """How many blocks the offer covers."""
        return self._core.block_count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OfferMetadata):
            return NotImplemented
        return self._core.to_json() == other._core.to_json()

    def __hash__(self) -> int:
        return hash(self._core.to_json())

    def __reduce__(self) -> Any:
        return (OfferMetadata.from_json, (self._core.to_json(),))

    def __repr__(self) -> str:
        # Never the token, nor the addresses.
        return (
            f"OfferMetadata(owner={self.owner!r}, rights={self.rights!r}, "
            f"block_count={self.block_count}, block_size={self.block_size}, expires_at={self.expires_at})"
        )


def _offer_metadata_arg(meta: Union[OfferMetadata, str, bytes, bytearray]) -> _ferry.OfferMetadata:
    if isinstance(meta, OfferMetadata):
        return meta._core
    if isinstance(meta, (str, bytes, bytearray)):
        return _ferry.OfferMetadata.from_json(meta)
    raise TypeError(f"offer metadata must be OfferMetadata, str or bytes, not {type(meta).__name__}")


class Offer:
    """An offer over a :class:`Pool`, on its owner's side: made by
    :meth:`Connector.offer`; publish :meth:`metadata`.

    Each worker that claims it holds a grant of its own, bound to it;
    :meth:`holders` names them. Their writes' notifications come merged
    (each holder's in its order), each naming its ``holder``: ``async for n
    in offer.notifications()``, :meth:`next_notification`, or
    :meth:`poll_notification` without waiting. :meth:`revoke_holder` ends
    one holder's grant (and refuses its later claims); :meth:`revoke`, or
    the drop of this object, ends every grant of the offer and refuses
    later claims (:class:`GrantRevokedError`). A worker that claims again
    gets a fresh grant, which replaces its previous one.
    """

    __slots__ = ("_core", "_pool")
    _core: _ferry.Offer
    _pool: Pool

    def __init__(self) -> None:
        raise TypeError("an Offer comes from connector.offer(pool, rights)")

    @classmethod
    def _new(cls, core: _ferry.Offer, pool: Pool) -> Offer:
        o = cls.__new__(cls)
        o._core = core
        o._pool = pool
        return o

    def metadata(self) -> OfferMetadata:
        """What to publish (a capability for every reader)."""
        return OfferMetadata._wrap(self._core.metadata())

    @property
    def pool(self) -> Pool:
        """The pool offered."""
        return self._pool

    @property
    def revoked(self) -> bool:
        """Whether the offer was revoked."""
        return self._core.revoked

    def holders(self) -> List[str]:
        """The workers that hold a grant of the offer now, sorted."""
        return self._core.holders()

    async def revoke(self) -> None:
        """Revokes the offer: later claims are refused and every grant made
        from it is revoked (as :meth:`Grant.revoke`: when it returns, no byte
        moves through any of them). Idempotent."""
        await self._core.revoke()

    def revoke_blocking(self) -> None:
        """:meth:`revoke`, blocking (without the GIL)."""
        self._core.revoke_blocking()

    async def revoke_holder(self, holder: str) -> None:
        """Revokes worker `holder`'s grant (as :meth:`Grant.revoke`) and
        refuses its later claims; the other holders' grants go on."""
        if not isinstance(holder, str):
            raise TypeError(f"holder must be a worker id (str), not {type(holder).__name__}")
        await self._core.revoke_holder(holder)

    def revoke_holder_blocking(self, holder: str) -> None:
        """:meth:`revoke_holder`, blocking (without the GIL)."""
        if not isinstance(holder, str):
            raise TypeError(f"holder must be a worker id (str), not {type(holder).__name__}")
        self._core.revoke_holder_blocking(holder)

    async def retire(self, blocks: Iterable[int]) -> None:
        """Retires blocks (indices) in every grant of the offer before the
        owner reuses them: a transfer of any holder that names an older
        generation is refused from the time this returns."""
        await self._core.retire(_indices(blocks, "blocks"))

    async def next_notification(self) -> Optional[GrantNotification]:
        """The next notification of any holder, waiting for it (without the
        GIL); ``None`` once the offer is revoked and holds no grant, or
        expired."""
        return _notification(await self._core.next_notification())

    def poll_notification(self) -> Optional[GrantNotification]:
        """A notification already queued, or ``None``, without waiting."""
        return _notification(self._core.poll_notification())

    async def notifications(self) -> AsyncIterator[GrantNotification]:
        """Every holder's notifications as they come (``async for n in
        offer.notifications()``); ends once the offer is revoked or
        expired."""
        while True:
            n = await self.next_notification()
            if n is None:
                return
            yield n

    async def __aenter__(self) -> Offer:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.revoke()

    def __repr__(self) -> str:
        m = self.metadata()
        return (
            f"Offer(rights={m.rights!r}, blocks={m.block_count}, block_size={m.block_size}, "
            f"holders={self.holders()!r}, revoked={self.revoked})"
        )


def _make_offer(
    core: _ferry.Connector,
    pool: Pool,
    rights: Rights,
    expires_after: Optional[float],
    spin_us: Optional[float],
    revoke_deadline: Optional[float],
    max_holders: Optional[int] = None,
) -> Offer:
    if not isinstance(pool, Pool):
        raise TypeError(f"an offer is over a ferry.Pool, not {type(pool).__name__}")
    if max_holders is not None and (isinstance(max_holders, bool) or not isinstance(max_holders, int)):
        raise TypeError(f"max_holders is an int, not {type(max_holders).__name__}")
    if max_holders is not None and not 1 <= max_holders < 1 << 32:
        raise ValueError(f"max_holders must be from 1 to 2**32 - 1, not {max_holders}")
    o = core.offer(
        pool._core,
        _rights_arg(rights),
        _seconds_arg("expires_after", expires_after),
        _seconds_arg("spin_us", spin_us),
        _seconds_arg("revoke_deadline", revoke_deadline),
        max_holders,
    )
    return Offer._new(o, pool)
