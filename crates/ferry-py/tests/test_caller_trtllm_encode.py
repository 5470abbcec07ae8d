"""Caller: ``dynamo/trtllm/encode_helper.py`` (Dynamo 1.6.1), ``EncodeHelper``:
the embedding-path flow between a TRT-LLM encode worker and a prefill
worker.

The encode worker (the peer process, on uvloop, as ``dynamo.trtllm`` runs)
streams its response from an async generator::

    descriptor = nixl_connect.Descriptor(encodings)
    with await connector.create_readable(descriptor) as readable_op:
        op_metadata = readable_op.metadata()
        yield {"nixl_readable_metadata": op_metadata.model_dump(),
               "embeddings_shape": list(encodings.shape),
               "embeddings_dtype": str(encodings.dtype), "auxiliary_data": {...}}
        await readable_op.wait_for_completion()

The prefill worker (this process, on uvloop) makes, in
``read_embeddings_from_encode_response``::

    readable_metadata = nixl_connect.RdmaMetadata.model_validate(encode_response["nixl_readable_metadata"])
    encodings_tensor = torch.zeros(*embeddings_shape, dtype=embeddings_dtype)
    descriptor = nixl_connect.Descriptor(encodings_tensor)
    read_op = await connector.begin_read(readable_metadata, descriptor)
    with read_op:
        await read_op.wait_for_completion()

Checked: the bytes; the encode worker's readable completes; leaving its
``with`` (when the generator finishes, or is closed before the prefill
worker read) withdraws the memory, and a read after that raises a
``RuntimeError``; leaving the prefill side's ``with`` early cancels the
read without disturbing the connector.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict

import callers
import pytest
from callers import Peer, run_uvloop

import ferry as nixl_connect


async def process_embedding_path_flow(encodings: Any, auxiliary: Dict[str, Any], connector: Any) -> AsyncIterator[Dict[str, Any]]:
    """The encode worker's generator (its NIXL calls, in order)."""
    descriptor = nixl_connect.Descriptor(encodings)
    with await connector.create_readable(descriptor) as readable_op:
        op_metadata = readable_op.metadata()
        yield {
            "nixl_readable_metadata": op_metadata.model_dump(),
            "embeddings_shape": callers.shape_of(encodings),
            "embeddings_dtype": "torch." + callers.dtype_name(encodings),
            "auxiliary_data": auxiliary,
        }
        await readable_op.wait_for_completion()


async def read_embeddings_from_encode_response(encode_response: Dict[str, Any], connector: Any) -> Any:
    """The prefill worker's read (its NIXL calls, in order)."""
    if "error" in encode_response:
        raise RuntimeError(f"EncodeHandler error: {encode_response['error']}")
    embeddings_shape = encode_response["embeddings_shape"]
    dtype = encode_response["embeddings_dtype"].removeprefix("torch.")
    readable_metadata = nixl_connect.RdmaMetadata.model_validate(encode_response["nixl_readable_metadata"])
    encodings_tensor = callers.zeros(embeddings_shape, dtype)
    descriptor = nixl_connect.Descriptor(encodings_tensor)
    read_op = await connector.begin_read(readable_metadata, descriptor)
    with read_op:
        await read_op.wait_for_completion()
    if encode_response.get("auxiliary_data"):
        return {"mm_embeddings": encodings_tensor, **encode_response["auxiliary_data"]}
    return encodings_tensor


# ---------------------------------------------------------------- the encode worker (peer)


async def peer_encode_worker(chan: callers.Channel) -> None:
    """Per ``encode`` (shape, dtype, seed, close_early): runs the generator,
    forwards its one response, then drives it to its end (``done``), or
    closes it right after the response (``closed``)."""
    connector = nixl_connect.Connector()
    await connector._create_connection()  # what the TRT-LLM worker does at start
    while True:
        msg = await chan.arecv()
        if msg["event"] == "stop":
            return
        encodings = callers.filled(msg["shape"], msg["dtype"], msg["seed"])
        gen = process_embedding_path_flow(encodings, {"grid": [1, 2, 3]}, connector)
        response = await gen.__anext__()
        chan.send("response", response=response)
        if msg.get("close_early"):
            await gen.aclose()  # GeneratorExit inside the `with`: the readable is released
            chan.send("closed")
            continue
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(gen.__anext__(), callers.TIMEOUT)
        chan.send("done")


# ---------------------------------------------------------------- tests


def test_prefill_reads_the_encode_workers_embeddings():
    """Two requests, one after another, on the same connectors: the
    embeddings arrive intact, the auxiliary data rides along, the encode
    worker's readable completes and its `with` block ends."""

    async def main():
        connector = nixl_connect.Connector()
        await connector._create_connection()
        with Peer(__file__, "peer_encode_worker") as peer:
            for seed, shape, dtype in [(1, [1, 576, 64], "float16"), (2, [3, 100, 32], "float32")]:
                peer.send("encode", shape=shape, dtype=dtype, seed=seed)
                response = (await peer.arecv("response"))["response"]
                result = await read_embeddings_from_encode_response(response, connector)
                assert result["grid"] == [1, 2, 3]
                tensor = result["mm_embeddings"]
                assert callers.shape_of(tensor) == shape
                assert callers.as_bytes(tensor) == callers.as_bytes(callers.filled(shape, dtype, seed))
                await peer.arecv("done")
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_a_response_read_twice_fails_the_second_time():
    """Once the encode worker's `with` has ended, its metadata is spent: a
    second read of the same response raises a RuntimeError."""

    async def main():
        connector = nixl_connect.Connector()
        with Peer(__file__, "peer_encode_worker") as peer:
            peer.send("encode", shape=[1, 8, 8], dtype="float16", seed=3)
            response = (await peer.arecv("response"))["response"]
            await read_embeddings_from_encode_response(response, connector)
            await peer.arecv("done")
            with pytest.raises(RuntimeError):
                await asyncio.wait_for(read_embeddings_from_encode_response(response, connector), callers.TIMEOUT)
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_generator_closed_before_the_read_withdraws_the_embeddings():
    """The encode worker's generator is closed right after its response
    (the request went away): leaving the `with` withdrew the readable, so
    the prefill worker's read raises a RuntimeError."""

    async def main():
        connector = nixl_connect.Connector()
        with Peer(__file__, "peer_encode_worker") as peer:
            peer.send("encode", shape=[2, 16], dtype="float32", seed=4, close_early=True)
            response = (await peer.arecv("response"))["response"]
            await peer.arecv("closed")
            with pytest.raises(RuntimeError):
                await asyncio.wait_for(read_embeddings_from_encode_response(response, connector), callers.TIMEOUT)
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())

