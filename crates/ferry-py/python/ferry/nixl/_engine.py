"""What moves the bytes under :class:`ferry.nixl.nixl_agent`: the small
interface the agent uses (:class:`Engine`), and the regions and sub-operations
it hands to it.

The agent does NIXL's bookkeeping (descriptor lists, registrations, remote
agents, handles, states, notifications) and asks an engine for five things:
offer a registered region to any peer (:meth:`Engine.offer`, an
:class:`OfferLike` whose metadata goes into the agent's metadata), claim a
peer's offer (:meth:`Engine.claim`, a :class:`GrantLike`), post a transfer
as sub-operations, one per pair of local and remote regions
(:meth:`Engine.post`, a :class:`PendingLike` the agent polls), send
notifications (:meth:`Engine.send`), and stop (:meth:`Engine.close`).
:mod:`ferry.nixl._ferry_engine` is the engine over Ferry's offers and
standing grants; the tests also run the agent over an in-process one.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from ._status import nixl_mem_t

__all__ = [
    "Engine",
    "OfferLike",
    "GrantLike",
    "PendingLike",
    "LocalRegion",
    "RemoteRegion",
    "SubOp",
    "Done",
    "MAX_NOTIF_PART",
]

MAX_NOTIF_PART = 256
"""The most bytes one notification carries (Ferry's grants' limit); the
agent frames longer messages as several (see ``_notify``)."""

Array = npt.NDArray[np.uint64]


class OfferLike(Protocol):
    """A registered region offered to any peer."""

    def metadata(self) -> str:
        """What a peer claims it with (JSON)."""
        ...

    def poll(self) -> Optional[Tuple[Optional[str], bytes]]:
        """A notification a holder sent (its worker id, the payload), or
        ``None``."""
        ...

    def revoke(self) -> None:
        """Ends every grant made from it; when it returns no byte moves
        through them."""
        ...


class GrantLike(Protocol):
    """A peer's offer, claimed."""

    def close(self) -> None:
        """Forgets it (later sub-operations on it fail)."""
        ...


class PendingLike(Protocol):
    """A posted transfer."""

    def done(self) -> bool:
        """Whether it has ended (successfully or not)."""
        ...

    def error(self) -> Optional[BaseException]:
        """Why it failed, once :meth:`done`; ``None`` if it succeeded."""
        ...

    def finished_ns(self) -> Optional[int]:
        """When it ended (``time.monotonic_ns()``), if known."""
        ...

    def cancel(self) -> None:
        """Asks it to stop (it may still complete)."""
        ...

    def wait(self, timeout: float) -> bool:
        """Waits at most `timeout` seconds for it to end; whether it has."""
        ...


@dataclass(eq=False)
class LocalRegion:
    """A region this agent registered (`users`: this agent's transfers in
    flight that use it; `pools`: the engine's)."""

    addr: int
    length: int
    dev: int
    mem: nixl_mem_t
    offer: Optional[OfferLike] = None
    refs: int = 1
    live: bool = True
    users: List[PendingLike] = field(default_factory=list)
    pools: Dict[int, Any] = field(default_factory=dict)
    gate: Any = None
    """The engine's gate (``Engine.gate``), closed when the region goes."""
    fast: List[PendingLike] = field(default_factory=list)
    """The prepared transfers (``Engine.fast``) that use it, whose last
    posts a deregistration waits for."""

    @property
    def end(self) -> int:
        return self.addr + self.length

    @property
    def device(self) -> str:
        """Ferry's device string."""
        return "cpu" if self.mem == nixl_mem_t.DRAM_SEG else f"cuda:{self.dev}"


@dataclass(eq=False)
class RemoteRegion:
    """A region a remote agent registered, with its offer claimed (``grant``;
    ``None`` for a region of this agent itself, moved by loopback)."""

    agent: str
    addr: int
    length: int
    dev: int
    mem: nixl_mem_t
    offer_json: str
    grant: Optional[GrantLike]
    live: bool = True
    gate: Any = None
    """The engine's gate (``Engine.gate``), closed when the region goes."""

    @property
    def end(self) -> int:
        return self.addr + self.length


@dataclass(eq=False)
class SubOp:
    """The part of a transfer between one local and one remote region:
    pieces of ``lens[i]`` bytes at ``local_off[i]`` in the local region and
    ``remote_off[i]`` in the remote one (offsets from the regions'
    starts)."""

    local: LocalRegion
    remote: RemoteRegion  # a LocalRegion for a loopback transfer
    local_off: Array
    remote_off: Array
    lens: Array
    ranges: Optional[Tuple[int, List[Tuple[int, int, int]], List[Tuple[int, int]]]] = None
    """:func:`pieces`' answer, kept for the transfer's next posts."""

    prepared: Any = None
    """The engine's own form of it, made at its first post and kept."""

    nbytes: int = 0
    """The bytes it moves (set when it is made)."""

    def __post_init__(self) -> None:
        self.nbytes = int(self.lens.sum())


class Engine(Protocol):
    """What moves the bytes (see the module)."""

    @property
    def worker_id(self) -> str:
        """This engine's id, which the peers' notifications name."""
        ...

    def offer(self, region: LocalRegion) -> OfferLike:
        """Offers `region` for any peer to read and write."""
        ...

    def claim(self, offer_json: str) -> GrantLike:
        """Claims a peer's offer (its JSON); raises if refused."""
        ...

    def post(
        self, write: bool, subops: Sequence[SubOp], notify: Sequence[bytes], mailbox: Optional[GrantLike]
    ) -> PendingLike:
        """Starts a READ (``write`` false: remote to local) or WRITE. With
        one sub-operation and one notification the notification goes with
        it; else the notifications go through `mailbox`, in order, once
        every sub-operation has ended successfully."""
        ...

    def send(self, mailbox: GrantLike, notify: Sequence[bytes]) -> None:
        """Sends notifications through `mailbox`, in order, and returns
        once they are queued at the owner."""
        ...

    def close(self) -> None:
        """Stops (after the agent revoked its offers)."""
        ...


class Done:
    """A pending that has already ended."""

    __slots__ = ("_error", "_at")

    def __init__(self, error: Optional[BaseException] = None) -> None:
        self._error = error
        self._at = time.monotonic_ns()

    def done(self) -> bool:
        return True

    def error(self) -> Optional[BaseException]:
        return self._error

    def finished_ns(self) -> Optional[int]:
        return self._at

    def cancel(self) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        return True


DONE = Done()
"""A post that completed in the call, successfully: an engine may return
this one object (the agent takes the time the call returned as the time
the transfer ended, not this object's)."""


MAX_LOCAL_BLOCKS = 1 << 20
"""The most blocks a local region's pool is cut into (see :func:`pieces`)."""


def local_block(sub: SubOp) -> int:
    """The block size of the local pool a sub-operation uses: the largest
    that divides the region's length and every piece's offset and length,
    so that each piece is whole blocks (transfers into different blocks of
    one region then never refuse each other), or the region's length (one
    block) if that would cut the region into more than
    :data:`MAX_LOCAL_BLOCKS`, or the pieces into more than 8 times as many
    ranges (descriptors that are not multiples of one block size)."""
    g = int(np.gcd.reduce(np.concatenate((sub.local_off, sub.lens, np.array([sub.local.length], dtype=np.uint64)))))
    if g == 0 or sub.local.length // g > MAX_LOCAL_BLOCKS:
        return sub.local.length
    if int((sub.lens // np.uint64(g)).sum()) > 8 * sub.lens.shape[0]:
        return sub.local.length
    return g


def pieces(sub: SubOp) -> Tuple[int, List[Tuple[int, int, int]], List[Tuple[int, int]]]:
    """A sub-operation as Ferry's range operations take it: the local
    pool's block size (:func:`local_block`), remote ``(block, offset,
    len)`` ranges in the remote region's pool (one block: the region), and
    local ``(block, offset)`` places, each piece cut at the local blocks'
    boundaries. Made once per sub-operation (a prepared transfer is posted
    again and again)."""
    if sub.ranges is None:
        b = local_block(sub)
        lo, ro, ln = sub.local_off, sub.remote_off, sub.lens
        if b == sub.local.length:
            remote = list(zip(itertools.repeat(0), ro.tolist(), ln.tolist()))
            local = list(zip(itertools.repeat(0), lo.tolist()))
        else:
            bb = np.uint64(b)
            counts = (ln // bb).astype(np.int64)
            which = np.repeat(np.arange(ln.shape[0]), counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            k = (np.arange(which.shape[0]) - first).astype(np.uint64)
            lblocks = lo[which] // bb + k
            roffs = ro[which] + k * bb
            remote = list(zip(itertools.repeat(0), roffs.tolist(), itertools.repeat(b)))
            local = list(zip(lblocks.tolist(), itertools.repeat(0)))
        sub.ranges = (b, remote, local)
    return sub.ranges


def describe(sub: SubOp) -> Any:
    """For messages."""
    return f"{len(sub.lens)} range(s), {sub.nbytes} bytes, remote agent {sub.remote.agent!r}"
