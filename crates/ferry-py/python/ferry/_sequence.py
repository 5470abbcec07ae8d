""":class:`DescriptorSequence`: the descriptors that metadata describes, as a
read-only sequence kept as runs, so that what it costs follows the bytes of
the metadata, not the number of blocks they describe."""

from __future__ import annotations

import bisect
import operator
from typing import (
    Any,
    Callable,
    Iterable,
    Iterator,
    List,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

__all__ = ["DescriptorSequence"]

T = TypeVar("T")

Run = Tuple[str, int, int]
"""``(device, size, count)``: `count` descriptors in a row of one device
(its string, as metadata writes it) and size."""

# A sequence this long or shorter shows its items in its repr.
_REPR_ITEMS = 16


class DescriptorSequence(Sequence[T]):
    """The descriptors of :class:`RdmaMetadata` (``metadata.descriptors``,
    and ``metadata.to_descriptors()`` where there are several), as a
    read-only sequence that reads as a list: ``len()``, indexing (negative
    too), slicing, iteration, ``in``, ``index``, ``count``, ``==`` with a
    list or tuple, ``+`` with a list, unpacking, and as the value of a
    pydantic ``List[...]`` field.

    It keeps the runs the metadata lists (``runs``: each item with how many
    in a row), not one item per block: ``len()``, indexing, ``in``,
    ``index`` and ``count`` cost at most a step per run, slicing gives
    another ``DescriptorSequence``, and an item is made when it is asked
    for. Metadata of 2^20 blocks of one size is one run, however many items
    it has: only code that visits every item (``list(seq)``, a loop) pays
    per block. Where metadata comes from another process, check
    ``metadata.descriptor_count`` (or use ``metadata.descriptor_runs``)
    before visiting each block.

    Items of a run are equal but distinct objects, made on each access.
    """

    __slots__ = ("_runs", "_ends", "_item")

    _runs: Tuple[Run, ...]
    _ends: Tuple[int, ...]
    _item: Callable[[str, int], T]

    def __init__(self, runs: Iterable[Run], item: Callable[[str, int], T]) -> None:
        """`runs` of ``(device, size, count)``; `item` makes the item of a
        run from its device and size. Neighbouring runs of one device and
        size are merged, and empty ones dropped."""
        merged: List[Run] = []
        for device, size, count in runs:
            if count <= 0:
                continue
            if merged and merged[-1][0] == device and merged[-1][1] == size:
                merged[-1] = (device, size, merged[-1][2] + count)
            else:
                merged.append((device, size, count))
        ends: List[int] = []
        total = 0
        for _, _, count in merged:
            total += count
            ends.append(total)
        self._runs = tuple(merged)
        self._ends = tuple(ends)
        self._item = item

    # ---- the runs ----

    @property
    def runs(self) -> List[Tuple[T, int]]:
        """``(item, count)`` per run: `count` items in a row equal to `item`."""
        return [(self._item(device, size), count) for device, size, count in self._runs]

    def _run_at(self, i: int) -> int:
        """The run that holds item `i` (0 <= i < len)."""
        return bisect.bisect_right(self._ends, i)

    # ---- Sequence ----

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> DescriptorSequence[T]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[T, DescriptorSequence[T]]:
        n = len(self)
        if isinstance(index, slice):
            return DescriptorSequence(self._sliced(range(n)[index]), self._item)
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(
                f"DescriptorSequence indices must be integers or slices, not {type(index).__name__}"
            ) from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("DescriptorSequence index out of range")
        device, size, _ = self._runs[self._run_at(i)]
        return self._item(device, size)

    def _sliced(self, selected: range) -> List[Run]:
        """The runs of the items whose indices `selected` holds, in its
        order: a step per run."""
        if selected.step < 0:
            # The same items, the other way round: the runs reversed.
            forward = selected[::-1]
            return list(reversed(self._counted(forward)))
        return self._counted(selected)

    def _counted(self, selected: range) -> List[Run]:
        """The runs of `selected` (a range with a positive step)."""
        out: List[Run] = []
        if not selected:
            return out
        start, stop, step = selected.start, selected.stop, selected.step
        begin = 0
        for (device, size, _), end in zip(self._runs, self._ends):
            lo, hi = max(begin, start), min(end, stop)
            begin = end
            if lo >= hi:
                continue
            # The first selected index at or after lo.
            first = start + -(-(lo - start) // step) * step
            count = len(range(first, hi, step))
            if count:
                out.append((device, size, count))
        return out

    def __iter__(self) -> Iterator[T]:
        for device, size, count in self._runs:
            for _ in range(count):
                yield self._item(device, size)

    def __reversed__(self) -> Iterator[T]:
        for device, size, count in reversed(self._runs):
            for _ in range(count):
                yield self._item(device, size)

    # Items of a run are equal: a step per run answers these.

    def __contains__(self, value: object) -> bool:
        return any(self._item(device, size) == value for device, size, _ in self._runs)

    def count(self, value: Any) -> int:
        return sum(n for device, size, n in self._runs if self._item(device, size) == value)

    def index(self, value: Any, start: int = 0, stop: Any = None) -> int:
        n = len(self)
        lo, hi, _ = slice(start, stop).indices(n)
        begin = 0
        for (device, size, _), end in zip(self._runs, self._ends):
            if max(begin, lo) < min(end, hi) and self._item(device, size) == value:
                return max(begin, lo)
            begin = end
        raise ValueError(f"{value!r} is not in the DescriptorSequence")

    # ---- as a list ----

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DescriptorSequence):
            if len(self._runs) != len(other._runs):
                return False
            return all(
                n == m and self._item(d, s) == other._item(e, t)
                for (d, s, n), (e, t, m) in zip(self._runs, other._runs)
            )
        if isinstance(other, (list, tuple)):
            # As long as the other, which its owner built item by item.
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __add__(self, other: List[Any]) -> List[Any]:
        if not isinstance(other, list):
            return NotImplemented
        return [*self, *other]

    def __radd__(self, other: List[Any]) -> List[Any]:
        if not isinstance(other, list):
            return NotImplemented
        return [*other, *self]

    def __reduce__(self) -> Any:
        return (DescriptorSequence, (self._runs, self._item))

    def __repr__(self) -> str:
        if len(self) <= _REPR_ITEMS:
            return repr(list(self))
        runs = ", ".join(
            f"{n} x {self._item(device, size)!r}" for device, size, n in self._runs[:_REPR_ITEMS]
        )
        more = "" if len(self._runs) <= _REPR_ITEMS else f", ... ({len(self._runs)} runs)"
        return f"DescriptorSequence([{runs}{more}], len={len(self)})"
