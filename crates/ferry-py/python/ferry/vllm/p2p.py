"""vLLM's P2P offload data plane (``DataTransport``) on Ferry's grants.

vLLM's P2P KV offload tier moves blocks between nodes through a
``DataTransport`` (``vllm/v1/kv_offload/tiering/p2p/data/base.py``): each
node exposes one region of ``num_blocks`` blocks of ``block_len`` bytes;
a peer's ``get_agent_metadata()`` bytes let this node
``add_remote_peer(...)`` it, and then ``write_blocks(peer, local_idxs,
remote_idxs)`` copies local blocks into the peer's by index, without
blocking, ``poll()`` reports what completed or failed, ``cancel()`` gives
transfers up, ``close()`` releases everything. vLLM ships a NIXL
implementation (``NixlTransport``); :class:`FerryTransport` is the same
contract on Ferry:

- the region becomes a :class:`ferry.Pool` of ``block_len``-byte blocks,
  and the metadata is an :class:`ferry.OfferMetadata` with WRITE rights
  over it: a peer that adds this node claims its own grant, bound to its
  authenticated worker id (nobody else can use it), on the best lane
  (cross-memory attach on one host, TCP otherwise);
- ``write_blocks`` posts one grant WRITE on the transport's own event loop
  thread and returns at once; ``poll`` collects what ended;
- ``remove_remote_peer`` cancels what is in flight to that peer and drops
  its grant; ``close`` revokes the offer, so no peer writes into this
  node's blocks after it returns (fenced: a write in flight when it is
  called has ended, or never lands).

Where it differs from vLLM's threading note ("no background threads"):
Ferry's runtime and one event loop thread of this transport carry the
transfers; ``poll`` only reads their results.

Plugging it in: construct it where vLLM constructs ``NixlTransport``
(the P2P tier's manager, ``vllm/v1/kv_offload/tiering/p2p/``), with the
same ``(local_id, view, config_fields)`` arguments; nothing else changes.
vLLM need not be installed to use it: when it is, :class:`FerryTransport`
derives from its ``DataTransport`` (so ``isinstance`` checks hold), and
otherwise from a base class with the same constructor and properties.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import itertools
import json
import threading
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .._connector import Connector
from .._pool import Pool

CancelMode = str  # "immediate" | "wait"


class PollResult(NamedTuple):
    """What ended since the last poll: transfer ids that completed, and
    those that failed."""

    done: Sequence[int]
    failed: Sequence[int]


class TransportError(RuntimeError):
    """A peer's metadata or layout this transport cannot use (wrong
    shape, not a Ferry transport's metadata)."""


class _Base:
    """The constructor and properties of vLLM's ``DataTransport``, for
    when vLLM is not installed."""

    def __init__(self, view: memoryview, config_fields: Optional[Dict[str, Any]] = None) -> None:
        if view.ndim != 2 or view.shape is None:
            raise ValueError("view must be a 2-D memoryview: num_blocks x block_len bytes")
        self._view = view
        self._num_blocks = int(view.shape[0])
        self._block_len = int(view.shape[1])
        self._config_fingerprint = _fingerprint(config_fields)

    @property
    def num_blocks(self) -> int:
        """Blocks in the local region."""
        return self._num_blocks

    @property
    def block_len(self) -> int:
        """Bytes per block."""
        return self._block_len

    @property
    def config_fingerprint(self) -> str:
        """A hash of the model configuration ("" if none was given): peers
        with different ones must not exchange blocks."""
        return self._config_fingerprint


def _fingerprint(config_fields: Optional[Dict[str, Any]]) -> str:
    if not config_fields:
        return ""
    canonical = json.dumps(config_fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _vllm_base() -> Any:
    try:
        from vllm.v1.kv_offload.tiering.p2p.data.base import DataTransport  # type: ignore

        return DataTransport
    except Exception:  # vLLM absent, or an older one without the P2P tier
        return _Base


_Parent: Any = _vllm_base()

_MAGIC = "ferry-p2p/1"


class FerryTransport(_Parent):  # type: ignore[misc]
    """vLLM's P2P ``DataTransport`` on Ferry's grants (see the module).

    ``add_remote_peer`` waits at most :attr:`ADD_PEER_TIMEOUT` seconds for
    the peer's grant (a :class:`TransportError` after that).

    `local_id` is this node's Ferry worker id (peers' grants are bound to
    it); `view` the 2-D memoryview (``num_blocks x block_len`` bytes) over
    the local block storage; `connector`, if given, the :class:`Connector`
    to use (else one is made for `local_id`)."""

    ADD_PEER_TIMEOUT = 30.0
    """Seconds ``add_remote_peer`` waits for the peer's grant."""

    def __init__(
        self,
        local_id: str,
        view: memoryview,
        config_fields: Optional[Dict[str, Any]] = None,
        *,
        connector: Optional[Connector] = None,
    ) -> None:
        super().__init__(view, config_fields=config_fields)
        self._local_id = local_id
        self._connector = connector if connector is not None else Connector(local_id)
        self._pool = Pool(view, self._block_len)
        self._offer: Any = self._connector.offer(self._pool, "write")
        self._peers: Dict[str, Any] = {}
        # transfer id -> (peer, the future of its write)
        self._inflight: Dict[int, Tuple[str, concurrent.futures.Future[None]]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"ferry-p2p-{local_id}", daemon=True)
        self._thread.start()

    @property
    def available(self) -> bool:
        """True until :meth:`close` (vLLM's ``NixlTransport`` says whether
        NIXL loaded; Ferry is here if this object exists)."""
        return not self._closed

    def get_agent_metadata(self) -> bytes:
        """What a peer passes to its ``add_remote_peer``: this node's offer
        (WRITE over its blocks) and layout, as JSON bytes."""
        self._check_open()
        return json.dumps(
            {
                "ferry": _MAGIC,
                "offer": self._offer.metadata().to_json(),
                "num_blocks": self._num_blocks,
                "block_len": self._block_len,
                "fingerprint": self._config_fingerprint,
            }
        ).encode()

    def add_remote_peer(
        self,
        peer_id: str,
        agent_metadata: bytes,
        base_addr: int = 0,
        num_blocks: int = 0,
        block_len: int = 0,
    ) -> None:
        """Claims `peer_id`'s grant from its metadata (a round trip to the
        peer's runtime; its application does nothing). `num_blocks` and
        `block_len`, where given (non-zero), must match the peer's;
        `block_len` must match this node's; `base_addr` is not needed
        (grants address blocks by index) and is ignored."""
        self._check_open()
        meta = _parse(agent_metadata)
        if meta["block_len"] != self._block_len or (block_len and block_len != meta["block_len"]):
            raise TransportError(
                f"peer {peer_id!r} has blocks of {meta['block_len']} bytes, this node "
                f"{self._block_len}: both sides need the same block_len"
            )
        if num_blocks and num_blocks != meta["num_blocks"]:
            raise TransportError(
                f"peer {peer_id!r} says {num_blocks} blocks, its metadata {meta['num_blocks']}"
            )
        if meta["fingerprint"] != self._config_fingerprint and meta["fingerprint"] and self._config_fingerprint:
            raise TransportError(f"peer {peer_id!r} runs another model configuration (fingerprint differs)")
        claim = self._run(self._connector.claim(meta["offer"]))
        try:
            grant = claim.result(timeout=self.ADD_PEER_TIMEOUT)
        except concurrent.futures.TimeoutError:
            claim.cancel()
            raise TransportError(
                f"peer {peer_id!r} did not answer the claim of its grant within {self.ADD_PEER_TIMEOUT} s"
            ) from None
        with self._lock:
            old = self._peers.get(peer_id)
            self._peers[peer_id] = grant
        if old is not None:
            del old

    def remove_remote_peer(self, peer_id: str) -> None:
        """Cancels the transfers in flight to `peer_id` and drops its grant."""
        with self._lock:
            ids = [t for t, (p, _) in self._inflight.items() if p == peer_id]
        self.cancel(ids, "immediate")
        with self._lock:
            self._peers.pop(peer_id, None)

    def write_blocks(self, peer_id: str, local_idxs: List[int], remote_idxs: List[int]) -> Optional[int]:
        """Posts a WRITE of local blocks `local_idxs` into `peer_id`'s blocks
        `remote_idxs` (pairwise) and returns its transfer id at once; None
        if the peer is unknown or the lists differ in length (as vLLM's
        contract says: the submission failed)."""
        if self._closed:
            return None
        with self._lock:
            grant = self._peers.get(peer_id)
        if grant is None or len(local_idxs) != len(remote_idxs):
            return None
        tid = next(self._ids)
        fut = self._run(grant.write_blocks(self._pool, list(local_idxs), list(remote_idxs)))
        with self._lock:
            self._inflight[tid] = (peer_id, fut)
        return tid

    def poll(self, peer_id: Optional[str] = None) -> PollResult:
        """The transfers (of `peer_id`, or all) that ended since the last
        poll, removed from the in-flight set."""
        done: List[int] = []
        failed: List[int] = []
        with self._lock:
            for tid, (peer, fut) in list(self._inflight.items()):
                if peer_id is not None and peer != peer_id:
                    continue
                if not fut.done():
                    continue
                del self._inflight[tid]
                if fut.cancelled() or fut.exception() is not None:
                    failed.append(tid)
                else:
                    done.append(tid)
        return PollResult(done=done, failed=failed)

    def cancel(self, transfer_ids: Iterable[int], mode: CancelMode = "immediate") -> List[int]:
        """Gives up transfers. ``"immediate"``: forgets them at once and
        returns [] (a copy already under way may still complete at the
        peer, as with NIXL's release; it never lands after the peer's
        grant is revoked). ``"wait"``: those not yet ended stay tracked and
        are returned; :meth:`poll` reports them when they end."""
        if mode not in ("immediate", "wait"):
            raise ValueError(f'mode must be "immediate" or "wait", not {mode!r}')
        still: List[int] = []
        with self._lock:
            for tid in transfer_ids:
                entry = self._inflight.get(tid)
                if entry is None:
                    continue
                fut = entry[1]
                if mode == "immediate":
                    fut.cancel()
                    del self._inflight[tid]
                elif not fut.done():
                    fut.cancel()
                    still.append(tid)
        return still

    def close(self) -> None:
        """Cancels what is in flight, drops every peer's grant and revokes
        this node's offer (no peer writes into its blocks afterwards).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            futs = [f for _, f in self._inflight.values()]
            self._inflight.clear()
            self._peers.clear()
        for f in futs:
            f.cancel()
        try:
            self._run(self._offer.revoke()).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _run(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the transport is closed")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _parse(data: bytes) -> Dict[str, Any]:
    try:
        meta = json.loads(bytes(data).decode())
    except (ValueError, UnicodeDecodeError, TypeError) as e:
        raise TransportError(f"not a Ferry transport's metadata: {e}") from None
    if not isinstance(meta, dict) or meta.get("ferry") != _MAGIC:
        raise TransportError("not a Ferry transport's metadata (another transport's, or another version)")
    for key, kind in (("offer", str), ("num_blocks", int), ("block_len", int), ("fingerprint", str)):
        if not isinstance(meta.get(key), kind):
            raise TransportError(f"a Ferry transport's metadata without a valid {key!r}")
    return meta
