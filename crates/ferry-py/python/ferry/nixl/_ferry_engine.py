"""The engine over Ferry: one :class:`ferry.Connector` per agent (its worker
id the agent's name), an offer per registered region, a claimed grant per
remote region, byte-range reads and writes for transfers.

The owner's pool, the one its offer is over, is of one block (the region),
so that a descriptor anywhere in it is one byte range ``(0, offset, len)``
(a grant takes none of the owner's blocks). On the initiator's side the
region's pool is cut into blocks that each piece of the transfer covers
whole (``_engine.local_block``: vLLM's KV blocks), so that transfers in
flight into different blocks of one region never refuse each other; two
that write into one block at once are refused (``"ERR"``): NIXL lets them
race.

A transfer of one sub-operation of at most :data:`INLINE_MAX` bytes runs in
the posting call (its ``_blocking`` form, without the GIL: a cross-memory
attach grant copies that much in place, in microseconds to a few hundred,
and NIXL's ``transfer`` returns ``"DONE"`` for what completed in the call
too); others run on a
background event loop, all sub-operations at once, then the notification.
A transfer released in flight is waited for, not cut short: a copy in
progress finishes before its memory can be handed back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from typing import Any, Coroutine, List, Optional, Sequence, Tuple

from .._pool import Pool
from ._engine import DONE, Done, GrantLike, LocalRegion, OfferLike, PendingLike, SubOp, pieces

__all__ = ["FerryEngine", "INLINE_MAX"]

INLINE_MAX = 2 << 20
"""The largest transfer (of one sub-operation) run in the posting call."""


def max_holders() -> Optional[int]:
    """How many agents may add each region's offer at once:
    ``FERRY_NIXL_MAX_HOLDERS`` if set, else Ferry's default (256). A
    ``ValueError`` for a value that is not a positive integer."""
    raw = os.environ.get("FERRY_NIXL_MAX_HOLDERS", "")
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"FERRY_NIXL_MAX_HOLDERS must be a positive integer, not {raw!r}")
    return n


class _Loop:
    """The process's background event loop (a daemon thread), started at
    first use."""

    _lock = threading.Lock()
    _loop: Optional[asyncio.AbstractEventLoop] = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="ferry-nixl-loop", daemon=True).start()
                cls._loop = loop
            return cls._loop

    @classmethod
    def submit(cls, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, cls.get())


class _FuturePending:
    """A transfer running on the background loop."""

    __slots__ = ("_fut", "_end")

    def __init__(self) -> None:
        self._fut: Optional[concurrent.futures.Future[Any]] = None
        self._end: Optional[int] = None

    def done(self) -> bool:
        return self._fut is not None and self._fut.done()

    def error(self) -> Optional[BaseException]:
        if self._fut is None or not self._fut.done():
            return None
        if self._fut.cancelled():
            return RuntimeError("cancelled")
        return self._fut.exception()

    def finished_ns(self) -> Optional[int]:
        return self._end

    def cancel(self) -> None:
        # Never cut short: a copy in progress finishes (see the module).
        pass

    def wait(self, timeout: float) -> bool:
        if self._fut is None:
            return True
        concurrent.futures.wait([self._fut], timeout=timeout)
        return self._fut.done()


class _Offer:
    """A region's offer, and the pool it is over."""

    def __init__(self, offer: Any, pool: Pool) -> None:
        self._offer = offer
        self._pool = pool
        self._json: str = offer.metadata().to_json()

    def metadata(self) -> str:
        return self._json

    def poll(self) -> Optional[Tuple[Optional[str], bytes]]:
        n = self._offer.poll_notification()
        if n is None:
            return None
        return (n.holder, bytes(n.payload))

    def revoke(self) -> None:
        blocking = getattr(self._offer, "revoke_blocking", None)
        if blocking is not None:
            blocking()
            return
        r = self._offer.revoke()
        if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future) or hasattr(r, "__await__"):
            _Loop.submit(_awaited(r)).result()


async def _awaited(x: Any) -> Any:
    return await x


class _Grant:
    """A claimed offer of a peer."""

    def __init__(self, grant: Any) -> None:
        self.grant = grant
        self.closed = False
        self.lock: Optional[asyncio.Lock] = None

    def close(self) -> None:
        self.closed = True
        self.grant = None


def _pool(region: LocalRegion, block: int) -> Pool:
    """The region's pool of `block`-byte blocks (one per block size: every
    operation of that size takes its blocks from the one table)."""
    pool: Optional[Pool] = region.pools.get(block)
    if pool is None:
        pool = region.pools.setdefault(block, Pool((region.addr, region.length, region.device, None), block))
    return pool


def _grant(sub: SubOp) -> Any:
    g = sub.remote.grant
    if not isinstance(g, _Grant) or g.closed or g.grant is None:
        raise RuntimeError(f"the grant of agent {sub.remote.agent!r} was closed (the agent was removed)")
    return g.grant


class FerryEngine:
    """See the module."""

    def __init__(self, worker_id: str, module: Any = None) -> None:
        """`module` stands for the ``ferry`` package (tests)."""
        if module is None:
            import ferry as module

        self._id = worker_id
        # Any: the package, or the tests' stand-in for it.
        self.connector: Any = module.Connector(worker_id)
        self._ferry: Any = module

    @property
    def worker_id(self) -> str:
        return self._id

    def offer(self, region: LocalRegion) -> OfferLike:
        pool = Pool((region.addr, region.length, region.device, None), region.length)
        n = max_holders()
        if n is None:
            return _Offer(self.connector.offer(pool, "read_write"), pool)
        return _Offer(self.connector.offer(pool, "read_write", max_holders=n), pool)

    def claim(self, offer_json: str) -> GrantLike:
        meta = self._ferry.OfferMetadata.from_json(offer_json)
        return _Grant(self.connector.claim_blocking(meta))

    def post(
        self, write: bool, subops: Sequence[SubOp], notify: Sequence[bytes], mailbox: Optional[GrantLike]
    ) -> PendingLike:
        if len(subops) == 1 and len(notify) <= 1:
            sub = subops[0]
            try:
                prep = sub.prepared
                g = sub.remote.grant
                if prep is None or not isinstance(g, _Grant) or g.closed:
                    prep = self._prepared(write, sub)
                if prep is not None:
                    n = notify[0] if notify else None
                    if prep.large:
                        pending: PendingLike = prep.start(n)
                        return pending
                    prep.run_blocking(n)
                    return DONE
            except Exception as e:
                return Done(e)
        with_op = len(subops) == 1 and len(notify) == 1
        trailing = [] if with_op else list(notify)
        if len(subops) == 1 and subops[0].nbytes <= INLINE_MAX and not trailing:
            try:
                self._run_blocking(write, subops[0], notify[0] if with_op else None)
            except Exception as e:
                return Done(e)
            return Done()
        future = _FuturePending()
        future._fut = _Loop.submit(self._run(future, write, subops, notify[0] if with_op else None, trailing, mailbox))
        return future

    def gate(self) -> Any:
        """A gate for a region or an agent (closed when it goes)."""
        from .._ferry import Gate

        return Gate()

    def fast(self, write: bool, sub: SubOp, gates: Sequence[Any]) -> Any:
        """The sub-operation as a prepared transfer that posts itself
        (``PreparedRanges.post``), refused once one of `gates` has closed;
        ``None`` where the grant has none (the tests' stand-in)."""
        g = _grant(sub)
        core = getattr(g, "_core", None)
        prepare = getattr(core, "prepare_ranges", None)
        if prepare is None:
            return None
        block, remote, local = pieces(sub)
        pool = _pool(sub.local, block)
        p = prepare(write, remote, pool._core, local, list(gates))
        if sub.prepared is None:
            sub.prepared = p
        return p

    def fast_group(
        self, write: bool, subops: Sequence[SubOp], gates: Sequence[Any], mailbox: Optional[GrantLike]
    ) -> Any:
        """Sub-operations over several region pairs as one prepared group
        that posts itself (``PreparedGroup.post``: every part, then the
        notifications through `mailbox`), refused once one of `gates` has
        closed; ``None`` where the grants have none (the tests' stand-in)."""
        parts = []
        for sub in subops:
            p = self._prepared(write, sub)
            if p is None:
                return None
            parts.append(p)
        box = None
        if mailbox is not None:
            if not isinstance(mailbox, _Grant) or mailbox.grant is None:
                return None
            box = getattr(mailbox.grant, "_core", None)
            if box is None:
                return None
        from .._ferry import PreparedGroup

        return PreparedGroup(parts, box, list(gates))

    def _prepared(self, write: bool, sub: SubOp) -> Any:
        """The sub-operation as the grant's prepared transfer (made at its
        first post, then kept: each later post parses nothing again), or
        ``None`` where the grant has none (the tests' stand-in). Raises if
        the grant was closed."""
        g = _grant(sub)
        p = sub.prepared
        if p is None:
            core = getattr(g, "_core", None)
            prepare = getattr(core, "prepare_ranges", None)
            if prepare is None:
                return None
            block, remote, local = pieces(sub)
            pool = _pool(sub.local, block)
            p = sub.prepared = prepare(write, remote, pool._core, local)
        return p

    def _run_blocking(self, write: bool, sub: SubOp, notify: Optional[bytes]) -> None:
        g = _grant(sub)
        block, remote, local = pieces(sub)
        pool = _pool(sub.local, block)
        core = getattr(g, "_core", None)
        if core is not None:
            # pieces() made the lists (plain ints), so the wrapper's checks of
            # each range (tens of ms for vLLM's 16,384 blocks) are skipped;
            # the core checks every range again.
            if write:
                core.write_ranges_blocking(pool._core, local, remote, notify)
            else:
                core.read_ranges_blocking(remote, pool._core, local, notify)
        elif write:
            g.write_ranges_blocking(pool, local, remote, notify=notify)
        else:
            g.read_ranges_blocking(remote, pool, local, notify=notify)

    async def _one(self, write: bool, sub: SubOp, notify: Optional[bytes]) -> None:
        g = _grant(sub)
        block, remote, local = pieces(sub)
        pool = _pool(sub.local, block)
        core = getattr(g, "_core", None)
        if core is not None:
            # As in _run_blocking.
            if write:
                await core.write_ranges(pool._core, local, remote, notify)
            else:
                await core.read_ranges(remote, pool._core, local, notify)
        elif write:
            await g.write_ranges(pool, local, remote, notify=notify)
        else:
            await g.read_ranges(remote, pool, local, notify=notify)

    async def _run(
        self,
        pending: _FuturePending,
        write: bool,
        subops: Sequence[SubOp],
        notify: Optional[bytes],
        trailing: List[bytes],
        mailbox: Optional[GrantLike],
    ) -> None:
        try:
            results = await asyncio.gather(*(self._one(write, s, notify) for s in subops), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            if trailing:
                if mailbox is None:
                    raise RuntimeError("no mailbox to send the notification through")
                await self._send(mailbox, trailing)
        finally:
            pending._end = time.monotonic_ns()

    async def _send(self, mailbox: GrantLike, payloads: Sequence[bytes]) -> None:
        assert isinstance(mailbox, _Grant)
        if mailbox.lock is None:
            mailbox.lock = asyncio.Lock()
        async with mailbox.lock:
            for p in payloads:
                if mailbox.closed or mailbox.grant is None:
                    raise RuntimeError("the remote agent was removed")
                await mailbox.grant.notify(p)

    def send(self, mailbox: GrantLike, notify: Sequence[bytes]) -> None:
        _Loop.submit(self._send(mailbox, notify)).result(timeout=30)

    def close(self) -> None:
        self.connector = None
