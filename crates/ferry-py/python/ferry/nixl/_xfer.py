"""Transfers, as the agent keeps them: descriptors located in registered
regions (:func:`locate`), prepared descriptor lists
(:class:`PreppedList`), and transfer requests (:class:`XferReq`) with
NIXL's states.

A descriptor of a transfer must lie inside one region registered by the
agent it names (the initiator's own for the local side, the remote agent's
for the other): Ferry checks both sides when the transfer is made and
raises :class:`nixlNotFoundError` otherwise, as NIXL does. A transfer is
cut into one :class:`SubOp` per pair of local and remote regions, and
descriptors that follow each other on both sides are merged (NIXL's
telemetry counts those, ``descCount``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import numpy.typing as npt

from ._dlist import nixlXferDList
from ._notify import frame
from ._engine import LocalRegion, PendingLike, RemoteRegion, SubOp
from ._status import (
    nixl_mem_t,
    nixlInvalidParamError,
    nixlNotFoundError,
)

__all__ = ["locate", "PreppedList", "XferReq", "indices_arg", "plan", "POSTING", "REPOST_ACTIVE"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
R = TypeVar("R", LocalRegion, RemoteRegion)


def locate(regions: Sequence[R], rows: U64, mem: nixl_mem_t, whose: str) -> Tuple[List[R], I64, U64]:
    """The region each descriptor (``addr, len, dev`` rows) lies in, and its
    offset there: ``(regions, index into them per row, offset per row)``.
    :class:`nixlNotFoundError` for a descriptor outside every live region
    of memory type `mem` in `regions` (`whose` names them in the
    message)."""
    cands = [r for r in regions if r.live and r.mem == mem]
    n = rows.shape[0]
    if n == 0:
        return cands, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
    if not cands:
        a, ln, _ = (int(x) for x in rows[0])
        raise nixlNotFoundError(f"descriptor ({a:#x}, {ln}) lies outside every region {whose} registered ({mem.name})")
    starts = np.array([r.addr for r in cands], dtype=np.uint64)
    lengths = np.array([r.length for r in cands], dtype=np.uint64)
    devs = np.array([r.dev for r in cands], dtype=np.uint64)
    order = np.argsort(starts, kind="stable")
    s_starts, s_lengths, s_devs = starts[order], lengths[order], devs[order]
    addr, length, dev = rows[:, 0], rows[:, 1], rows[:, 2]
    pos = np.searchsorted(s_starts, addr, side="right").astype(np.int64) - 1
    safe = np.maximum(pos, 0)
    into = addr - s_starts[safe]
    ok = (pos >= 0) & (addr >= s_starts[safe]) & (into <= s_lengths[safe])
    ok &= length <= s_lengths[safe] - np.where(ok, into, 0)
    if mem == nixl_mem_t.VRAM_SEG:
        ok &= dev == s_devs[safe]
    ridx = order[safe].astype(np.int64)
    offs = np.where(ok, into, 0).astype(np.uint64)
    for i in np.flatnonzero(~ok).tolist():
        # Overlapping registrations: the region that starts last before the
        # address may not hold it while an earlier one does.
        a, ln, d = (int(x) for x in rows[i])
        for j, r in enumerate(cands):
            if r.addr <= a and a - r.addr + ln <= r.length and (mem != nixl_mem_t.VRAM_SEG or r.dev == d):
                ridx[i], offs[i] = j, a - r.addr
                break
        else:
            raise nixlNotFoundError(
                f"descriptor {i} ({a:#x}, {ln} bytes, device {d}) lies outside every region {whose} "
                f"registered ({mem.name})"
            )
    return cands, ridx, offs


@dataclass(eq=False)
class PreppedList:
    """A descriptor list prepared for one side of transfers
    (``prep_xfer_dlist``): each descriptor's region, offset and length.
    `agent` is ``None`` for the initiator's own side, else the remote (or,
    for loopback, this) agent's name; `incarnation` tells a remote agent
    removed and added again from the one the list was prepared for."""

    agent: Optional[str]
    incarnation: int
    mem: nixl_mem_t
    regions: List[Any]
    ridx: I64
    offs: U64
    lens: U64
    released: bool = False

    @property
    def count(self) -> int:
        return int(self.lens.shape[0])


def indices_arg(idx: Any, count: int, side: str) -> I64:
    """Descriptor indices (a list or an integer array) as an array, each
    checked against `count`; :class:`nixlInvalidParamError` otherwise."""
    if isinstance(idx, np.ndarray):
        if idx.dtype.kind not in "iu":
            raise nixlInvalidParamError(f"{side} indices must be integers, not {idx.dtype}")
        arr = idx.reshape(-1).astype(np.int64)
    else:
        try:
            arr = np.fromiter((int(i.__index__()) for i in idx), dtype=np.int64)
        except (AttributeError, TypeError, OverflowError):
            raise nixlInvalidParamError(f"{side} indices must be a list of ints or an integer array") from None
    bad = np.flatnonzero((arr < 0) | (arr >= count))
    if bad.size:
        i = int(bad[0])
        raise nixlInvalidParamError(f"{side} index out of range at index {i} with value {int(arr[i])} (list of {count})")
    return arr


def plan(write: bool, local: PreppedList, lidx: I64, remote: PreppedList, ridx: I64) -> Tuple[List[SubOp], int]:
    """The sub-operations of a transfer of `local` descriptors `lidx` and
    `remote` descriptors `ridx`, pairwise, and how many merged pieces they
    have. :class:`nixlInvalidParamError` for counts or lengths that
    differ."""
    if lidx.shape[0] != ridx.shape[0]:
        raise nixlInvalidParamError(
            f"different number of indices for local ({lidx.shape[0]}), remote ({ridx.shape[0]})"
        )
    lens = local.lens[lidx]
    rlens = remote.lens[ridx]
    diff = np.flatnonzero(lens != rlens)
    if diff.size:
        i = int(diff[0])
        raise nixlInvalidParamError(f"length mismatch at index {i}: local {int(lens[i])}, remote {int(rlens[i])} bytes")
    lreg, loff = local.ridx[lidx], local.offs[lidx]
    rreg, roff = remote.ridx[ridx], remote.offs[ridx]
    keep = lens > 0
    if not keep.all():
        lreg, loff, rreg, roff, lens = lreg[keep], loff[keep], rreg[keep], roff[keep], lens[keep]
    key = lreg * max(len(remote.regions), 1) + rreg
    order = np.argsort(key, kind="stable")
    key, lreg, loff, rreg, roff, lens = key[order], lreg[order], loff[order], rreg[order], roff[order], lens[order]
    subops: List[SubOp] = []
    pieces = 0
    if key.shape[0] == 0:
        return subops, 0
    bounds = np.flatnonzero(np.diff(key)) + 1
    for lo_, hi_ in zip([0] + bounds.tolist(), bounds.tolist() + [key.shape[0]]):
        lo, ro, ln = loff[lo_:hi_], roff[lo_:hi_], lens[lo_:hi_]
        if ln.shape[0] > 1:
            follows = (lo[:-1] + ln[:-1] == lo[1:]) & (ro[:-1] + ln[:-1] == ro[1:])
            starts = np.flatnonzero(np.concatenate(([True], ~follows)))
            lo, ro, ln = lo[starts], ro[starts], np.add.reduceat(ln, starts).astype(np.uint64)
        pieces += int(ln.shape[0])
        subops.append(
            SubOp(local.regions[int(lreg[lo_])], remote.regions[int(rreg[lo_])], lo.copy(), ro.copy(), ln.copy())
        )
    return subops, pieces


class _Posting:
    """The pending of a transfer being posted."""

    def done(self) -> bool:
        return False

    def error(self) -> Optional[BaseException]:
        return None

    def finished_ns(self) -> Optional[int]:
        return None

    def cancel(self) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        return False


POSTING = _Posting()
"""The pending of every transfer between the start of its post and the
engine's answer."""

REPOST_ACTIVE = "the transfer is still in progress: wait for DONE or ERR before posting it again"

_WALL_OFFSET_NS = time.time_ns() - time.monotonic_ns()
"""The wall clock less the monotonic one, taken once: a post's start as
wall-clock time without a second clock read per post."""


class XferReq:
    """One transfer request (``initialize_xfer`` / ``make_prepped_xfer``):
    what it moves, its notification, and its state across posts."""

    def __init__(
        self,
        write: bool,
        agent: str,
        incarnation: int,
        subops: List[SubOp],
        pieces: int,
        notif: bytes,
        lists: Tuple[PreppedList, ...] = (),
    ) -> None:
        self.write = write
        self.agent = agent
        self.incarnation = incarnation
        self.subops = subops
        self.pieces = pieces
        self.total = sum(s.nbytes for s in subops)
        self.notif = notif
        self.framed: List[bytes] = frame(notif) if notif else []
        """The notifications that carry `notif`."""
        self.lists = lists
        self.pending: Optional[PendingLike] = None
        self.failed: Optional[BaseException] = None
        self.released = False
        self.post_ns = 0
        self.post_dur_ns = 0
        self.end_ns: Optional[int] = None
        self.fast: Any = None
        """The engine's prepared transfer that posts itself (see
        ``AgentCore.post``): while it is ``pending``, it tells how the last
        post went, and its times."""
        self.fast_tried = False

    def set_notif(self, notif: bytes) -> None:
        """The notification of this post and the next ones."""
        if notif != self.notif:
            self.notif = notif
            self.framed = frame(notif)

    @property
    def start_us(self) -> int:
        """When the last post began, in microseconds since the epoch (as
        NIXL's telemetry gives it)."""
        return (self.post_ns + _WALL_OFFSET_NS) // 1000

    def posted(self, pending: Optional[PendingLike], failed: Optional[BaseException] = None) -> None:
        """How the post that began at `post_ns` went (the agent's `post`
        sets `pending` to :data:`POSTING` and `post_ns` when it begins)."""
        self.pending = pending
        self.failed = failed
        now = time.monotonic_ns()
        self.post_dur_ns = max(now - self.post_ns, 1000)
        if pending is not None and pending.done():
            self.end_ns = now

    def state(self) -> str:
        """``"DONE"``, ``"PROC"`` or ``"ERR"`` (never posted, or failed)."""
        if self.failed is not None:
            return "ERR"
        p = self.pending
        if p is None:
            return "ERR"
        if not p.done():
            return "PROC"
        if self.end_ns is None and p is not self.fast:
            self.end_ns = p.finished_ns() or time.monotonic_ns()
        return "ERR" if p.error() is not None else "DONE"

    def times(self) -> Tuple[int, int, Optional[int]]:
        """The last post's ``(start, post, transfer)``: when it began
        (microseconds since the epoch), how long posting took and, once it
        has ended, how long it took in all (nanoseconds)."""
        times = getattr(self.fast, "times", None)
        if times is not None and self.pending is self.fast:
            t = times()
            if t is not None:
                return (int(t[0]), int(t[1]), None if t[2] is None else int(t[2]))
        self.state()
        end = None if self.end_ns is None else self.end_ns - self.post_ns
        return self.start_us, self.post_dur_ns, end

    def error(self) -> Optional[BaseException]:
        """Why the last post failed, if it did."""
        if self.failed is not None:
            return self.failed
        p = self.pending
        return p.error() if p is not None and p.done() else None


def rows_of(descs: Union[nixlXferDList, Any]) -> U64:
    """The rows of a transfer descriptor list."""
    if not isinstance(descs, nixlXferDList):
        raise nixlInvalidParamError(f"a transfer descriptor list is a nixlXferDList, not {type(descs).__name__}")
    return descs.rows
