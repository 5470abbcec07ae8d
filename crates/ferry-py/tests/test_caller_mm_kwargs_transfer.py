"""Caller: ``dynamo/common/multimodal/mm_kwargs_transfer.py`` (Dynamo 1.6.1),
``MmKwargsNixlSender`` (the frontend) and ``MmKwargsNixlReceiver`` (the
backend): serialized multimodal kwargs items pulled with NIXL READ.

The sender (the peer process, on uvloop) makes::

    connector = nixl_connect.Connector()
    per item: t = torch.frombuffer(bytearray(serialized), dtype=torch.uint8)
              readable_op = await connector.create_readable(nixl_connect.Descriptor(t))
              TensorTransferSpec(..., serialized_request=readable_op.metadata().model_dump())
    {"mm_kwargs_nixl": MmKwargsTransferMetadata(...).model_dump()}   # sent as JSON
    cleanup: await asyncio.wait_for(asyncio.gather(*(op.wait_for_completion() for op in ops),
                                                   return_exceptions=True), timeout)
             finally: op.__exit__(None, None, None) for every op      # even unread ones

The receiver (this process, on uvloop) makes, with its default pool of 16
descriptors of 8 MiB::

    connector = nixl_connect.Connector()
    connection = run_async(connector._create_connection)
    16 x: d = nixl_connect.Descriptor(torch.zeros(8 MiB, dtype=torch.uint8))
          d.register_with_connector(connection)
    per item: pooled d: original = d._data_size; d._data_size = size; view = d._data_ref[:size]
              (too big for the pool: d = nixl_connect.Descriptor(torch.empty(size, dtype=torch.uint8)))
              metadata = nixl_connect.RdmaMetadata.model_validate(spec.serialized_request)
              read_op = await connector.begin_read(metadata, d); await read_op.wait_for_completion()
    all items at once: asyncio.gather; then d._data_size = original, back to the pool.

The bytes of every item are checked; an item never read is released by the
sender's cleanup, after which reading it fails with an exception that is a
``RuntimeError`` (what the reference raises for a failed transfer).
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any, Dict, List, Optional, Tuple

import callers
import pytest
from callers import Peer, run_async, run_uvloop
from pydantic import BaseModel

import ferry as nixl_connect

DEFAULT_MAX_ITEM_BYTES = 8 * 1024 * 1024
DEFAULT_POOL_SIZE = 16


class TensorTransferSpec(BaseModel):
    field_name: str
    shape: List[int]
    dtype_str: str
    serialized_request: Any


class MmKwargsTransferMetadata(BaseModel):
    modality: str
    tensor_specs: List[TensorTransferSpec]
    mm_hashes: List[str]


def item_bytes(seed: int, size: int) -> bytes:
    return callers.as_bytes(callers.filled([size], "uint8", seed))


class Sender:
    """The frontend's NIXL sender: the calls of prepare() and cleanup()."""

    def __init__(self) -> None:
        self._connector = nixl_connect.Connector()

    async def prepare(self, items: List[bytes], modality: str = "image") -> Tuple[Dict[str, Any], List[Any]]:
        specs, ops = [], []
        for serialized in items:
            serialized_tensor = callers.frombuffer_u8(bytearray(serialized))
            descriptor = nixl_connect.Descriptor(serialized_tensor)
            readable_op = await self._connector.create_readable(descriptor)
            specs.append(
                TensorTransferSpec(
                    field_name="__pickled_kwargs_item__",
                    shape=[len(serialized)],
                    dtype_str="uint8",
                    serialized_request=readable_op.metadata().model_dump(),
                )
            )
            ops.append(readable_op)
        metadata = MmKwargsTransferMetadata(modality=modality, tensor_specs=specs, mm_hashes=[f"h{i}" for i in range(len(items))])
        return {"mm_kwargs_nixl": metadata.model_dump()}, ops

    async def cleanup(self, items: List[Any], timeout: float) -> Optional[List[Any]]:
        """The completions (None when the wait timed out); every op is released."""
        try:
            return await asyncio.wait_for(
                asyncio.gather(*(op.wait_for_completion() for op in items), return_exceptions=True),
                timeout=timeout,
            )
        except asyncio.TimeoutError:
            return None
        finally:
            for op in items:
                op.__exit__(None, None, None)


class Receiver:
    """The backend's NIXL receiver, with its pre-registered pool."""

    def __init__(self, max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        self._connector = nixl_connect.Connector()
        self._max_item_bytes = max_item_bytes
        self._pool: "queue.Queue[Any]" = queue.Queue()
        connection = run_async(self._connector._create_connection)
        for _ in range(pool_size):
            buf = callers.zeros([max_item_bytes], "uint8")
            desc = nixl_connect.Descriptor(buf)
            desc.register_with_connector(connection)
            self._pool.put(desc)

    def _acquire(self, size: int) -> Tuple[Any, Any, bool, Optional[int]]:
        if not self._pool.empty():
            desc = self._pool.get()
            if size <= self._max_item_bytes:
                original = desc._data_size
                desc._data_size = size
                assert desc._data_ref is not None
                return desc, desc._data_ref[:size], False, original
            self._pool.put(desc)
        buf = callers.empty([size], "uint8")
        return nixl_connect.Descriptor(buf), buf, True, None

    def _release(self, desc: Any, dynamic: bool, original: Optional[int]) -> None:
        if dynamic:
            return
        if original is not None:
            desc._data_size = original
        self._pool.put(desc)

    async def receive(self, metadata: MmKwargsTransferMetadata) -> Tuple[Dict[str, Any], List[bool]]:
        reads, acquired, views = [], [], []
        for spec in metadata.tensor_specs:
            size = 1
            for s in spec.shape:
                size *= s
            desc, view, dynamic, original = self._acquire(size)
            acquired.append((desc, dynamic, original))
            views.append((spec.field_name, view, size))
            rdma_metadata = nixl_connect.RdmaMetadata.model_validate(spec.serialized_request)

            async def do_read(rm: Any = rdma_metadata, d: Any = desc) -> None:
                read_op = await self._connector.begin_read(rm, d)
                await read_op.wait_for_completion()

            reads.append(do_read())
        await asyncio.gather(*reads)
        results: Dict[str, Any] = {}
        for name, view, size in views:
            results.setdefault(name, []).append(bytearray(callers.to_numpy(view[:size])))
        for desc, dynamic, original in acquired:
            self._release(desc, dynamic, original)
        return results, [dynamic for _, dynamic, _ in acquired]

    def pool(self) -> List[Any]:
        return list(self._pool.queue)


# ---------------------------------------------------------------- the frontend (peer)


async def peer_frontend(chan: callers.Channel) -> None:
    """Per ``prepare`` (sizes, seed, timeout): prepare, send the extra_args,
    run cleanup and report how it went (``cleaned``)."""
    sender = Sender()
    while True:
        msg = await chan.arecv()
        if msg["event"] == "stop":
            return
        items = [item_bytes(msg["seed"] + i, size) for i, size in enumerate(msg["sizes"])]
        extra_args, ops = await sender.prepare(items)
        chan.send("extra_args", extra_args=extra_args)
        results = await sender.cleanup(ops, timeout=msg["timeout"])
        errors = None if results is None else [repr(r) for r in results if isinstance(r, BaseException)]
        chan.send("cleaned", timed_out=results is None, errors=errors)


# ---------------------------------------------------------------- tests


async def exchange(peer: Peer, receiver: Receiver, sizes: List[int], seed: int) -> List[bool]:
    peer.send("prepare", sizes=sizes, seed=seed, timeout=callers.TIMEOUT)
    extra_args = (await peer.arecv("extra_args"))["extra_args"]
    metadata = MmKwargsTransferMetadata.model_validate(extra_args["mm_kwargs_nixl"])
    results, dynamic = await receiver.receive(metadata)
    got = results["__pickled_kwargs_item__"]
    assert [bytes(b) for b in got] == [item_bytes(seed + i, s) for i, s in enumerate(sizes)]
    cleaned = await peer.arecv("cleaned")
    assert cleaned == {"event": "cleaned", "timed_out": False, "errors": []}
    return dynamic


def test_items_pulled_into_the_default_pool():
    """The default receiver (16 x 8 MiB, built from sync code before the loop
    starts) pulls four items at once, twice; every pooled descriptor is
    back, full size, afterwards."""
    receiver = Receiver()

    async def main():
        with Peer(__file__, "peer_frontend") as peer:
            for round_ in range(2):
                dynamic = await exchange(peer, receiver, [3000, 1 << 20, 17, 65536], seed=10 * round_)
                assert dynamic == [False] * 4
            peer.send("stop")
            await peer.afinish()
        pool = receiver.pool()
        assert len(pool) == DEFAULT_POOL_SIZE
        assert all(d._data_size == DEFAULT_MAX_ITEM_BYTES == d.size for d in pool)

    run_uvloop(main())


def test_item_larger_than_the_pool_uses_a_dynamic_descriptor():
    """A receiver built inside the running loop (run_async's thread), with
    a small pool: an item above max_item_bytes goes to a fresh buffer, and
    one more item than the pool holds too."""

    async def main():
        receiver = Receiver(max_item_bytes=4096, pool_size=2)
        with Peer(__file__, "peer_frontend") as peer:
            dynamic = await exchange(peer, receiver, [100, 5000, 4096, 10], seed=3)
            assert dynamic == [False, True, False, True]
            peer.send("stop")
            await peer.afinish()
        assert len(receiver.pool()) == 2

    run_uvloop(main())


def test_unread_items_are_released_by_cleanup():
    """The backend never reads: cleanup's wait_for times out, __exit__
    releases every readable, and a late read fails with a RuntimeError."""

    async def main():
        receiver = Receiver(max_item_bytes=4096, pool_size=1)
        with Peer(__file__, "peer_frontend") as peer:
            peer.send("prepare", sizes=[256, 512], seed=7, timeout=0.3)
            extra_args = (await peer.arecv("extra_args"))["extra_args"]
            cleaned = await peer.arecv("cleaned")
            assert cleaned["timed_out"] is True
            metadata = MmKwargsTransferMetadata.model_validate(extra_args["mm_kwargs_nixl"])
            with pytest.raises(RuntimeError):
                await asyncio.wait_for(receiver.receive(metadata), callers.TIMEOUT)
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())
