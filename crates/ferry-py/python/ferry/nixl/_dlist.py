"""NIXL's descriptor lists: :class:`nixlXferDList` (``(addr, len, dev)``
per descriptor: what a transfer names), :class:`nixlRegDList` (``(addr,
len, dev, meta)``: what registration takes; :meth:`nixlRegDList.trim`
gives its transfer list), :class:`nixlRemoteDList` (``(addr, len, dev,
agent)``), and :class:`nixlXferTelemetry`.

The descriptors are kept in one ``(N, 3)`` ``uint64`` NumPy array, so that a
list of many thousand blocks costs no Python object per block, and is read
in one go by the agent. As NIXL's, a list compares equal to another of the
same kind, memory type and descriptors, pickles (:meth:`nixl_agent.
get_serialized_descs`), and is truthy even when empty (``if not descs``
tests for a ``None`` from ``get_xfer_descs``). Unlike NIXL's, an index out
of range raises ``IndexError`` (NIXL's returns whatever lies past the end),
and ``len()`` and iteration work.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from ._status import nixl_mem_t, nixlNotFoundError

__all__ = ["nixlXferDList", "nixlRegDList", "nixlRemoteDList", "nixlXferTelemetry", "mem_arg", "loads"]

_U64 = 1 << 64


def mem_arg(mem: Any) -> nixl_mem_t:
    """`mem` as a :class:`nixl_mem_t` (an int of one is taken too)."""
    if isinstance(mem, nixl_mem_t):
        return mem
    if isinstance(mem, int) and not isinstance(mem, bool):
        try:
            return nixl_mem_t(mem)
        except ValueError:
            pass
    raise TypeError(f"a memory type must be a nixl_mem_t (e.g. DRAM_SEG), not {mem!r}")


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"a descriptor's {what} must be an int, not {type(x).__name__}")
    v = int(x.__index__())
    if not 0 <= v < _U64:
        raise ValueError(f"a descriptor's {what} must be in [0, 2**64), not {v}")
    return v


def _meta(x: Any) -> bytes:
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    raise TypeError(f"a registration descriptor's meta info must be str or bytes, not {type(x).__name__}")


def _check_tuple(t: Any, n: int, kind: str) -> Sequence[Any]:
    if not isinstance(t, (tuple, list)) or len(t) < n:
        got = f"{len(t)}-tuple" if isinstance(t, (tuple, list)) else type(t).__name__
        raise IndexError(f"tuple index out of range: a {kind} descriptor is a {n}-tuple, not a {got}")
    return t


class _DList:
    """What the three lists share: the memory type and an ``(N, 3)`` array
    of ``(addr, len, dev)``."""

    __slots__ = ("_mem", "_rows")
    _mem: nixl_mem_t
    _rows: npt.NDArray[np.uint64]
    _width = 3
    _kind = "transfer"

    def __init__(self, type: Any, descs: Any = 0) -> None:  # noqa: A002 (NIXL's name)
        self._mem = mem_arg(type)
        self._rows = np.zeros((0, 3), dtype=np.uint64)
        self._init_extra()
        if isinstance(descs, bool):
            raise TypeError("descs must be a list of tuples, an (N, 3) array or a count")
        if isinstance(descs, int):
            if descs < 0:
                raise ValueError(f"a list of {descs} descriptors")
            self._rows = np.zeros((descs, 3), dtype=np.uint64)
            self._pad(descs)
        elif isinstance(descs, np.ndarray):
            self._set_array(descs)
        else:
            for d in descs:
                self.addDesc(d)

    def _init_extra(self) -> None:
        pass

    def _pad(self, n: int) -> None:
        pass

    def _set_array(self, a: npt.NDArray[Any]) -> None:
        if a.ndim != 2 or a.shape[1] != 3:
            raise ValueError(f"a descriptor array is (N, 3): (addr, len, dev) per row, not {a.shape}")
        if a.dtype.kind not in "iu":
            raise TypeError(f"a descriptor array holds integers, not {a.dtype}")
        if a.dtype.kind == "i" and a.size and int(a.min()) < 0:
            raise ValueError("a descriptor array holds no negative values")
        self._rows = np.ascontiguousarray(a, dtype=np.uint64).copy()
        self._pad(len(self._rows))

    # ---- NIXL's methods ----

    def getType(self) -> nixl_mem_t:
        """The list's memory type."""
        return self._mem

    def descCount(self) -> int:
        """How many descriptors."""
        return int(self._rows.shape[0])

    def isEmpty(self) -> bool:
        """Whether it has none."""
        return bool(self._rows.shape[0] == 0)

    def clear(self) -> None:
        """Removes every descriptor."""
        self._rows = np.zeros((0, 3), dtype=np.uint64)
        self._init_extra()

    def remDesc(self, index: int) -> None:
        """Removes descriptor `index`."""
        i = self._index(index)
        self._rows = np.delete(self._rows, i, axis=0)
        self._remove_extra(i)

    def _remove_extra(self, i: int) -> None:
        pass

    def addDesc(self, desc: Any) -> None:
        """Appends a descriptor (a tuple of the list's kind)."""
        t = _check_tuple(desc, self._width, self._kind)
        row = np.array([[_int(t[0], "address"), _int(t[1], "length"), _int(t[2], "device id")]], dtype=np.uint64)
        self._add_extra(t)
        self._rows = np.concatenate([self._rows, row])

    def _add_extra(self, t: Sequence[Any]) -> None:
        pass

    append = addDesc

    def index(self, desc: Any) -> int:
        """The index of the first descriptor equal to `desc`;
        :class:`nixlNotFoundError` if there is none."""
        want = self._normal(desc)
        for i in range(self.descCount()):
            if self[i] == want:
                return i
        raise nixlNotFoundError(f"no descriptor {want!r} in the list")

    def _normal(self, desc: Any) -> Tuple[Any, ...]:
        t = _check_tuple(desc, self._width, self._kind)
        head = (_int(t[0], "address"), _int(t[1], "length"), _int(t[2], "device id"))
        return head + ((_meta(t[3]),) if self._width == 4 else ())

    def print(self) -> None:
        """Prints the list (NIXL prints it to standard output too)."""
        print(f"DescList of mem type {int(self._mem)}")
        for i in range(self.descCount()):
            print(f"  {self[i]}")

    def _index(self, index: Any) -> int:
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(f"a descriptor index is an int, not {type(index).__name__}")
        i = int(index.__index__())
        n = self.descCount()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"descriptor index {index} is out of range: the list has {n}")
        return i

    def _row(self, i: int) -> Tuple[int, int, int]:
        r = self._rows[i]
        return (int(r[0]), int(r[1]), int(r[2]))

    def __getitem__(self, index: int) -> Tuple[Any, ...]:
        return self._row(self._index(index))

    def __setitem__(self, index: int, desc: Any) -> None:
        i = self._index(index)
        t = _check_tuple(desc, self._width, self._kind)
        self._rows[i] = (_int(t[0], "address"), _int(t[1], "length"), _int(t[2], "device id"))
        self._set_extra(i, t)

    def _set_extra(self, i: int, t: Sequence[Any]) -> None:
        pass

    def __len__(self) -> int:
        return self.descCount()

    def __bool__(self) -> bool:
        # As NIXL's: a list is truthy, empty or not.
        return True

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        for i in range(self.descCount()):
            yield self[i]

    def __contains__(self, desc: object) -> bool:
        try:
            want = self._normal(desc)
        except (TypeError, ValueError, IndexError):
            return False
        return any(d == want for d in self)

    def _extra_state(self) -> Any:
        return None

    def _same_extra(self, other: Any) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return False
        assert isinstance(other, _DList)
        return (
            self._mem == other._mem
            and bool(np.array_equal(self._rows, other._rows))
            and self._same_extra(other)
        )

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self).__name__, int(self._mem), self._rows.tobytes(), self._extra_state()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._mem}, {self.descCount()} descriptors)"

    @property
    def rows(self) -> npt.NDArray[np.uint64]:
        """The descriptors as an ``(N, 3)`` ``uint64`` array (``addr, len,
        dev``); Ferry's, read-only."""
        v = self._rows.view()
        v.flags.writeable = False
        return v


class nixlXferDList(_DList):
    """A transfer descriptor list: ``(addr, len, dev)`` per descriptor.

    ``nixlXferDList(mem_type)``, ``nixlXferDList(mem_type, count)``,
    ``nixlXferDList(mem_type, [(addr, len, dev), ...])`` or
    ``nixlXferDList(mem_type, array)`` with an ``(N, 3)`` integer array.
    """

    __slots__ = ()

    def __getitem__(self, index: int) -> Tuple[int, int, int]:
        return self._row(self._index(index))


class nixlRegDList(_DList):
    """A registration descriptor list: ``(addr, len, dev, meta)`` per
    descriptor (``meta`` comes back as bytes); from an ``(N, 3)`` array each
    gets an empty ``meta``. :meth:`trim` gives the transfer list of the
    same memory."""

    __slots__ = ("_metas",)
    _metas: List[bytes]
    _width = 4
    _kind = "registration"

    def _init_extra(self) -> None:
        self._metas = []

    def _pad(self, n: int) -> None:
        self._metas = [b""] * n

    def _remove_extra(self, i: int) -> None:
        del self._metas[i]

    def _add_extra(self, t: Sequence[Any]) -> None:
        self._metas.append(_meta(t[3]))

    def _set_extra(self, i: int, t: Sequence[Any]) -> None:
        self._metas[i] = _meta(t[3])

    def _extra_state(self) -> Any:
        return list(self._metas)

    def _same_extra(self, other: Any) -> bool:
        return bool(self._metas == other._metas)

    def __getitem__(self, index: int) -> Tuple[int, int, int, bytes]:
        i = self._index(index)
        a, n, d = self._row(i)
        return (a, n, d, self._metas[i])

    def trim(self) -> nixlXferDList:
        """The transfer descriptor list of the same memory (no meta)."""
        out = nixlXferDList(self._mem)
        out._rows = self._rows.copy()
        return out


class nixlRemoteDList(_DList):
    """A remote descriptor list: ``(addr, len, dev, agent)`` per
    descriptor, as NIXL's ``get_remote_descs`` takes for memory views
    (which Ferry does not have: it is kept for the name)."""

    __slots__ = ("_agents",)
    _agents: List[bytes]
    _width = 4
    _kind = "remote"

    def _init_extra(self) -> None:
        self._agents = []

    def _pad(self, n: int) -> None:
        self._agents = [b""] * n

    def _remove_extra(self, i: int) -> None:
        del self._agents[i]

    def _add_extra(self, t: Sequence[Any]) -> None:
        self._agents.append(_meta(t[3]))

    def _set_extra(self, i: int, t: Sequence[Any]) -> None:
        self._agents[i] = _meta(t[3])

    def _extra_state(self) -> Any:
        return list(self._agents)

    def _same_extra(self, other: Any) -> bool:
        return bool(self._agents == other._agents)

    def __getitem__(self, index: int) -> Tuple[int, int, int, bytes]:
        i = self._index(index)
        a, n, d = self._row(i)
        return (a, n, d, self._agents[i])


_KINDS = {c.__name__: c for c in (nixlXferDList, nixlRegDList, nixlRemoteDList)}


def _rebuild(kind: str, mem: int, rows: bytes, extra: Optional[List[bytes]]) -> _DList:
    cls = _KINDS.get(kind)
    if cls is None or not isinstance(rows, bytes) or len(rows) % 24:
        raise ValueError("not a serialized NIXL descriptor list")
    out = cls(mem_arg(mem))
    out._rows = np.frombuffer(rows, dtype=np.uint64).reshape(-1, 3).copy()
    if isinstance(out, nixlRegDList):
        out._metas = [_meta(m) for m in (extra or [])]
        if len(out._metas) != out.descCount():
            raise ValueError("not a serialized NIXL descriptor list")
    elif isinstance(out, nixlRemoteDList):
        out._agents = [_meta(m) for m in (extra or [])]
        if len(out._agents) != out.descCount():
            raise ValueError("not a serialized NIXL descriptor list")
    return out


class _ListUnpickler(pickle.Unpickler):
    """Unpickles descriptor lists and nothing else: serialized lists come
    from other processes, and a pickle may name any callable."""

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_rebuild":
            return _rebuild
        raise pickle.UnpicklingError(f"not a ferry.nixl descriptor list (it names {module}.{name})")


def loads(data: bytes) -> Any:
    """A descriptor list from :meth:`nixl_agent.get_serialized_descs`
    (``pickle.UnpicklingError`` for anything else)."""
    return _ListUnpickler(io.BytesIO(data)).load()


class nixlXferTelemetry:
    """What :meth:`nixl_agent.get_xfer_telemetry` returns: ``startTime``
    (microseconds since the epoch at the post), ``postDuration`` (the post
    call's, in microseconds), ``xferDuration`` (post to completion, in
    microseconds), ``totalBytes`` and ``descCount`` (descriptors after
    merging those that follow each other on both sides)."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount")

    def __init__(self) -> None:
        self.startTime = 0
        self.postDuration = 0
        self.xferDuration = 0
        self.totalBytes = 0
        self.descCount = 0

    def __repr__(self) -> str:
        return (
            f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
            f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, descCount={self.descCount})"
        )


DescsLike = Union[_DList, Sequence[Any], npt.NDArray[Any]]
