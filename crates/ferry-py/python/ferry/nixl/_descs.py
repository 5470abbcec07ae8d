"""What ``get_reg_descs`` and ``get_xfer_descs`` take, turned into
descriptor lists as NIXL's agent does: a list of tuples with a memory type
(``"DRAM"``, ``"VRAM"``; 4-tuples ``(addr, len, dev, meta)`` to register,
3-tuples ``(addr, len, dev)`` to transfer), an ``(N, 3)`` integer array
with a memory type, a contiguous ``torch.Tensor`` or a list of them (their
memory type from their device), or a list of the right kind passed along.
What does not fit gives ``None`` (logged), as NIXL's does; an unknown
memory type name is a ``KeyError``.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Type, TypeVar

import numpy as np

from ._dlist import _DList, nixlRegDList, nixlXferDList
from ._status import nixl_mem_t
from .logging import get_logger

__all__ = ["NIXL_MEMS", "to_dlist"]

logger = get_logger(__name__)

NIXL_MEMS: Dict[str, nixl_mem_t] = {
    "DRAM": nixl_mem_t.DRAM_SEG,
    "VRAM": nixl_mem_t.VRAM_SEG,
    "FILE": nixl_mem_t.FILE_SEG,
    "BLOCK": nixl_mem_t.BLK_SEG,
    "OBJ": nixl_mem_t.OBJ_SEG,
    "cpu": nixl_mem_t.DRAM_SEG,  # deprecated names NIXL keeps
    "cuda": nixl_mem_t.VRAM_SEG,
}

L = TypeVar("L", nixlRegDList, nixlXferDList)


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _tensor_row(t: Any) -> Optional[tuple[int, int, int]]:
    if not t.is_contiguous():
        logger.error("Please use a list of contiguous Tensors")
        return None
    dev = t.get_device()
    return (int(t.data_ptr()), int(t.numel() * t.element_size()), 0 if dev == -1 else int(dev))


def _tensor_mem(t: Any) -> nixl_mem_t:
    return nixl_mem_t.DRAM_SEG if t.get_device() == -1 else nixl_mem_t.VRAM_SEG


def to_dlist(cls: Type[L], descs: Any, mem_type: Optional[str]) -> Optional[L]:
    """`descs` as a list of kind `cls` (see the module); ``None`` if they do
    not fit."""
    other: Type[_DList] = nixlXferDList if cls is nixlRegDList else nixlRegDList
    width = 4 if cls is nixlRegDList else 3
    kind = "registration" if cls is nixlRegDList else "transfer"
    if isinstance(descs, cls):
        return descs
    if isinstance(descs, other):
        logger.error("%s list given where a %s list is needed", type(descs).__name__, cls.__name__)
        return None
    if isinstance(descs, np.ndarray):
        if mem_type is None:
            logger.error("Please specify a mem type if not using Tensors")
            return None
        if descs.ndim != 2 or descs.shape[1] != 3:
            logger.error("Nx3 shape required for a descriptor list from a numpy array")
            return None
        return cls(NIXL_MEMS[mem_type], descs)
    if _is_tensor(descs):
        row = _tensor_row(descs)
        if row is None:
            return None
        return cls(_tensor_mem(descs), [row + (("",) if width == 4 else ())])
    if isinstance(descs, (list, tuple)) and descs and _is_tensor(descs[0]):
        device = descs[0].device
        rows = []
        for t in descs:
            if not _is_tensor(t) or t.device != device:
                return None
            row = _tensor_row(t)
            if row is None:
                return None
            rows.append(row)
        return cls(_tensor_mem(descs[0]), np.array(rows, dtype=np.uint64).reshape(-1, 3))
    if isinstance(descs, (list, tuple)) and descs and isinstance(descs[0], tuple):
        if mem_type is None:
            logger.error("Please specify a mem type if not using Tensors")
            return None
        if len(descs[0]) != width:
            logger.error("%d-tuple list needed for a %s descriptor list", width, kind)
            return None
        return cls(NIXL_MEMS[mem_type], list(descs))
    return None
