"""An agent's metadata: what ``get_agent_metadata`` gives and
``add_remote_agent`` takes.

``FERRYNIXL1\\n`` then JSON: the agent's ``name``, its ``mailbox`` offer (the
connection info: where notifications go; absent from partial metadata
without it) and, per registered region, its address, length, device id,
memory type and ``offer`` (the JSON of Ferry's offer over it, which a peer
claims to read and write it). Offers are capabilities: treat the metadata
as NIXL's, which carries UCX's remote keys, as a secret of the deployment.

Parsing is total: anything else raises :class:`nixlMismatchError`, as NIXL
does for metadata it cannot read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Optional

from ._status import nixl_mem_t, nixlMismatchError

__all__ = ["RegionInfo", "AgentInfo", "encode", "decode", "MAGIC"]

MAGIC = b"FERRYNIXL1\n"
_MAX_REGIONS = 1 << 16
_MAX_NAME = 256
_MAX_OFFER = 4096


@dataclass(frozen=True)
class RegionInfo:
    """One registered region in metadata."""

    addr: int
    length: int
    dev: int
    mem: nixl_mem_t
    offer: str


@dataclass(frozen=True)
class AgentInfo:
    """An agent's metadata, parsed."""

    name: str
    mailbox: Optional[str]
    regions: List[RegionInfo]


def encode(info: AgentInfo) -> bytes:
    """The metadata's bytes."""
    body = {
        "name": info.name,
        "mailbox": info.mailbox,
        "regions": [
            {"addr": r.addr, "len": r.length, "dev": r.dev, "mem": int(r.mem), "offer": r.offer}
            for r in info.regions
        ],
    }
    return MAGIC + json.dumps(body, separators=(",", ":")).encode()


def _bad(why: str) -> nixlMismatchError:
    return nixlMismatchError(f"not a ferry.nixl agent's metadata: {why}")


def _u64(d: Any, key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
        raise _bad(f"a region's {key!r} is not a 64-bit unsigned int")
    return v


def _offer(v: Any, what: str) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= _MAX_OFFER:
        raise _bad(f"{what} is not an offer's JSON")
    return v


def decode(data: Any) -> AgentInfo:
    """Parses metadata; :class:`nixlMismatchError` if it is not an
    agent's."""
    if isinstance(data, str):
        data = data.encode("latin-1", "replace")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"agent metadata is bytes, not {type(data).__name__}")
    raw = bytes(data)
    if not raw.startswith(MAGIC):
        raise _bad("it does not start with the ferry.nixl tag (is it NIXL's own?)")
    try:
        body = json.loads(raw[len(MAGIC) :])
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(f"bad JSON ({e})") from None
    if not isinstance(body, dict):
        raise _bad("not a JSON object")
    name = body.get("name")
    if not isinstance(name, str) or not 0 < len(name.encode()) <= _MAX_NAME:
        raise _bad("no agent name (or one over 256 bytes)")
    mailbox = body.get("mailbox")
    if mailbox is not None:
        mailbox = _offer(mailbox, "the mailbox")
    regions_raw = body.get("regions")
    if not isinstance(regions_raw, list) or len(regions_raw) > _MAX_REGIONS:
        raise _bad("no region list (or one too long)")
    regions = []
    for r in regions_raw:
        if not isinstance(r, dict):
            raise _bad("a region is not a JSON object")
        mem = _u64(r, "mem")
        if mem not in (nixl_mem_t.DRAM_SEG, nixl_mem_t.VRAM_SEG):
            raise _bad(f"a region of memory type {mem}")
        addr, length = _u64(r, "addr"), _u64(r, "len")
        if length == 0 or addr + length > 1 << 64:
            raise _bad("a region that is empty or wraps around")
        regions.append(RegionInfo(addr, length, _u64(r, "dev"), nixl_mem_t(mem), _offer(r.get("offer"), "a region's offer")))
    return AgentInfo(name, mailbox, regions)
