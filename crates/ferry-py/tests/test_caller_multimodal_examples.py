"""Callers: Dynamo's multimodal examples, ``examples/multimodal/components/*.py``
(``encode_worker.py``, ``worker.py``: ``VllmEncodeWorker`` and ``VllmPDWorker``)
with their pydantic protocol ``examples/multimodal/utils/protocol.py``, where
``vLLMMultimodalRequest`` (``arbitrary_types_allowed=True``) carries
``serialized_request: Optional[connect.RdmaMetadata] = None``.

Read flow (the current examples). The encode worker (the peer process; the
examples run ``asyncio.run(worker())`` with uvloop installed) makes::

    self._connector = connect.Connector(); await self._connector.initialize()
    request = vLLMMultimodalRequest.model_validate_json(raw)
    request.embeddings_shape = tuple(embeddings.shape)
    descriptor = connect.Descriptor(embeddings)
    with await self._connector.create_readable(descriptor) as readable:
        request.serialized_request = readable.metadata()       # a plain attribute assignment
        request.multimodal_input.image_url = None
        send request.model_dump_json() to the PD worker; relay its answer
        await readable.wait_for_completion()

and the PD worker (this process, on uvloop)::

    self._connector = connect.Connector()
    request = vLLMMultimodalRequest.model_validate_json(raw)   # str -> model
    embeddings = torch.empty(request.embeddings_shape, dtype=torch.float16)
    read_op = await self._connector.begin_read(request.serialized_request, connect.Descriptor(embeddings))
    await read_op.wait_for_completion()
    request.serialized_request = None; copy.deepcopy(request); decode_request.model_dump_json()

Write flow (the earlier examples): the PD worker exposes a writable inside
``with await connector.create_writable(...)``, puts its ``metadata()`` in
the request, and the encode worker writes with ``begin_write(descriptor,
request.serialized_request)``.

Checked: the pydantic round trips (the example's model, and a model without
``arbitrary_types_allowed``), ``copy.deepcopy`` of a request holding
metadata, and the bytes moved both ways.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, List, Optional, Tuple, Union

import callers
from callers import Peer, run_uvloop
from pydantic import BaseModel, ConfigDict, Field

import ferry as nixl_connect

connect = nixl_connect  # the examples: import dynamo.nixl_connect as connect


class MultiModalInput(BaseModel):
    image_url: Optional[str] = None
    video_url: Optional[str] = None
    audio_url: Optional[str] = None


@functools.lru_cache(maxsize=None)
def protocol() -> Any:
    """The example's request model (built on first use, so that a failure
    to build it is a test failure, not an import error)."""

    class vLLMMultimodalRequest(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        request_id: str
        prompt_token_ids: List[int] = []
        multimodal_input: Optional[MultiModalInput] = Field(default_factory=MultiModalInput)
        image_grid_thw: Optional[List[Any]] = None
        embeddings_shape: Optional[Union[Tuple[int, int, int], Tuple[int, int, int, int]]] = None
        serialized_request: Optional[connect.RdmaMetadata] = None

    return vLLMMultimodalRequest


class MyRequestOutput(BaseModel):
    request_id: str
    text: str
    finished: bool


def embeddings_of(request_id: str, shape: List[int]) -> Any:
    return callers.filled(shape, "float16", sum(request_id.encode()))


# ---------------------------------------------------------------- the encode worker (peer)


async def peer_encode_worker(chan: callers.Channel) -> None:
    """``generate`` (raw, shape): the read flow; ``write`` (raw): the write
    flow. Each ends with the encode worker's answer."""
    Request = protocol()
    connector = connect.Connector()
    await connector.initialize()
    while True:
        msg = await chan.arecv()
        if msg["event"] == "stop":
            return
        request = Request.model_validate_json(msg["raw"])
        if msg["event"] == "generate":
            embeddings = embeddings_of(request.request_id, msg["shape"])
            request.image_grid_thw = [[1, 2, 2]]
            request.embeddings_shape = tuple(callers.shape_of(embeddings))
            descriptor = connect.Descriptor(embeddings)
            with await connector.create_readable(descriptor) as readable:
                request.serialized_request = readable.metadata()
                request.multimodal_input.image_url = None
                chan.send("pd_request", raw=request.model_dump_json())
                output = MyRequestOutput.model_validate_json((await chan.arecv("pd_output"))["raw"])
                await readable.wait_for_completion()
                chan.send("output", raw=output.model_dump_json())
        else:
            assert isinstance(request.serialized_request, connect.RdmaMetadata)
            shape = list(request.embeddings_shape)
            descriptor = connect.Descriptor(embeddings_of(request.request_id, shape))
            write_op = await connector.begin_write(descriptor, request.serialized_request)
            await write_op.wait_for_completion()
            chan.send("written", raw=MyRequestOutput(request_id=request.request_id, text="", finished=True).model_dump_json())


# ---------------------------------------------------------------- tests


def test_read_flow_through_the_example_protocol():
    """Two requests, one after another: the PD worker reads the embeddings
    the encode worker's metadata (inside the pydantic request) describes."""
    Request = protocol()

    async def main():
        connector = connect.Connector()
        with Peer(__file__, "peer_encode_worker") as peer:
            for request_id, shape in [("req-a", [1, 576, 32]), ("req-b", [1, 3, 16, 8])]:
                request = Request(request_id=request_id, prompt_token_ids=[1, 2, 3], multimodal_input=MultiModalInput(image_url="http://x/cat.png"))
                peer.send("generate", raw=request.model_dump_json(), shape=shape)
                raw = (await peer.arecv("pd_request"))["raw"]
                assert type(raw) is str
                request = Request.model_validate_json(raw)
                assert isinstance(request.serialized_request, connect.RdmaMetadata)
                assert request.multimodal_input.image_url is None
                embeddings = callers.empty(request.embeddings_shape, "float16")
                descriptor = connect.Descriptor(embeddings)
                read_op = await connector.begin_read(request.serialized_request, descriptor)
                await read_op.wait_for_completion()
                assert callers.as_bytes(embeddings) == callers.as_bytes(embeddings_of(request_id, shape))
                request.serialized_request = None
                decode_request = copy.deepcopy(request)
                assert Request.model_validate_json(decode_request.model_dump_json()) == request
                out = MyRequestOutput(request_id=request_id, text="a cat", finished=True)
                peer.send("pd_output", raw=out.model_dump_json())
                assert MyRequestOutput.model_validate_json((await peer.arecv("output"))["raw"]) == out
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_write_flow_through_the_example_protocol():
    """The PD worker's writable metadata travels in the request; the encode
    worker writes the embeddings into it."""
    Request = protocol()
    shape = [1, 100, 24]

    async def main():
        connector = connect.Connector()
        await connector.initialize()
        with Peer(__file__, "peer_encode_worker") as peer:
            embeddings = callers.zeros(shape, "float16")
            descriptor = connect.Descriptor(embeddings)
            with await connector.create_writable(descriptor) as writable:
                request = Request(request_id="req-w", embeddings_shape=tuple(shape))
                request.serialized_request = writable.metadata()
                peer.send("write", raw=request.model_dump_json())
                await writable.wait_for_completion()
                await peer.arecv("written")
            assert callers.as_bytes(embeddings) == callers.as_bytes(embeddings_of("req-w", shape))
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_metadata_field_without_arbitrary_types():
    """A request model with an ``Optional[RdmaMetadata]`` field and no
    ``arbitrary_types_allowed``: it can be defined, validates the metadata
    on construction, dumps it to JSON and back (to an equal value) and keeps
    it through ``copy.deepcopy``; the metadata then reads in the other
    process."""
    shape = [2, 8, 8]

    class Request(BaseModel):
        request_id: str
        embeddings_shape: Optional[List[int]] = None
        serialized_request: Optional[connect.RdmaMetadata] = None

    assert Request(request_id="none").model_dump() == {"request_id": "none", "embeddings_shape": None, "serialized_request": None}

    async def main():
        connector = connect.Connector()
        embeddings = embeddings_of("req-s", shape)
        with await connector.create_readable(connect.Descriptor(embeddings)) as readable:
            request = Request(request_id="req-s", embeddings_shape=shape, serialized_request=readable.metadata())
            assert request.serialized_request == readable.metadata()
            assert copy.deepcopy(request) == request
            raw = request.model_dump_json()
            again = Request.model_validate_json(raw)
            assert again == request and isinstance(again.serialized_request, connect.RdmaMetadata)
            assert Request.model_validate(request.model_dump()) == request
            with Peer(__file__, "peer_read_strict") as peer:
                peer.send("read", raw=raw)
                await readable.wait_for_completion()
                assert (await peer.arecv("read"))["ok"] is True
                await peer.afinish()

    run_uvloop(main())


async def peer_read_strict(chan: callers.Channel) -> None:
    class Request(BaseModel):
        request_id: str
        embeddings_shape: Optional[List[int]] = None
        serialized_request: Optional[connect.RdmaMetadata] = None

    request = Request.model_validate_json((await chan.arecv("read"))["raw"])
    embeddings = callers.empty(request.embeddings_shape, "float16")
    connector = connect.Connector()
    read_op = await connector.begin_read(request.serialized_request, connect.Descriptor(embeddings))
    await read_op.wait_for_completion()
    chan.send("read", ok=callers.as_bytes(embeddings) == callers.as_bytes(embeddings_of(request.request_id, request.embeddings_shape)))
