"""Byte ranges inside the blocks of a grant, and what a grant's owner
learns of a holder's operation: :class:`BlockRange` and
:class:`NotificationKind`.

A :class:`RemoteGrant`'s :meth:`~RemoteGrant.read_ranges` and
:meth:`~RemoteGrant.write_ranges` move byte ranges of the owner's blocks
(NIXL's ``(addr, len)`` descriptors inside a registered region) from and
into ``(block, offset)`` places of a local :class:`Pool`;
:meth:`~RemoteGrant.notify` sends a notification that moves no byte (NIXL's
``send_notif``). See ``docs/grants.md``, "Byte ranges and bare
notifications".
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Iterable, List, NamedTuple, Sequence, Tuple, Union

__all__ = ["BlockRange", "NotificationKind", "RemoteRanges", "LocalPlaces"]


class NotificationKind(IntEnum):
    """What the holder did: 1 READ, 2 WRITE (equal to
    :class:`OperationKind`'s members of those numbers), 3 MESSAGE (a bare
    notification, :meth:`RemoteGrant.notify`). ``str()`` gives ``"read"``,
    ``"write"`` or ``"message"``."""

    READ = 1
    WRITE = 2
    MESSAGE = 3

    def __str__(self) -> str:
        return self.name.lower()

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class BlockRange(NamedTuple):
    """A byte range inside one block of granted memory: `len` bytes from
    `offset` of `block`. `block` is an index (the block at its generation
    when the transfer starts) or a :class:`BlockRef` /
    ``(index, generation)`` pair (refused if the block was retired since).
    ``offset + len`` must not pass the block's end, and `len` must be at
    least 1."""

    block: Union[int, Tuple[int, int]]
    offset: int
    len: int


RemoteRanges = Iterable[Union[BlockRange, Tuple[Union[int, Tuple[int, int]], int, int]]]
"""The owner's byte ranges a transfer names: :class:`BlockRange`\\ s or
``(block, offset, len)`` tuples."""

LocalPlaces = Iterable[Tuple[int, int]]
"""Where in the local pool each range goes (or comes from): ``(block,
offset)`` pairs, one per remote range, each taking that range's length."""


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"{what} must be an int, not {type(x).__name__}")
    return int(x.__index__())


def _block(b: Any, i: int) -> Union[int, Tuple[int, int]]:
    if isinstance(b, (tuple, list)):
        if len(b) != 2:
            raise TypeError(f"range {i}: a block is an index or an (index, generation) pair")
        return (_int(b[0], f"range {i}'s block index"), _int(b[1], f"range {i}'s generation"))
    return _int(b, f"range {i}'s block")


def _remote_ranges_arg(ranges: RemoteRanges) -> Sequence[Tuple[Union[int, Tuple[int, int]], int, int]]:
    if isinstance(ranges, (str, bytes, bytearray)):
        raise TypeError("remote ranges are (block, offset, len) tuples, not text")
    if isinstance(ranges, BlockRange):
        raise TypeError("remote ranges are a list: pass [block_range], not a BlockRange alone")
    out: List[Tuple[Union[int, Tuple[int, int]], int, int]] = []
    for i, r in enumerate(ranges):
        if not isinstance(r, (tuple, list)) or len(r) != 3:
            raise TypeError(f"range {i} must be a BlockRange or a (block, offset, len) tuple, not {r!r}")
        out.append((_block(r[0], i), _int(r[1], f"range {i}'s offset"), _int(r[2], f"range {i}'s length")))
    return out


def _local_places_arg(places: LocalPlaces) -> List[Tuple[int, int]]:
    if isinstance(places, (str, bytes, bytearray)):
        raise TypeError("local places are (block, offset) tuples, not text")
    out: List[Tuple[int, int]] = []
    for i, p in enumerate(places):
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise TypeError(f"local place {i} must be a (block, offset) tuple, not {p!r}")
        out.append((_int(p[0], f"local place {i}'s block"), _int(p[1], f"local place {i}'s offset")))
    return out
