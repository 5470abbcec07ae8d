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
