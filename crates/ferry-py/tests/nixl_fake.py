"""An in-process engine for ferry.nixl's agent (tests/test_nixl_api.py):
offers are entries of a table of this process, a claim finds one, a
transfer is ``ctypes.memmove`` of its pieces at the post, and a pending
transfer reports done after `delay` polls (so that ``"PROC"`` shows)."""

from __future__ import annotations

import ctypes
import itertools
import json
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from ferry.nixl._engine import Done, LocalRegion, SubOp

_IDS = itertools.count(1)
OFFERS: Dict[int, "FakeOffer"] = {}


class FakeOffer:
    def __init__(self, owner: str, region: LocalRegion) -> None:
        self.id = next(_IDS)
        self.owner = owner
        self.region = region
        self.revoked = False
        self.queue: Deque[Tuple[Optional[str], bytes]] = deque()
        OFFERS[self.id] = self

    def metadata(self) -> str:
        return json.dumps({"fake_offer": self.id, "owner": self.owner})

    def poll(self) -> Optional[Tuple[Optional[str], bytes]]:
        return self.queue.popleft() if self.queue else None

    def revoke(self) -> None:
        self.revoked = True


class FakeGrant:
    def __init__(self, offer: FakeOffer, holder: str) -> None:
        self.offer = offer
        self.holder = holder
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def check(self) -> None:
        if self.closed:
            raise RuntimeError("grant closed")
        if self.offer.revoked:
            raise RuntimeError("GrantRevokedError: the offer was revoked")


class FakePending:
    def __init__(self, delay: int, error: Optional[BaseException]) -> None:
        self.left = delay
        self._error = error
        self.cancelled = False

    def done(self) -> bool:
        if self.left > 0:
            self.left -= 1
            return False
        return True

    def error(self) -> Optional[BaseException]:
        return self._error

    def finished_ns(self) -> Optional[int]:
        return None

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float) -> bool:
        self.left = 0
        return True


class FakeEngine:
    def __init__(self, worker_id: str, delay: int = 0) -> None:
        self._id = worker_id
        self.delay = delay
        self.posts: List[Tuple[bool, int, int]] = []

    @property
    def worker_id(self) -> str:
        return self._id

    def offer(self, region: LocalRegion) -> FakeOffer:
        return FakeOffer(self._id, region)

    def claim(self, offer_json: str) -> FakeGrant:
        d = json.loads(offer_json)
        offer = OFFERS.get(d["fake_offer"])
        if offer is None or offer.revoked:
            raise RuntimeError("no such offer (or revoked)")
        return FakeGrant(offer, self._id)

    def post(self, write: bool, subops: Sequence[SubOp], notify: Sequence[bytes], mailbox: Any) -> Any:
        self.posts.append((write, len(subops), len(notify)))
        try:
            for s in subops:
                g = s.remote.grant
                assert isinstance(g, FakeGrant)
                g.check()
                for lo, ro, n in zip(s.local_off.tolist(), s.remote_off.tolist(), s.lens.tolist()):
                    la, ra = s.local.addr + lo, g.offer.region.addr + ro
                    assert ro + n <= g.offer.region.length and lo + n <= s.local.length
                    src, dst = (la, ra) if write else (ra, la)
                    ctypes.memmove(dst, src, n)
            if len(subops) == 1 and len(notify) == 1:
                g = subops[0].remote.grant
                assert isinstance(g, FakeGrant)
                g.offer.queue.append((self._id, notify[0]))
            else:
                self.send(mailbox, notify)
        except Exception as e:
            return FakePending(self.delay, e) if self.delay else Done(e)
        return FakePending(self.delay, None) if self.delay else Done()

    def send(self, mailbox: Any, notify: Sequence[bytes]) -> None:
        for p in notify:
            assert isinstance(mailbox, FakeGrant)
            mailbox.check()
            mailbox.offer.queue.append((self._id, p))

    def close(self) -> None:
        pass


def engine(delay: int = 0) -> Any:
    """The factory nixl_agent(..., engine=) takes."""
    return lambda name, conf: FakeEngine(name, delay)


# ---- a stand-in for the ``ferry`` package's offers and byte ranges ----
# (what tests/test_nixl_api.py runs FerryEngine over, in one process: the
# names of coord's offers and ranges, moving bytes with ctypes.memmove)


class SimNotification:
    def __init__(self, holder: str, payload: bytes) -> None:
        self.holder = holder
        self.payload = payload


class SimOfferMetadata:
    def __init__(self, text: str) -> None:
        self.text = text

    @classmethod
    def from_json(cls, text: str) -> "SimOfferMetadata":
        return cls(text)

    def to_json(self) -> str:
        return self.text


SIM_OFFERS: Dict[int, "SimOffer"] = {}


class SimOffer:
    def __init__(self, owner: str, pool: Any) -> None:
        self.id = next(_IDS)
        self.owner = owner
        self.addr, self.size = pool.memory[0], pool.size
        self.revoked = False
        self.queue: Deque[SimNotification] = deque()
        SIM_OFFERS[self.id] = self

    def metadata(self) -> SimOfferMetadata:
        return SimOfferMetadata(json.dumps({"sim_offer": self.id}))

    def poll_notification(self) -> Optional[SimNotification]:
        return self.queue.popleft() if self.queue else None

    def revoke_blocking(self) -> None:
        self.revoked = True


class SimRemoteGrant:
    def __init__(self, offer: SimOffer, holder: str) -> None:
        self.offer, self.holder = offer, holder

    def _move(self, write: bool, pool: Any, local: List[Any], remote: List[Any], notify: Optional[bytes]) -> None:
        if self.offer.revoked:
            raise RuntimeError("GrantRevokedError: revoked")
        base, bs = pool.memory[0], pool.block_size
        for (lb, lo), (rb, ro, n) in zip(local, remote):
            assert rb == 0 and lo + n <= bs and ro + n <= self.offer.size
            la = base + lb * bs + lo
            src, dst = (la, self.offer.addr + ro) if write else (self.offer.addr + ro, la)
            ctypes.memmove(dst, src, n)
        if notify is not None:
            self.offer.queue.append(SimNotification(self.holder, notify))

    def read_ranges_blocking(self, remote: List[Any], pool: Any, local: List[Any], *, notify: Optional[bytes] = None) -> None:
        self._move(False, pool, local, remote, notify)

    def write_ranges_blocking(self, pool: Any, local: List[Any], remote: List[Any], *, notify: Optional[bytes] = None) -> None:
        self._move(True, pool, local, remote, notify)

    async def read_ranges(self, remote: List[Any], pool: Any, local: List[Any], *, notify: Optional[bytes] = None) -> None:
        self._move(False, pool, local, remote, notify)

    async def write_ranges(self, pool: Any, local: List[Any], remote: List[Any], *, notify: Optional[bytes] = None) -> None:
        self._move(True, pool, local, remote, notify)

    async def notify(self, payload: bytes) -> None:
        if self.offer.revoked:
            raise RuntimeError("GrantRevokedError: revoked")
        self.offer.queue.append(SimNotification(self.holder, payload))


class SimConnector:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id

    def offer(self, pool: Any, rights: str) -> SimOffer:
        assert rights == "read_write"
        return SimOffer(self.worker_id, pool)

    def claim_blocking(self, meta: SimOfferMetadata) -> SimRemoteGrant:
        offer = SIM_OFFERS[json.loads(meta.text)["sim_offer"]]
        if offer.revoked:
            raise RuntimeError("revoked")
        return SimRemoteGrant(offer, self.worker_id)


class SimFerry:
    Connector = SimConnector
    OfferMetadata = SimOfferMetadata


def sim_ferry_engine() -> Any:
    """The factory for nixl_agent(engine=): FerryEngine over SimFerry."""
    from ferry.nixl._ferry_engine import FerryEngine

    return lambda name, conf: FerryEngine(name, SimFerry)
