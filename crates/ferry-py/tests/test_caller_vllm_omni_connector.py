"""Caller: ``dynamo/vllm/omni/connectors/nixl_connector.py`` (Dynamo 1.6.1),
``DynamoOmniNixlConnector``: vllm-omni's synchronous put/get connector, run
on an event loop of its own in a background thread.

Both stages build it from synchronous code, so the ``Connector`` is created
in a thread where no loop runs and used from another::

    self._connector = nixl_connect.Connector()          # main thread, no loop
    # put (on the connector's loop thread, called through run_coroutine_threadsafe):
    descriptors = [nixl_connect.Descriptor(t) for t in tensors]
    readable_op = await self._connector.create_readable(descriptors[0] if one else descriptors)
    task = asyncio.create_task(wait_release())           # await readable_op.wait_for_completion()
    self._pending[key] = (token, readable_op, tensors, task, deadline)
    {"rdma_metadata": readable_op.metadata().model_dump(), "tensor_specs": [...], ...}
    # get:
    rdma_meta = nixl_connect.RdmaMetadata.model_validate(metadata["rdma_metadata"])
    read_op = await self._connector.begin_read(rdma_meta, descriptor or list)
    await read_op.wait_for_completion()
    # cleanup(key) / a duplicate key / close(): task.cancel(), the entry is
    # popped: the ReadableOperation is dropped, not exited.

The sender stage is the peer process (plain synchronous code), the receiver
stage this process. Checked: the payloads (one tensor, a list of tensors of
several dtypes, a serialized object) arrive intact; the sender's pending
entries empty as the reads complete, and the operations' ``status``, polled
from the synchronous main thread, is COMPLETE; a dropped readable (cleanup,
replaced key) can no longer be read (the get fails with a RuntimeError).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

import callers
from callers import Peer

import ferry as nixl_connect


class OmniNixlConnector:
    """The connector's NIXL calls, its loop thread and its pending table."""

    def __init__(self) -> None:
        self._connector = nixl_connect.Connector()
        self._pending: Dict[str, Tuple[str, Any, Any, "asyncio.Task[Any]", float]] = {}
        self.last_error: Optional[BaseException] = None
        ready = threading.Event()

        def loop_main() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=loop_main, daemon=True)
        self._thread.start()
        assert ready.wait(5)

    def _run_in_loop(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(callers.TIMEOUT)

    def _cancel_pending(self, key: str) -> None:
        pending = self._pending.pop(key, None)
        if pending is not None and not pending[3].done():
            pending[3].cancel()

    async def _put_async(self, key: str, data: Any) -> Optional[Dict[str, Any]]:
        try:
            if isinstance(data, list) or callers.torch is not None and isinstance(data, callers.torch.Tensor) or hasattr(data, "dtype"):
                tensors = data if isinstance(data, list) else [data]
                kind = "tensor_list"
            else:
                tensors = [callers.frombuffer_u8(bytearray(json.dumps(data).encode()))]
                kind = "serialized_obj"
            specs = [{"shape": callers.shape_of(t), "dtype": callers.dtype_name(t), "size": callers.nbytes(t)} for t in tensors]
            descriptors = [nixl_connect.Descriptor(t) for t in tensors]
            readable_op = await self._connector.create_readable(descriptors[0] if len(descriptors) == 1 else descriptors)
            if key in self._pending:
                self._cancel_pending(key)
            token = str(id(readable_op))

            async def wait_release() -> None:
                try:
                    await readable_op.wait_for_completion()
                finally:
                    if (p := self._pending.get(key)) and p[0] == token:
                        self._pending.pop(key, None)

            task = asyncio.create_task(wait_release())
            self._pending[key] = (token, readable_op, tensors, task, time.monotonic() + 300)
            return {
                "schema_version": 1,
                "kind": kind,
                "rdma_metadata": readable_op.metadata().model_dump(),
                "tensor_specs": specs,
                "size": sum(s["size"] for s in specs),
            }
        except Exception as e:
            self.last_error = e
            return None

    async def _get_async(self, metadata: Dict[str, Any]) -> Optional[Tuple[Any, int]]:
        try:
            rdma_meta = nixl_connect.RdmaMetadata.model_validate(metadata["rdma_metadata"])
            local_tensors = [callers.empty(s["shape"], s["dtype"]) for s in metadata["tensor_specs"]]
            local_descriptors = [nixl_connect.Descriptor(t) for t in local_tensors]
            read_op = await self._connector.begin_read(
                rdma_meta, local_descriptors[0] if len(local_descriptors) == 1 else local_descriptors
            )
            await read_op.wait_for_completion()
            if metadata["kind"] == "serialized_obj":
                result: Any = json.loads(callers.as_bytes(local_tensors[0]))
            else:
                result = local_tensors[0] if len(local_tensors) == 1 else local_tensors
            return result, metadata["size"]
        except Exception as e:
            self.last_error = e
            return None

    def put(self, key: str, data: Any) -> Optional[Dict[str, Any]]:
        return self._run_in_loop(self._put_async(key, data))

    def get(self, metadata: Dict[str, Any]) -> Optional[Tuple[Any, int]]:
        return self._run_in_loop(self._get_async(metadata))

    def cleanup(self, key: str) -> None:
        async def cleanup_request() -> None:
            self._cancel_pending(key)

        self._run_in_loop(cleanup_request())

    def pending_count(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        async def close_async() -> None:
            for key in tuple(self._pending):
                self._cancel_pending(key)

        self._run_in_loop(close_async())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def payloads(seed: int) -> Dict[str, Any]:
    return {
        "one": callers.filled([3, 64, 64], "float16", seed),
        "list": [
            callers.filled([10], "int64", seed + 1),
            callers.filled([2, 2, 2], "uint8", seed + 2),
            callers.filled([1000], "float32", seed + 3),
        ],
        "obj": {"latents": [1.5, 2.5], "prompt": "a cat", "step": seed},
    }


def same(a: Any, b: Any) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a == b
    return callers.shape_of(a) == callers.shape_of(b) and callers.as_bytes(a) == callers.as_bytes(b)


# ---------------------------------------------------------------- the sender stage (peer, sync)


def wait_dropped(refs: List[Any]) -> bool:
    """Whether every operation in `refs` has been freed (within 5 s; the
    loop thread processes the cancellation meanwhile)."""
    deadline = time.monotonic() + 5
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        time.sleep(0.01)
    return all(r() is None for r in refs)


def peer_stage(chan: callers.Channel) -> None:
    """Handles ``put`` (seed, keys), ``cleanup`` (key) and ``settle`` (wait
    until nothing is pending, polling the operations' status from this
    synchronous thread), then ``close``."""
    connector = OmniNixlConnector()
    ops: Dict[str, Any] = {}
    while True:
        msg = chan.recv()
        if msg["event"] == "put":
            data = payloads(msg["seed"])
            metadata, replaced = {}, []
            for key in msg["keys"]:
                name = msg.get("as", key)
                if name in ops:
                    replaced.append(ops[name])
                metadata[key] = connector.put(name, data[key])
                assert metadata[key] is not None, repr(connector.last_error)
                ops[name] = weakref.ref(connector._pending[name][1])
            chan.send("metadata", metadata=metadata, replaced_dropped=wait_dropped(replaced))
        elif msg["event"] == "cleanup":
            connector.cleanup(msg["key"])
            chan.send("cleaned", dropped=wait_dropped([ops.pop(msg["key"])]))
        elif msg["event"] == "settle":
            deadline = time.monotonic() + callers.TIMEOUT
            while connector.pending_count() and time.monotonic() < deadline:
                time.sleep(0.005)
            statuses = {k: str(r().status.name) if r() is not None else "DROPPED" for k, r in ops.items()}
            chan.send("settled", pending=connector.pending_count(), statuses=statuses)
        elif msg["event"] == "close":
            connector.close()
            chan.send("closed", pending=connector.pending_count())
            return


# ---------------------------------------------------------------- tests


def test_put_then_get_each_payload_kind():
    with Peer(__file__, "peer_stage", loop="sync") as peer:
        receiver = OmniNixlConnector()
        try:
            peer.send("put", seed=5, keys=["one", "list", "obj"])
            metadata = peer.recv("metadata")["metadata"]
            expected = payloads(5)
            for key in ["one", "list", "obj"]:
                got = receiver.get(metadata[key])
                assert got is not None, repr(receiver.last_error)
                assert same(expected[key], got[0]), key
                assert got[1] == metadata[key]["size"]
            peer.send("settle")
            settled = peer.recv("settled")
            assert settled["pending"] == 0
            assert all(s in ("COMPLETE", "DROPPED") for s in settled["statuses"].values()), settled
            peer.send("close")
            assert peer.recv("closed")["pending"] == 0
            peer.finish()
        finally:
            receiver.close()


def test_cleanup_drops_the_readable():
    """cleanup(key) cancels the waiting task and forgets the operation
    without exiting it: it is freed, and a get of it fails with a
    RuntimeError; the other key is unaffected."""
    with Peer(__file__, "peer_stage", loop="sync") as peer:
        receiver = OmniNixlConnector()
        try:
            peer.send("put", seed=6, keys=["one", "obj"])
            metadata = peer.recv("metadata")["metadata"]
            peer.send("cleanup", key="one")
            assert peer.recv("cleaned")["dropped"] is True
            assert receiver.get(metadata["one"]) is None
            assert isinstance(receiver.last_error, RuntimeError), repr(receiver.last_error)
            got = receiver.get(metadata["obj"])
            assert got is not None and got[0] == payloads(6)["obj"], repr(receiver.last_error)
            peer.send("close")
            peer.recv("closed")
            peer.finish()
        finally:
            receiver.close()


def test_put_under_a_pending_key_replaces_it():
    """A second put under the same request id cancels the first entry (the
    first readable is dropped): its metadata no longer reads, the new one
    does. close() then cancels what is still pending."""
    with Peer(__file__, "peer_stage", loop="sync") as peer:
        receiver = OmniNixlConnector()
        try:
            peer.send("put", seed=7, keys=["one"], **{"as": "req"})
            first = peer.recv("metadata")["metadata"]["one"]
            peer.send("put", seed=8, keys=["list"], **{"as": "req"})
            answer = peer.recv("metadata")
            assert answer["replaced_dropped"] is True
            second = answer["metadata"]["list"]
            assert receiver.get(first) is None
            assert isinstance(receiver.last_error, RuntimeError), repr(receiver.last_error)
            got = receiver.get(second)
            assert got is not None and same(payloads(8)["list"], got[0]), repr(receiver.last_error)
            peer.send("put", seed=9, keys=["obj"])
            peer.recv("metadata")
            peer.send("close")
            assert peer.recv("closed")["pending"] == 0
            peer.finish()
        finally:
            receiver.close()
