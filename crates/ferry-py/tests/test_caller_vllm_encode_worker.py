"""Caller: ``dynamo/vllm/multimodal_handlers/encode_worker_handler.py``
(Dynamo 1.6.1), ``EncodeWorkerHandler`` in NIXL_READ mode, and the vLLM
prefill worker that reads its embeddings
(``dynamo/vllm/multimodal_utils/prefill_worker_utils.py``).

The encode handler (the peer process, on uvloop as ``dynamo.vllm`` runs)
makes, per request::

    # __init__ (inside the loop): NixlReadEmbeddingSender(), a checker task
    # async_init: self._connector = nixl_connect.Connector()
    request = vLLMMultimodalRequest.model_validate_json(raw)
    send_tasks = [asyncio.create_task(sender.send_embeddings(t, stage_embeddings=True))
                  for t in transfer_tensors]          # one per image, or one coalesced (Qwen-VL)
    transfer_requests = await asyncio.gather(*send_tasks)
    group.serialized_request = transfer_requests[i][0]   # a TransferRequest in the pydantic request
    send_complete_queue.put_nowait((transfer_requests[i][1], tensor))   # awaited by the checker task
    yield request.model_dump_json()

with ``send_embeddings`` being ``NixlReadEmbeddingSender``'s (create_readable
on the staged tensor itself, ``metadata().model_dump()``). The prefill
worker (this process, on uvloop) parses the response with
``model_validate_json``, and reads every group that carries a transfer with
``NixlReadEmbeddingReceiver(max_items=0)`` (``RdmaMetadata.model_validate``,
``begin_read``, ``wait_for_completion``), all at once (``create_task`` +
``gather``), splitting a coalesced tensor by the groups' shapes. The bytes of
every image's embeddings are checked, and every readable completes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Tuple, Union

import callers
from callers import Peer, run_uvloop
from pydantic import BaseModel, ConfigDict, Field
from test_caller_embedding_transfer import EmbeddingReceiver, EmbeddingSender, TransferRequest

import ferry as nixl_connect

HIDDEN = 64


class MultiModalInput(BaseModel):
    image_url: Optional[str] = None
    video_url: Optional[str] = None


class MultiModalGroup(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    multimodal_input: Optional[MultiModalInput] = Field(default_factory=MultiModalInput)
    image_grid_thw: Optional[List[Any]] = None
    embeddings_shape: Optional[Union[Tuple[int, int, int], Tuple[int, int, int, int]]] = None
    serialized_request: Optional[TransferRequest] = None


class vLLMMultimodalRequest(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    request_id: str
    multimodal_inputs: Optional[List[MultiModalGroup]] = Field(default_factory=list)


def image_embeddings(request_seed: int, index: int, tokens: int) -> Any:
    return callers.filled([1, tokens, HIDDEN], "float16", request_seed * 100 + index)


# ---------------------------------------------------------------- the encode worker (peer)


class EncodeWorkerHandler:
    def __init__(self) -> None:
        self.embedding_sender = EmbeddingSender()
        self.send_complete_queue: "asyncio.Queue[Tuple[Any, Any]]" = asyncio.Queue()
        self.checker = asyncio.create_task(self.check_complete())

    async def check_complete(self) -> None:
        while True:
            transfer_future, _embedding = await self.send_complete_queue.get()
            if transfer_future is None:
                self.send_complete_queue.task_done()
                return
            await transfer_future
            self.send_complete_queue.task_done()

    async def async_init(self) -> None:
        self._connector = nixl_connect.Connector()

    async def generate(self, raw: str, seed: int, tokens: List[int], coalesce: bool) -> str:
        request = vLLMMultimodalRequest.model_validate_json(raw)
        items = [image_embeddings(seed, i, n) for i, n in enumerate(tokens)]
        if coalesce:
            flat = [callers.as_bytes(t) for t in items]
            combined = callers.frombuffer_u8(bytearray(b"".join(flat)))
            transfer_tensors = [callers.view_as(combined, "float16", [1, sum(tokens), HIDDEN])]
            transfer_indices: List[Optional[int]] = [0] + [None] * (len(items) - 1)
        else:
            transfer_tensors = items
            transfer_indices = list(range(len(items)))
        send_tasks = [
            asyncio.create_task(self.embedding_sender.send_embeddings(t, stage_embeddings=True)) for t in transfer_tensors
        ]
        transfer_requests = await asyncio.gather(*send_tasks)
        for idx, item in enumerate(items):
            group = request.multimodal_inputs[idx]
            assert group.multimodal_input is not None
            group.multimodal_input.image_url = None
            group.embeddings_shape = tuple(callers.shape_of(item))  # type: ignore[assignment]
            t = transfer_indices[idx]
            group.serialized_request = None if t is None else transfer_requests[t][0]
        for transfer_request, transfer_tensor in zip(transfer_requests, transfer_tensors):
            self.send_complete_queue.put_nowait((transfer_request[1], transfer_tensor))
        return request.model_dump_json()


async def peer_encode_worker(chan: callers.Channel) -> None:
    """Serves the ``generate`` requests of one message concurrently, sends
    each payload, then says ``sent`` once the checker drained the queue."""
    handler = EncodeWorkerHandler()
    await handler.async_init()
    msg = await chan.arecv("generate")

    async def serve(req: Dict[str, Any]) -> None:
        payload = await handler.generate(req["raw"], req["seed"], req["tokens"], msg["coalesce"])
        chan.send("payload", seed=req["seed"], payload=payload)

    await asyncio.gather(*(serve(r) for r in msg["requests"]))
    await asyncio.wait_for(handler.send_complete_queue.join(), callers.TIMEOUT)
    handler.send_complete_queue.put_nowait((None, None))
    await asyncio.wait_for(handler.checker, callers.TIMEOUT)
    chan.send("sent")
    await chan.arecv("stop")


# ---------------------------------------------------------------- the prefill worker (this process)


async def receive_groups(receiver: EmbeddingReceiver, groups: List[MultiModalGroup]) -> List[Any]:
    """Reads every group's embeddings; returns one tensor per group."""
    transfer_group_indices = [i for i, g in enumerate(groups) if g.serialized_request is not None]
    tasks = [asyncio.create_task(receiver.receive_embeddings(groups[i].serialized_request)) for i in transfer_group_indices]  # type: ignore[arg-type]
    loaded = await asyncio.gather(*tasks)
    per_group: List[Any] = []
    for pos, (group_idx, (tensor_id, embedding)) in enumerate(zip(transfer_group_indices, loaded)):
        end = transfer_group_indices[pos + 1] if pos + 1 < len(transfer_group_indices) else len(groups)
        run = groups[group_idx:end]
        data = callers.as_bytes(embedding)
        offset = 0
        for g in run:
            assert g.embeddings_shape is not None
            n = callers.itemsize("float16")
            for s in g.embeddings_shape:
                n *= s
            per_group.append(data[offset : offset + n])
            offset += n
        assert offset == len(data)
        receiver.release_tensor(tensor_id)
    return per_group


def run_requests(tokens_per_request: List[List[int]], coalesce: bool) -> None:
    async def main():
        receiver = EmbeddingReceiver(max_items=0)
        requests = []
        for seed, tokens in enumerate(tokens_per_request, start=1):
            req = vLLMMultimodalRequest(
                request_id=f"req-{seed}",
                multimodal_inputs=[MultiModalGroup(multimodal_input=MultiModalInput(image_url=f"http://x/{i}.png")) for i in range(len(tokens))],
            )
            requests.append({"raw": req.model_dump_json(), "seed": seed, "tokens": tokens})
        with Peer(__file__, "peer_encode_worker") as peer:
            peer.send("generate", requests=requests, coalesce=coalesce)
            payloads = [await peer.arecv("payload") for _ in requests]
            outputs = [(p["seed"], vLLMMultimodalRequest.model_validate_json(p["payload"])) for p in payloads]
            received = await asyncio.gather(*(receive_groups(receiver, out.multimodal_inputs or []) for _, out in outputs))
            for (seed, out), parts in zip(outputs, received):
                tokens = tokens_per_request[seed - 1]
                assert [g.multimodal_input.image_url for g in out.multimodal_inputs or []] == [None] * len(tokens)  # type: ignore[union-attr]
                assert parts == [callers.as_bytes(image_embeddings(seed, i, n)) for i, n in enumerate(tokens)]
            await peer.arecv("sent")
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_per_image_transfers_of_two_concurrent_requests():
    """LLaVA-style: one transfer per image; two requests served at once."""
    run_requests([[24, 8, 40], [5]], coalesce=False)


def test_coalesced_qwen_vl_transfer_is_split_by_group_shapes():
    """Qwen-VL-style: the images of a request travel as one tensor, carried
    by the first group; the prefill worker splits it by the groups' shapes."""
    run_requests([[16, 4, 30], [2, 2]], coalesce=True)
