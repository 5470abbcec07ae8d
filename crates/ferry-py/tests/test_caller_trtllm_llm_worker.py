"""Caller: ``dynamo/trtllm/workers/llm_worker.py`` (Dynamo 1.6.1), the
TRT-LLM worker's start-up, and the handlers it hands its connector to
(``request_handlers/handler_base.py``, ``handlers.py``).

At start, inside ``uvloop.run(worker())``, a worker that needs NIXL makes::

    try:
        connector = nixl_connect.Connector()
        await connector._create_connection()
    except Exception:
        connector = None

and stores it in its handler config (``connector: Optional[Connector] =
None``, ``from dynamo.nixl_connect import Connector``). The encode handler
then serves each request with ``EncodeHelper``'s readable-in-a-``with``
generator, the prefill handler reads each response with ``begin_read`` and
``with read_op: await read_op.wait_for_completion()``; requests are in
flight concurrently on both workers.

Checked here: ``_create_connection`` is a coroutine returning a
``Connection`` of that connector, the same one every time, from any loop
(the descriptor pools of the multimodal receivers depend on it); the start-up
sequence works on uvloop in both processes; three concurrent requests move
their bytes; the handler config can name the type.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import Any, Dict, List, Optional

import callers
from callers import Peer, run_async, run_uvloop

import ferry as nixl_connect
from ferry import Connector


@dataclasses.dataclass
class HandlerConfig:
    """The part of the handler config that holds the connector."""

    modality: str = "multimodal"
    connector: Optional[Connector] = None
    startup_error: Optional[str] = None  # what the worker logs and goes on without


async def start_worker(needs_nixl: bool = True) -> HandlerConfig:
    """The worker's start-up, as far as NIXL goes."""
    connector, error = None, None
    if needs_nixl:
        try:
            connector = nixl_connect.Connector()
            await connector._create_connection()
        except Exception as e:
            connector, error = None, f"{type(e).__name__}: {e}"
    return HandlerConfig(connector=connector, startup_error=error)


# ---------------------------------------------------------------- the encode worker (peer)


async def encode_one(connector: Any, spec: Dict[str, Any], chan: callers.Channel) -> None:
    encodings = callers.filled(spec["shape"], spec["dtype"], spec["seed"])
    descriptor = nixl_connect.Descriptor(encodings)
    with await connector.create_readable(descriptor) as readable_op:
        op_metadata = readable_op.metadata()
        chan.send(
            "response",
            response={
                "nixl_readable_metadata": op_metadata.model_dump(),
                "embeddings_shape": spec["shape"],
                "embeddings_dtype": "torch." + spec["dtype"],
                "seed": spec["seed"],
            },
        )
        await readable_op.wait_for_completion()


async def peer_encode_worker(chan: callers.Channel) -> None:
    """Starts like the TRT-LLM worker, then serves the ``encode`` specs all
    at once; says ``done`` when every readable completed."""
    config = await start_worker()
    assert config.connector is not None, config.startup_error
    msg = await chan.arecv("encode")
    await asyncio.wait_for(
        asyncio.gather(*(encode_one(config.connector, spec, chan) for spec in msg["specs"])), callers.TIMEOUT
    )
    chan.send("done")
    await chan.arecv("stop")


# ---------------------------------------------------------------- tests


def test_create_connection_returns_the_connectors_one_connection():
    """The start-up call and its result: a coroutine function, a Connection
    whose connector is this one; the same object on every call, from this
    loop, from run_async's thread (another loop) and from plain asyncio."""
    assert inspect.iscoroutinefunction(nixl_connect.Connector._create_connection)

    async def main():
        connector = nixl_connect.Connector()
        first = await connector._create_connection()
        assert isinstance(first, nixl_connect.Connection)
        assert first.connector is connector
        assert isinstance(first.name, str) and first.name
        assert await connector._create_connection() is first
        assert run_async(connector._create_connection) is first
        return connector, first

    connector, first = run_uvloop(main())
    assert run_async(connector._create_connection) is first


def test_connections_of_two_connectors_differ():
    async def main():
        a, b = nixl_connect.Connector(), nixl_connect.Connector()
        ca, cb = await a._create_connection(), await b._create_connection()
        assert ca is not cb and ca.connector is a and cb.connector is b

    run_uvloop(main())


def test_start_up_sequence_then_concurrent_requests():
    """Both workers start the TRT-LLM way (on uvloop); three requests are
    in flight at once, each read by the prefill handler's `with read_op`."""
    specs: List[Dict[str, Any]] = [
        {"shape": [1, 64, 32], "dtype": "float16", "seed": 11},
        {"shape": [1, 1, 1], "dtype": "float32", "seed": 12},
        {"shape": [4, 300, 16], "dtype": "bfloat16", "seed": 13},
    ]

    async def read(connector: Any, response: Dict[str, Any]) -> Any:
        readable_metadata = nixl_connect.RdmaMetadata.model_validate(response["nixl_readable_metadata"])
        tensor = callers.zeros(response["embeddings_shape"], response["embeddings_dtype"].removeprefix("torch."))
        read_op = await connector.begin_read(readable_metadata, nixl_connect.Descriptor(tensor))
        with read_op:
            await read_op.wait_for_completion()
        return response["seed"], tensor

    async def main():
        config = await start_worker()
        assert config.connector is not None, config.startup_error
        with Peer(__file__, "peer_encode_worker") as peer:
            peer.send("encode", specs=specs)
            responses = [(await peer.arecv("response"))["response"] for _ in specs]
            results = dict(await asyncio.gather(*(read(config.connector, r) for r in responses)))
            for spec in specs:
                expected = callers.filled(spec["shape"], spec["dtype"], spec["seed"])
                assert callers.as_bytes(results[spec["seed"]]) == callers.as_bytes(expected)
            await peer.arecv("done")
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())

