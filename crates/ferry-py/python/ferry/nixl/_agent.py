"""The agent's state and its rules, behind :class:`ferry.nixl.nixl_agent`:
registered regions and their offers, remote agents and their claimed
offers, prepared lists and transfer requests by handle, notifications.
Thread safe: NIXL's agents are used from several threads (vLLM's handshake
thread and its engine's), so every change is made under one lock, which is
never held across a claim or a wait.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ._dlist import nixlRegDList, nixlXferDList
from ._engine import DONE, Done, Engine, GrantLike, LocalRegion, OfferLike, PendingLike, RemoteRegion
from ._meta import AgentInfo, RegionInfo, decode, encode
from ._notify import Inbox, frame
from ._status import (
    nixl_mem_t,
    nixlBackendError,
    nixlInvalidParamError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotSupportedError,
    nixlRepostActiveError,
)
from ._xfer import POSTING, REPOST_ACTIVE, PreppedList, XferReq, indices_arg, locate, plan

__all__ = ["AgentCore", "RemoteAgent", "name_arg"]

_INCARNATIONS = itertools.count(1)
_IDS = itertools.count(1)
RELEASE_WAIT = 2.0
"""Seconds a release or deregistration waits for a transfer in flight."""


def name_arg(name: Union[str, bytes]) -> str:
    """An agent name (NIXL takes ``str`` or ``bytes``)."""
    if isinstance(name, (bytes, bytearray)):
        return bytes(name).decode()
    if isinstance(name, str):
        return name
    raise TypeError(f"an agent name is str or bytes, not {type(name).__name__}")


@dataclass(eq=False)
class RemoteAgent:
    """A remote agent added from its metadata."""

    name: str
    incarnation: int
    regions: List[RemoteRegion] = field(default_factory=list)
    mailbox_json: Optional[str] = None
    mailbox: Optional[GrantLike] = None
    gate: Any = None
    """The engine's gate, closed when the agent is removed."""


class AgentCore:
    """See the module."""

    def __init__(self, name: str, engine: Engine, telemetry: bool) -> None:
        self.name = name
        self.engine = engine
        self.telemetry = telemetry
        # What the engine may have besides the protocol: gates and prepared
        # transfers that post themselves (the hot path of `post`).
        self._new_gate: Any = getattr(engine, "gate", None)
        self._new_fast: Any = getattr(engine, "fast", None)
        self._new_group: Any = getattr(engine, "fast_group", None)
        self.lock = threading.RLock()
        # Draining is one thread at a time: the parts of a long message
        # must reach the inbox in the order they were taken.
        self._drain_lock = threading.Lock()
        self.local: List[LocalRegion] = []
        self.remotes: Dict[str, RemoteAgent] = {}
        self.dlists: Dict[int, PreppedList] = {}
        self.xfers: Dict[int, XferReq] = {}
        self.inbox = Inbox()
        self.closed = False
        # The mailbox: a small region of the agent's own, offered so that
        # peers can send notifications with no region of theirs named.
        self._mail_mem = (ctypes.c_char * 64)()
        self.mailbox = LocalRegion(ctypes.addressof(self._mail_mem), 64, 0, nixl_mem_t.DRAM_SEG)
        self.mailbox.offer = self._offer(self.mailbox)

    def _offer(self, region: LocalRegion) -> OfferLike:
        try:
            return self.engine.offer(region)
        except Exception as e:
            raise nixlBackendError(f"cannot offer {region.length} bytes at {region.addr:#x}: {e}") from e

    # ---- registration ----

    def register(self, reg: nixlRegDList) -> None:
        rows = reg.rows
        mem = reg.getType()
        if mem not in (nixl_mem_t.DRAM_SEG, nixl_mem_t.VRAM_SEG):
            raise nixlNotSupportedError(f"Ferry registers host (DRAM) and GPU (VRAM) memory, not {mem.name}")
        made: List[LocalRegion] = []
        try:
            for a, n, d in rows.tolist():
                if n == 0 or a == 0:
                    raise nixlInvalidParamError(f"cannot register {n} bytes at {a:#x}")
                with self.lock:
                    same = self._find_local(a, n, d, mem)
                    if same is not None:
                        same.refs += 1
                        continue
                region = LocalRegion(a, n, d, mem)
                region.gate = self._gate()
                region.offer = self._offer(region)
                with self.lock:
                    self.local.append(region)
                made.append(region)
        except BaseException:
            for r in made:
                self._retire(r)
            raise

    def _find_local(self, a: int, n: int, d: int, mem: nixl_mem_t) -> Optional[LocalRegion]:
        for r in self.local:
            if r.live and (r.addr, r.length, r.mem) == (a, n, mem) and (mem == nixl_mem_t.DRAM_SEG or r.dev == d):
                return r
        return None

    def deregister(self, reg: nixlRegDList) -> None:
        mem = reg.getType()
        with self.lock:
            found = []
            for a, n, d in reg.rows.tolist():
                r = self._find_local(a, n, d, mem)
                if r is None:
                    raise nixlNotFoundError(f"{n} bytes at {a:#x} ({mem.name}) are not registered by agent {self.name!r}")
                found.append(r)
        for r in found:
            with self.lock:
                r.refs -= 1
                if r.refs > 0:
                    continue
            self._retire(r)

    def _gate(self) -> Any:
        return self._new_gate() if self._new_gate is not None else None

    def _retire(self, r: LocalRegion) -> None:
        """Waits for this agent's transfers in flight that use `r` (at most
        :data:`RELEASE_WAIT`), then revokes its offer: after that no peer's
        byte moves in or out of it."""
        # No prepared transfer's post starts from here on (then wait for
        # the last ones): if the wait fails they go the slow way, which
        # still sees the region live.
        _close(r.gate)
        for p in list(r.users) + list(r.fast):
            if not p.wait(RELEASE_WAIT):
                with self.lock:
                    r.refs += 1
                raise nixlNotAllowedError(
                    f"a transfer of agent {self.name!r} using {r.length} bytes at {r.addr:#x} is still in flight "
                    f"after {RELEASE_WAIT} s: release its handle first"
                )
        with self.lock:
            r.users.clear()
            r.fast.clear()
            r.live = False
            if r in self.local:
                self.local.remove(r)
        if r.offer is not None:
            self._drain(r.offer)
            try:
                r.offer.revoke()
            except Exception as e:
                raise nixlBackendError(f"revoking the offer of {r.length} bytes at {r.addr:#x}: {e}") from e

    # ---- metadata ----

    def _region_info(self, r: LocalRegion) -> RegionInfo:
        assert r.offer is not None
        return RegionInfo(r.addr, r.length, r.dev, r.mem, r.offer.metadata())

    def metadata(self, regions: Optional[List[LocalRegion]] = None, conn: bool = True) -> bytes:
        with self.lock:
            chosen = [r for r in self.local if r.live] if regions is None else regions
            mailbox = self.mailbox.offer.metadata() if conn and self.mailbox.offer is not None else None
            return encode(AgentInfo(self.name, mailbox, [self._region_info(r) for r in chosen]))

    def partial_metadata(self, descs: nixlRegDList, conn: bool) -> bytes:
        with self.lock:
            regions, ridx, _ = locate(self.local, descs.rows, descs.getType(), f"agent {self.name!r}")
            chosen = [regions[i] for i in sorted(set(ridx.tolist()))]
        return self.metadata(chosen, conn)

    def load(self, md: bytes) -> bytes:
        info = decode(md)
        if info.name == self.name:
            raise nixlInvalidParamError("remote agent name same as local agent, no need to load metadata")
        with self.lock:
            known = self.remotes.get(info.name)
            have = {r.offer_json for r in known.regions} if known is not None else set()
            have_mail = known.mailbox_json if known is not None else None
        claimed: Dict[str, GrantLike] = {}
        try:
            for r in info.regions:
                if r.offer not in have and r.offer not in claimed:
                    claimed[r.offer] = self._claim(info.name, r.offer)
            mail = None
            if info.mailbox is not None and info.mailbox != have_mail:
                mail = self._claim(info.name, info.mailbox)
        except BaseException:
            for g in claimed.values():
                g.close()
            raise
        with self.lock:
            ra = self.remotes.get(info.name)
            if ra is None:
                ra = RemoteAgent(info.name, next(_INCARNATIONS))
                ra.gate = self._gate()
                self.remotes[info.name] = ra
            for r in info.regions:
                grant = claimed.get(r.offer)
                if grant is None:
                    continue
                for old in ra.regions:
                    if (old.addr, old.length, old.mem, old.dev) == (r.addr, r.length, r.mem, r.dev):
                        old.live = False
                        _close(old.gate)
                        if old.grant is not None:
                            old.grant.close()
                ra.regions = [x for x in ra.regions if x.live]
                ra.regions.append(
                    RemoteRegion(info.name, r.addr, r.length, r.dev, r.mem, r.offer, grant, gate=self._gate())
                )
            if mail is not None:
                if ra.mailbox is not None:
                    ra.mailbox.close()
                ra.mailbox, ra.mailbox_json = mail, info.mailbox
        return info.name.encode()

    def _claim(self, agent: str, offer_json: str) -> GrantLike:
        try:
            return self.engine.claim(offer_json)
        except Exception as e:
            raise nixlBackendError(f"cannot claim an offer of agent {agent!r}: {e}") from e

    def remove(self, name: str) -> None:
        with self.lock:
            ra = self.remotes.pop(name, None)
        if ra is None:
            return
        _close(ra.gate)
        for r in ra.regions:
            r.live = False
            _close(r.gate)
            if r.grant is not None:
                r.grant.close()
        if ra.mailbox is not None:
            ra.mailbox.close()

    def check_remote(self, name: str, descs: Optional[nixlXferDList]) -> bool:
        with self.lock:
            ra = self.remotes.get(name)
            if ra is None:
                return False
            if descs is None or descs.isEmpty():
                return True
            try:
                locate(ra.regions, descs.rows, descs.getType(), f"agent {name!r}")
            except nixlNotFoundError:
                return False
            return True

    # ---- prepared lists and transfers ----

    def prep(self, agent: Optional[str], descs: nixlXferDList) -> int:
        rows, mem = descs.rows, descs.getType()
        with self.lock:
            if agent is None:
                regions, ridx, offs = locate(self.local, rows, mem, f"agent {self.name!r}")
                pl = PreppedList(None, 0, mem, list(regions), ridx, offs, rows[:, 1].copy())
            elif agent == self.name:
                lregions, ridx, offs = locate(self.local, rows, mem, f"agent {self.name!r}")
                pl = PreppedList(agent, 0, mem, list(lregions), ridx, offs, rows[:, 1].copy())
            else:
                ra = self._remote(agent)
                rregions, ridx, offs = locate(ra.regions, rows, mem, f"agent {agent!r}")
                pl = PreppedList(agent, ra.incarnation, mem, list(rregions), ridx, offs, rows[:, 1].copy())
            i = next(_IDS)
            self.dlists[i] = pl
            return i

    def _remote(self, agent: str) -> RemoteAgent:
        ra = self.remotes.get(agent)
        if ra is None:
            raise nixlNotFoundError(f"metadata for remote agent {agent!r} not found (add_remote_agent first)")
        return ra

    def release_dlist(self, i: int) -> None:
        with self.lock:
            pl = self.dlists.pop(i, None)
            if pl is not None:
                pl.released = True

    def make(self, write: bool, lh: int, lidx: object, rh: int, ridx: object, notif: bytes) -> int:
        with self.lock:
            local, remote = self.dlists.get(lh), self.dlists.get(rh)
            if local is None or remote is None or local.agent is not None or remote.agent is None:
                raise nixlInvalidParamError("invalid sides (local must be local, remote must be remote)")
            li = indices_arg(lidx, local.count, "local")
            ri = indices_arg(ridx, remote.count, "remote")
            return self._make(write, local, li, remote, ri, notif)

    def _make(self, write: bool, local: PreppedList, li: np.ndarray, remote: PreppedList, ri: np.ndarray, notif: bytes) -> int:
        assert remote.agent is not None
        if remote.agent != self.name:
            ra = self._remote(remote.agent)
            if ra.incarnation != remote.incarnation:
                raise nixlNotFoundError(f"remote agent {remote.agent!r} was removed or added again since the list was prepared")
        subops, pieces = plan(write, local, li, remote, ri)
        req = XferReq(write, remote.agent, remote.incarnation, subops, pieces, notif, (local, remote))
        i = next(_IDS)
        self.xfers[i] = req
        return i

    def initialize(self, write: bool, local: nixlXferDList, remote: nixlXferDList, agent: str, notif: bytes) -> int:
        lh = self.prep(None, local)
        try:
            rh = self.prep(agent, remote)
        except BaseException:
            self.release_dlist(lh)
            raise
        with self.lock:
            lpl, rpl = self.dlists.pop(lh), self.dlists.pop(rh)
            n = lpl.count
            if rpl.count != n:
                raise nixlInvalidParamError(f"different descriptor list sizes (local={n}, remote={rpl.count})")
            idx = np.arange(n, dtype=np.int64)
            return self._make(write, lpl, idx, rpl, idx, notif)

    def req(self, i: int) -> XferReq:
        # (One dict lookup: atomic under the GIL, no lock needed.)
        r = self.xfers.get(i)
        if r is None:
            raise nixlInvalidParamError("the transfer handle was released")
        return r

    def post(self, i: int, notif: Optional[bytes]) -> str:
        # NIXL's model re-posts one prepared transfer again and again: this
        # is its hot path, with XferReq's begin() and posted() written out.
        req = self.xfers.get(i)
        if req is None:
            raise nixlInvalidParamError("the transfer handle was released")
        fast = req.fast
        if fast is None and not req.fast_tried:
            fast = self._make_fast(req)
        if fast is not None:
            if notif:
                req.set_notif(notif)
            framed = req.framed
            group = len(req.subops) > 1
            if group or len(framed) <= 1:
                p = req.pending
                if p is not fast:
                    if p is not None and not p.done():
                        raise nixlRepostActiveError(REPOST_ACTIVE)
                    req.pending, req.failed = fast, None
                # A group sends the notification's pieces after its parts,
                # through the agent's mailbox; one part carries its one.
                code = fast.post(framed) if group else fast.post(framed[0] if framed else None)
                if code == 0:
                    return "DONE"
                if code == 1:
                    return "PROC"
                if code == 2:
                    return "ERR"
                if code == 3:
                    raise nixlRepostActiveError(REPOST_ACTIVE)
                # 4: something it names is gone: the general path says what.
        with self.lock:
            p = req.pending
            if p is not None and not p.done():
                raise nixlRepostActiveError(REPOST_ACTIVE)
            if notif:
                req.set_notif(notif)
            # In progress from here (a post from another thread meanwhile
            # is a repost of an active transfer).
            req.pending = POSTING
            req.failed = None
            req.end_ns = None
            req.post_ns = start = time.monotonic_ns()
            try:
                mailbox = self._check_live(req)
            except nixlNotFoundError as e:
                req.posted(None, e)
                raise
        if req.agent == self.name:
            pending: PendingLike = self._loopback(req)
        else:
            try:
                pending = self.engine.post(req.write, req.subops, req.framed, mailbox)
            except Exception as e:
                err = nixlBackendError(f"posting the transfer failed: {e}")
                err.__cause__ = e
                pending = Done(err)
        req.pending = pending
        now = time.monotonic_ns()
        req.post_dur_ns = max(now - start, 1000)
        if pending is DONE:
            req.end_ns = now
            return "DONE"
        if pending.done():
            req.end_ns = now
            return "DONE" if pending.error() is None else "ERR"
        with self.lock:
            for s in req.subops:
                s.local.users[:] = [p for p in s.local.users if not p.done()]
                s.local.users.append(pending)
        return req.state()

    def _make_fast(self, req: XferReq) -> Any:
        """The engine's prepared transfer for `req`, which posts itself (a
        transfer with a remote agent, every region and the agent gated: one
        sub-operation, or a group of them with the agent's mailbox), or
        ``None``; tried once per transfer."""
        req.fast_tried = True
        subs = req.subops
        if req.agent == self.name or not subs:
            return None
        make = self._new_fast if len(subs) == 1 else self._new_group
        if make is None:
            return None
        with self.lock:
            ra = self.remotes.get(req.agent)
            if ra is None or ra.incarnation != req.incarnation:
                return None
            gates = [ra.gate] + [g for s in subs for g in (s.local.gate, s.remote.gate)]
            mailbox = ra.mailbox
        if any(g is None for g in gates) or (len(subs) > 1 and mailbox is None):
            return None
        try:
            if len(subs) == 1:
                fast = make(req.write, subs[0], gates)
            else:
                fast = make(req.write, subs, gates, mailbox)
        except Exception:
            return None
        if fast is not None:
            with self.lock:
                for s in subs:
                    if fast not in s.local.fast:
                        s.local.fast.append(fast)
            req.fast = fast
        return fast

    def _check_live(self, req: XferReq) -> Optional[GrantLike]:
        mailbox = None
        if req.agent != self.name:
            ra = self.remotes.get(req.agent)
            if ra is None or ra.incarnation != req.incarnation:
                raise nixlNotFoundError(
                    f"remote agent {req.agent!r} was removed (or added again) after the transfer was made; "
                    "not posting a stale handle"
                )
            mailbox = ra.mailbox
            if req.notif and mailbox is None and (len(req.subops) != 1 or len(req.framed) > 1):
                raise nixlNotFoundError(f"no connection info for agent {req.agent!r}: its metadata had none")
        for s in req.subops:
            if not s.local.live:
                raise nixlNotFoundError(f"the local region at {s.local.addr:#x} was deregistered")
            if not s.remote.live:
                raise nixlNotFoundError(f"the region at {s.remote.addr:#x} of agent {req.agent!r} is gone")
        return mailbox

    def _loopback(self, req: XferReq) -> PendingLike:
        for s in req.subops:
            if s.local.mem != nixl_mem_t.DRAM_SEG:
                return Done(nixlNotSupportedError("a loopback transfer moves host (DRAM) memory only"))
            for lo, ro, n in zip(s.local_off.tolist(), s.remote_off.tolist(), s.lens.tolist()):
                la, ra_ = s.local.addr + lo, s.remote.addr + ro
                src, dst = (la, ra_) if req.write else (ra_, la)
                ctypes.memmove(dst, src, n)
        if req.notif:
            self.inbox.put_local(self.name, req.notif)
        return Done()

    def release_xfer(self, i: int) -> None:
        with self.lock:
            req = self.xfers.get(i)
        if req is None:
            return
        p = req.pending
        if p is not None and not p.done():
            p.cancel()
            if not p.wait(RELEASE_WAIT):
                raise nixlBackendError(
                    f"the transfer is still in flight after {RELEASE_WAIT} s and could not be cancelled; "
                    "the handle is kept"
                )
        with self.lock:
            self.xfers.pop(i, None)
            req.released = True
            if req.fast is not None:
                # (Its last post has ended: nothing left to wait for.)
                for s in req.subops:
                    s.local.fast[:] = [f for f in s.local.fast if f is not req.fast]

    # ---- notifications ----

    def _drain(self, offer: OfferLike) -> None:
        with self._drain_lock:
            while True:
                n = offer.poll()
                if n is None:
                    return
                self.inbox.put(n[0], id(offer), n[1])

    def notifs(self) -> Dict[str, List[bytes]]:
        with self.lock:
            offers = [r.offer for r in self.local if r.offer is not None]
            if self.mailbox.offer is not None:
                offers.append(self.mailbox.offer)
        for o in offers:
            self._drain(o)
        return self.inbox.take()

    def send(self, agent: str, msg: bytes) -> None:
        with self.lock:
            ra = self._remote(agent)
            mailbox = ra.mailbox
        if mailbox is None:
            raise nixlNotFoundError(f"no connection info for agent {agent!r}: its metadata had none")
        try:
            self.engine.send(mailbox, frame(msg))
        except Exception as e:
            raise nixlBackendError(f"sending a notification to agent {agent!r} failed: {e}") from e

    # ---- the end ----

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            regions = [r for r in self.local] + [self.mailbox]
            remotes = list(self.remotes)
        for name in remotes:
            self.remove(name)
        for r in regions:
            if r.offer is not None:
                try:
                    r.offer.revoke()
                except Exception:
                    pass
            r.live = False
            _close(r.gate)
        self.engine.close()

    def sides(self, i: int) -> Tuple[Optional[str], int]:
        """A prepared list's agent and count (for messages)."""
        pl = self.dlists[i]
        return pl.agent, pl.count


def _close(gate: Any) -> None:
    if gate is not None:
        gate.close()
