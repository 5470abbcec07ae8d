"""Caller: ``dynamo/common/multimodal/embedding_transfer.py`` (Dynamo 1.6.1),
``NixlReadEmbeddingSender`` and ``NixlReadEmbeddingReceiver``, the NIXL READ
transfer of multimodal embeddings from an encode worker to a prefill worker.

The sender (the peer process, on uvloop) makes, per embedding tensor::

    connector = nixl_connect.Connector()                      # once
    descriptor = nixl_connect.Descriptor(tensor)              # the tensor itself, or a clone
    readable_op = await connector.create_readable(descriptor)
    TransferRequest(..., serialized_request=readable_op.metadata().model_dump())
    return request, readable_op.wait_for_completion()         # awaited later, elsewhere

The receiver (this process, on uvloop) makes::

    connector = nixl_connect.Connector()
    connection = run_async(connector._create_connection)      # from __init__, inside the loop
    for each pooled buffer:                                   # the warmed-up pool
        d = nixl_connect.Descriptor(torch.zeros(n, dtype=torch.int8))
        d.register_with_connector(connection)
    # per request:
    metadata = nixl_connect.RdmaMetadata.model_validate(request.serialized_request)
    pooled: original = d._data_size; d._data_size = nbytes
            view = d._data_ref[:nbytes].view(dtype=...).view(shape)
    or, pool empty: d = nixl_connect.Descriptor(torch.zeros(*shape, dtype=dtype))
    read_op = await connector.begin_read(metadata, d)
    await read_op.wait_for_completion()
    d._data_size = original                                   # then back to the pool

Receives run concurrently (``asyncio.create_task`` + ``asyncio.gather``, as
the vLLM prefill worker does). The receiver's pooled buffers have its
default size (1024 tokens x 8192, 8 MiB); the tests warm one or two of them
rather than the class default of 1024 (8 GiB), and also run the production
factory's receiver, ``max_items=0`` (every descriptor dynamic). The bytes
received are checked.
"""

from __future__ import annotations

import asyncio
import math
import queue
from typing import Any, Awaitable, Dict, List, Tuple

import callers
import pytest
from callers import Peer, run_async, run_uvloop
from pydantic import BaseModel

import ferry as nixl_connect

HIDDEN = 256  # the embeddings' hidden size in these tests


class TransferRequest(BaseModel):
    """The request the encode worker hands back (the caller's own model)."""

    embeddings_shape: List[int]
    embedding_dtype_str: str
    serialized_request: Any


class EmbeddingSender:
    """The NIXL READ sender's calls, in its order."""

    def __init__(self) -> None:
        self.connector = nixl_connect.Connector()

    async def send_embeddings(self, embeddings: Any, stage_embeddings: bool = False) -> Tuple[TransferRequest, Awaitable[None]]:
        transfer_buf = embeddings if stage_embeddings else (embeddings.clone() if hasattr(embeddings, "clone") else embeddings.copy())
        descriptor = nixl_connect.Descriptor(transfer_buf)
        readable_op = await self.connector.create_readable(descriptor)
        request = TransferRequest(
            embeddings_shape=callers.shape_of(embeddings),
            embedding_dtype_str=callers.dtype_name(embeddings),
            serialized_request=readable_op.metadata().model_dump(),
        )
        return request, readable_op.wait_for_completion()


class EmbeddingReceiver:
    """The NIXL READ receiver's calls, in its order, with its pool."""

    def __init__(self, embedding_hidden_size: int = 8 * 1024, max_item_mm_token: int = 1024, max_items: int = 1024) -> None:
        self.connector = nixl_connect.Connector()
        self.tensor_id_counter = 0
        self.warmedup_descriptors: "queue.Queue[Any]" = queue.Queue()
        self.inuse_descriptors: Dict[int, Tuple[Any, bool]] = {}
        self.pool_item_bytes = max_item_mm_token * embedding_hidden_size
        connection = run_async(self.connector._create_connection)
        for _ in range(max_items):
            encodings_tensor = callers.zeros([self.pool_item_bytes], "int8")
            descriptor = nixl_connect.Descriptor(encodings_tensor)
            descriptor.register_with_connector(connection)
            self.warmedup_descriptors.put(descriptor)

    async def receive_embeddings(self, request: TransferRequest) -> Tuple[int, Any]:
        shape = request.embeddings_shape
        dtype = request.embedding_dtype_str
        readable_metadata = nixl_connect.RdmaMetadata.model_validate(request.serialized_request)
        original_descriptor_size = None
        if self.warmedup_descriptors.empty():
            encodings_tensor = callers.zeros(shape, dtype)
            descriptor = nixl_connect.Descriptor(encodings_tensor)
            dynamic = True
        else:
            descriptor = self.warmedup_descriptors.get()
            original_descriptor_size = descriptor._data_size
            size = callers.itemsize(dtype) * math.prod(shape)
            descriptor._data_size = size
            assert descriptor._data_ref is not None
            encodings_tensor = callers.view_as(descriptor._data_ref[:size], dtype, shape)
            dynamic = False
        read_op = await self.connector.begin_read(readable_metadata, descriptor)
        await read_op.wait_for_completion()
        if original_descriptor_size is not None:
            descriptor._data_size = original_descriptor_size
        tensor_id = self.tensor_id_counter
        self.tensor_id_counter += 1
        self.inuse_descriptors[tensor_id] = (descriptor, dynamic)
        return tensor_id, encodings_tensor

    def release_tensor(self, tensor_id: int) -> None:
        descriptor, dynamic = self.inuse_descriptors.pop(tensor_id)
        if not dynamic:
            self.warmedup_descriptors.put(descriptor)


# ---------------------------------------------------------------- the encode worker (peer)


async def peer_encode_worker(chan: callers.Channel) -> None:
    """Answers each ``encode`` (specs: shape, dtype, seed; stage) with the
    TransferRequests as JSON, then awaits every transfer's completion in a
    background task, as the vLLM encode handler does, and says ``sent``."""
    sender = EmbeddingSender()
    pending: "asyncio.Queue[Any]" = asyncio.Queue()

    async def check_complete() -> None:
        while True:
            transfer_future, _tensor = await pending.get()
            await transfer_future
            pending.task_done()

    checker = asyncio.create_task(check_complete())
    while True:
        msg = await chan.arecv()
        if msg["event"] == "stop":
            break
        tensors = [callers.filled(s["shape"], s["dtype"], s["seed"]) for s in msg["specs"]]
        stage = msg.get("stage", True)
        results = await asyncio.gather(
            *(asyncio.create_task(sender.send_embeddings(t, stage_embeddings=stage)) for t in tensors)
        )
        if not stage:
            for t in tensors:  # the sender copied: what the remote reads is unaffected
                t[...] = 0
        chan.send("requests", requests=[request.model_dump_json() for request, _ in results])
        for (_, done), t in zip(results, tensors):
            pending.put_nowait((done, t))
        await asyncio.wait_for(pending.join(), callers.TIMEOUT)
        chan.send("sent")
    checker.cancel()


async def peer_expose(chan: callers.Channel) -> None:
    """One readable of `size` bytes; answers its TransferRequest, then ``done``
    once read or withdrawn."""
    msg = await chan.arecv("expose")
    sender = EmbeddingSender()
    request, done = await sender.send_embeddings(callers.filled([msg["size"]], "int8", 5), stage_embeddings=True)
    chan.send("requests", requests=[request.model_dump_json()])
    await chan.arecv("stop")
    done.close()


# ---------------------------------------------------------------- tests


def specs(*items: Tuple[List[int], str]) -> List[Dict[str, Any]]:
    return [{"shape": shape, "dtype": dtype, "seed": 100 + i} for i, (shape, dtype) in enumerate(items)]


async def receive_all(peer: Peer, receiver: EmbeddingReceiver, items: List[Dict[str, Any]], stage: bool = True) -> List[Tuple[int, Any]]:
    peer.send("encode", specs=items, stage=stage)
    requests = [TransferRequest.model_validate_json(r) for r in (await peer.arecv("requests"))["requests"]]
    tasks = [asyncio.create_task(receiver.receive_embeddings(r)) for r in requests]
    loaded = await asyncio.gather(*tasks)
    for (_, tensor), spec in zip(loaded, items):
        assert callers.shape_of(tensor) == spec["shape"]
        assert callers.as_bytes(tensor) == callers.as_bytes(callers.filled(spec["shape"], spec["dtype"], spec["seed"]))
    await peer.arecv("sent")
    return loaded


def test_pooled_receiver_gathers_reads_and_returns_descriptors_to_the_pool():
    """Three embeddings received at once by a receiver warmed with two pooled
    descriptors: two reads land in shrunk pooled buffers (_data_size), the
    third in a dynamic descriptor; the pool is whole again after release."""
    items = specs(([1, 10, HIDDEN], "float16"), ([1, 7, HIDDEN], "float32"), ([1, 20, HIDDEN], "float16"))

    async def main():
        receiver = EmbeddingReceiver(max_items=2)
        full = receiver.pool_item_bytes
        with Peer(__file__, "peer_encode_worker") as peer:
            loaded = await receive_all(peer, receiver, items)
            dynamic = [receiver.inuse_descriptors[tid][1] for tid, _ in loaded]
            assert sorted(dynamic) == [False, False, True]
            for tid, _ in loaded:
                receiver.release_tensor(tid)
            assert receiver.warmedup_descriptors.qsize() == 2
            for d in list(receiver.warmedup_descriptors.queue):
                assert d._data_size == full == d.size
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_one_pooled_descriptor_serves_reads_of_different_sizes():
    """A pool of one: the same registered descriptor receives, one request
    after another, embeddings of different sizes and dtypes."""
    rounds = [
        specs(([1, 30, HIDDEN], "float16")),
        specs(([1, 3, HIDDEN], "int8")),
        specs(([1, 16, HIDDEN], "float32")),
        specs(([1, 1, 1], "float16")),
    ]

    async def main():
        receiver = EmbeddingReceiver(max_items=1)
        (pooled,) = list(receiver.warmedup_descriptors.queue)
        with Peer(__file__, "peer_encode_worker") as peer:
            for items in rounds:
                ((tid, _),) = await receive_all(peer, receiver, items)
                assert receiver.inuse_descriptors[tid] == (pooled, False)
                receiver.release_tensor(tid)
                assert pooled._data_size == receiver.pool_item_bytes
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_default_receiver_reads_into_dynamic_descriptors():
    """The production factory's receiver (max_items=0): every read goes into
    a fresh tensor; the sender copies (stage_embeddings=False), so changing
    its tensor after create_readable does not change what is read."""
    items = specs(([1, 12, HIDDEN], "float16"), ([2, 5, HIDDEN], "bfloat16"))

    async def main():
        receiver = EmbeddingReceiver(max_items=0)
        with Peer(__file__, "peer_encode_worker") as peer:
            loaded = await receive_all(peer, receiver, items, stage=False)
            assert all(receiver.inuse_descriptors[tid][1] for tid, _ in loaded)
            for tid, _ in loaded:
                receiver.release_tensor(tid)
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_receiver_built_outside_any_loop_is_used_inside_one():
    """run_async with no running loop: the connection comes from a loop
    (asyncio.run) that is closed before the reads start on uvloop."""
    receiver = EmbeddingReceiver(max_items=1)
    items = specs(([1, 4, HIDDEN], "float16"))

    async def main():
        with Peer(__file__, "peer_encode_worker") as peer:
            ((tid, _),) = await receive_all(peer, receiver, items)
            assert receiver.inuse_descriptors[tid][1] is False
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_pooled_descriptor_cannot_be_grown_past_its_memory():
    """_data_size may shrink a descriptor to the bytes to receive, never
    grow it past the memory it describes: a read that would write past the
    pooled buffer is refused (ValueError), and the buffer is untouched."""

    async def main():
        receiver = EmbeddingReceiver(max_items=1)
        full = receiver.pool_item_bytes
        descriptor = receiver.warmedup_descriptors.get()
        with Peer(__file__, "peer_expose") as peer:
            peer.send("expose", size=full + 4096)
            (raw,) = (await peer.arecv("requests"))["requests"]
            metadata = nixl_connect.RdmaMetadata.model_validate(TransferRequest.model_validate_json(raw).serialized_request)
            with pytest.raises(ValueError):
                descriptor._data_size = full + 4096
                await receiver.connector.begin_read(metadata, descriptor)
            assert callers.as_bytes(descriptor._data_ref) == bytes(full)
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())
