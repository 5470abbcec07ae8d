"""Offers from Python: this process owns a pool and offers it; claimer
connectors (two workers) each claim a grant of their own from the owner's
runtime, read the owner's bytes and write with notifications the owner sees
merged, each naming its holder. Revoking one holder, then the offer, and
hostile claims (a wrong token, a revoked or expired offer) refused typed."""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import Tuple

import pytest
from conftest import run

import ferry
from ferry import Offer, OfferMetadata, Pool

BLOCK = 4096
BLOCKS = 16


def owner_pool() -> Tuple[bytearray, Pool]:
    """A pool whose block i holds bytes of value i + 1."""
    mem = bytearray(b"".join(bytes([i + 1]) * BLOCK for i in range(BLOCKS)))
    return mem, Pool(mem, BLOCK)


def block(mem: bytearray, i: int) -> bytes:
    return bytes(mem[i * BLOCK : (i + 1) * BLOCK])


async def next_of(offer: Offer) -> ferry.GrantNotification:
    n = await asyncio.wait_for(offer.next_notification(), 10)
    assert n is not None
    return n


def test_two_claimers_get_their_own_grants_and_the_owner_sees_each_holder() -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-o1", listen="127.0.0.1:0")
        mem, pool = owner_pool()
        offer = owner.offer(pool, "read_write")
        published = offer.metadata().to_json()
        assert len(published) <= 1024
        claimers = [ferry.Connector(f"decode-o{w}", listen="127.0.0.1:0") for w in (1, 2)]
        remotes = []
        for w, c in enumerate(claimers, start=1):
            remote = await c.claim(published)
            assert remote.metadata().holder == f"decode-o{w}"
            assert remote.rights == "read_write"
            local = bytearray(2 * BLOCK)
            mine = Pool(local, BLOCK)
            await remote.read_blocks([w], mine, [0])
            assert bytes(local[:BLOCK]) == block(mem, w)
            local[BLOCK:] = bytes([0xA0 + w]) * BLOCK
            await remote.write_blocks(mine, [1], [10 + w], notify=f"from {w}".encode())
            remotes.append((remote, mine))
        seen = sorted([(n.holder, n.payload) for n in [await next_of(offer), await next_of(offer)]])
        assert seen == [("decode-o1", b"from 1"), ("decode-o2", b"from 2")]
        assert offer.holders() == ["decode-o1", "decode-o2"]
        for w in (1, 2):
            assert block(mem, 10 + w) == bytes([0xA0 + w]) * BLOCK
        assert offer.poll_notification() is None

        # One holder revoked: its grant ends and its claims are refused; the
        # other's goes on.
        await offer.revoke_holder("decode-o1")
        assert offer.holders() == ["decode-o2"]
        r1, m1 = remotes[0]
        with pytest.raises(ferry.GrantRevokedError):
            await r1.write_blocks(m1, [1], [11], notify=b"late")
        with pytest.raises(ferry.GrantRevokedError):
            await claimers[0].claim(published)
        r2, m2 = remotes[1]
        await r2.write_blocks(m2, [1], [12], notify=b"again")
        n = await next_of(offer)
        assert (n.holder, n.payload, n.first_block) == ("decode-o2", b"again", 12)

        # The offer revoked: every grant ends, later claims are refused.
        await offer.revoke()
        assert offer.revoked and offer.holders() == []
        with pytest.raises(ferry.GrantRevokedError):
            await r2.read_blocks([0], m2, [0])
        with pytest.raises(ferry.GrantRevokedError):
            claimers[1].claim_blocking(published)
        assert [n async for n in offer.notifications()] == []

    run(main())


def test_hostile_and_expired_claims_are_refused_typed() -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-o2", listen="127.0.0.1:0")
        me = ferry.Connector("decode-o3", listen="127.0.0.1:0")
        _, pool = owner_pool()
        offer = owner.offer(pool, "read")
        d = offer.metadata().model_dump()
        d["token"] = "00" * 16
        with pytest.raises(ferry.GrantForgedError):
            await me.claim(OfferMetadata.model_validate(d))
        remote = await me.claim(offer.metadata())
        mine = Pool(bytearray(BLOCK), BLOCK)
        with pytest.raises(ferry.GrantRightsError):
            await remote.write_blocks(mine, [0], [1])
        # Claiming again: a fresh grant replaces the first.
        again = me.claim_blocking(offer.metadata())
        assert again.metadata().grant_id != remote.metadata().grant_id
        with pytest.raises(ferry.GrantRevokedError):
            await remote.read_blocks([1], mine, [0])
        await again.read_blocks([1], mine, [0])

        brief = owner.offer(pool, "read", expires_after=0.2)
        held = await me.claim(brief.metadata())
        await asyncio.sleep(0.3)
        with pytest.raises(ferry.GrantExpiredError):
            await me.claim(brief.metadata())
        with pytest.raises((ferry.GrantExpiredError, ferry.GrantRevokedError)):
            await held.read_blocks([1], mine, [0])
        with pytest.raises(ValueError, match="rights"):
            owner.offer(pool, "all")
        with pytest.raises(TypeError):
            owner.offer(bytearray(BLOCK), "read")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            OfferMetadata.from_json("{}")

    run(main())


def test_offer_metadata_travels_as_text_bytes_pickle_and_dict() -> None:
    owner = ferry.Connector("prefill-o3", listen="127.0.0.1:0")
    _, pool = owner_pool()
    offer = owner.offer(pool, "read_write", expires_after=60, spin_us=20)
    meta = offer.metadata()
    assert OfferMetadata.from_json(meta.to_json()) == meta
    assert OfferMetadata.from_bytes(bytes(meta)) == meta
    assert OfferMetadata.from_json(str(meta)) == meta
    assert pickle.loads(pickle.dumps(meta)) == meta
    assert OfferMetadata.model_validate(meta.model_dump()) == meta
    assert (meta.owner, meta.rights, meta.block_count, meta.block_size) == ("prefill-o3", "read_write", BLOCKS, BLOCK)
    assert meta.expires_at is not None and meta.expires_at > time.time()
    assert "token" not in repr(meta)
    offer.revoke_blocking()
    assert offer.revoked


def test_an_offer_takes_at_most_max_holders() -> None:
    async def main() -> None:
        owner = ferry.Connector("prefill-cap", listen="127.0.0.1:0")
        _, pool = owner_pool()
        with pytest.raises(ValueError):
            owner.offer(pool, "read", max_holders=0)
        offer = owner.offer(pool, "read", max_holders=1)
        a = ferry.Connector("decode-cap-a", listen="127.0.0.1:0")
        b = ferry.Connector("decode-cap-b", listen="127.0.0.1:0")
        published = offer.metadata().to_json()
        await a.claim(published)
        with pytest.raises(ferry.OfferFullError) as e:
            await b.claim(published)
        assert isinstance(e.value, ferry.GrantError) and "1 holders" in str(e.value)
        assert offer.holders() == ["decode-cap-a"]
        # The holder claiming again is never refused; a revoked one leaves
        # its place.
        await a.claim(published)
        await offer.revoke_holder("decode-cap-a")
        remote = await b.claim(published)
        local = bytearray(BLOCK)
        await remote.read_blocks([3], Pool(local, BLOCK), [0])
        assert bytes(local) == bytes([4]) * BLOCK

    run(main())
