"""Callers: Dynamo's own tests of the module, ``lib/bindings/python/tests/
test_nixl_*.py`` (``test_nixl_connect_unit.py``, ``test_nixl_remote_lifetime.py``,
``test_nixl_passive_notifications.py``, ``test_nixl_connect_device_kind.py``,
``test_nixl_connect_lazy_import.py``).

Those tests replace the native NIXL agent with mocks; here the same calls,
in the same order, run against a real remote worker (the peer process):

- operations built directly from a ``Connection``:
  ``connection = nixl_connect.Connection(nixl_connect.Connector(), 1)``,
  ``ReadableOperation(connection, local)``, ``WritableOperation(connection, local)``,
  ``ReadOperation(connection, metadata, local)``, ``WriteOperation(connection,
  local, metadata)``, with metadata rebuilt field by field as
  ``RdmaMetadata(descriptors=[SerializedDescriptor(ptr=, size=, device=)],
  operation_kind=, notification_key=, nixl_metadata=)``;
- descriptors reused across operations: an old operation's ``__exit__`` and
  destruction (``del``, ``gc.collect()``) leave the descriptors of the current
  one registered (``is_registered``) and the transfer intact;
  ``deregister_with_connector`` / ``register_with_connector`` by hand;
- a failed transfer: ``await op.wait_for_completion()`` raises ``RuntimeError``;
- ``Remote(connection, nixl_metadata)`` shared and released (``__exit__``
  twice, from several threads);
- passive ``status`` polled from synchronous code (and from two threads at
  once): COMPLETE for the operations the remote finished, INITIALIZED for
  the one it did not, however many have completed before;
- ``DeviceKind.nixl_mem_type`` and ``str(DeviceKind)``;
- the module imports where torch, cupy and nixl cannot be imported.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import callers
import pytest
from callers import Peer, run_asyncio

import ferry as nixl_connect


def pattern(seed: int, sizes: List[int]) -> List[bytes]:
    return [callers.as_bytes(callers.filled([n], "uint8", seed + i)) for i, n in enumerate(sizes)]


def buffers(sizes: List[int], seed: Any = None) -> List[Any]:
    if seed is None:
        return [callers.zeros([n], "uint8") for n in sizes]
    return [callers.filled([n], "uint8", seed + i) for i, n in enumerate(sizes)]


def rebuilt(meta: Any) -> Any:
    """The metadata rebuilt from its fields, the way Dynamo's tests build it."""
    return nixl_connect.RdmaMetadata(
        descriptors=[nixl_connect.SerializedDescriptor(ptr=d.ptr, size=d.size, device=d.device) for d in meta.descriptors],
        operation_kind=meta.operation_kind,
        notification_key=meta.notification_key,
        nixl_metadata=meta.nixl_metadata,
    )


def wait_status(op: Any, want: Any, timeout: float = callers.TIMEOUT) -> Any:
    """Polls ``op.status`` from synchronous code (no event loop runs)."""
    deadline = time.monotonic() + timeout
    status = op.status
    while status is not want and time.monotonic() < deadline:
        time.sleep(0.002)
        status = op.status
    return status


# ---------------------------------------------------------------- the remote worker (peer)


async def peer_worker(chan: callers.Channel) -> None:
    """``expose`` (kind, sizes, seed, n, via): n passive operations (each
    over its own buffers), their metadata JSON, then ``exposed`` with each
    one's outcome; ``read`` / ``write`` (metadata, sizes, seed): the active
    side, answered by ``done``. Two connectors: ``via`` picks one."""
    connectors = [nixl_connect.Connector(), nixl_connect.Connector()]
    tasks = set()

    async def expose(msg: Dict[str, Any]) -> None:
        readable = msg["kind"] == "readable"
        connector = connectors[msg.get("via", 0)]
        ops, bufs = [], []
        for _ in range(msg["n"]):
            b = buffers(msg["sizes"], msg["seed"] if readable else None)
            descs = [nixl_connect.Descriptor(x) for x in b]
            local = descs[0] if len(descs) == 1 else descs
            ops.append(await (connector.create_readable(local) if readable else connector.create_writable(local)))
            bufs.append(b)
        chan.send("metadata", metadata=[op.metadata().model_dump_json() for op in ops])
        outcomes = []
        for op, b in zip(ops, bufs):
            try:
                await asyncio.wait_for(op.wait_for_completion(), msg.get("timeout", callers.TIMEOUT))
                error = None
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
            verified = readable or [callers.as_bytes(x) for x in b] == pattern(msg["seed"], msg["sizes"])
            outcomes.append({"status": op.status.name, "error": error, "verified": verified})
            op.__exit__(None, None, None)
        chan.send("exposed", outcomes=outcomes)

    async def active(msg: Dict[str, Any]) -> None:
        meta = nixl_connect.RdmaMetadata.model_validate_json(msg["metadata"])
        reading = msg["event"] == "read"
        b = buffers(msg["sizes"], None if reading else msg["seed"])
        descs = [nixl_connect.Descriptor(x) for x in b]
        local = descs[0] if len(descs) == 1 else descs
        try:
            if reading:
                op = await connectors[0].begin_read(meta, local)
            else:
                op = await connectors[0].begin_write(local, meta)
            with op:
                await op.wait_for_completion()
        except Exception as e:
            chan.send("done", verified=False, error=f"{type(e).__name__}: {e}")
            return
        verified = not reading or [callers.as_bytes(x) for x in b] == pattern(msg["seed"], msg["sizes"])
        chan.send("done", verified=verified, error=None)

    while True:
        msg = await chan.arecv()
        if msg["event"] == "stop":
            break
        task = asyncio.ensure_future(expose(msg) if msg["event"] == "expose" else active(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.wait_for(asyncio.gather(*tasks), callers.TIMEOUT)


def remote_metadata(peer: Peer, kind: str, sizes: List[int], seed: int, n: int = 1, **extra: Any) -> List[Any]:
    peer.send("expose", kind=kind, sizes=sizes, seed=seed, n=n, **extra)
    return [nixl_connect.RdmaMetadata.model_validate_json(m) for m in peer.recv("metadata")["metadata"]]


def make_operation(connection: Any, kind: str, local: Any, meta: Any = None) -> Any:
    if kind == "readable":
        return nixl_connect.ReadableOperation(connection, local)
    if kind == "writable":
        return nixl_connect.WritableOperation(connection, local)
    if kind == "read":
        return nixl_connect.ReadOperation(connection, rebuilt(meta), local)
    return nixl_connect.WriteOperation(connection, local, rebuilt(meta))


PASSIVE_OF = {"read": "readable", "write": "writable"}


def complete(peer: Peer, kind: str, op: Any, sizes: List[int], seed: int, local_bufs: List[Any]) -> None:
    """Has the remote (or this side) finish `op`, then checks the bytes."""
    if kind in ("readable", "writable"):
        peer.send("read" if kind == "readable" else "write", metadata=op.metadata().model_dump_json(), sizes=sizes, seed=seed)
        run_asyncio(op.wait_for_completion())
        done = peer.recv("done")
        assert done["verified"] is True, done
        if kind == "writable":
            assert [callers.as_bytes(b) for b in local_bufs] == pattern(seed, sizes)
    else:
        run_asyncio(op.wait_for_completion())
        if kind == "read":
            assert [callers.as_bytes(b) for b in local_bufs] == pattern(seed, sizes)


# ---------------------------------------------------------------- test_nixl_connect_unit.py


@pytest.mark.parametrize("kind", ["read", "write", "readable", "writable"])
@pytest.mark.parametrize("descriptor_count", [1, 2])
def test_old_operation_destruction_preserves_reused_registration(kind, descriptor_count):
    """An operation exited, then another on the same descriptors, then the
    first destroyed: the descriptors stay registered and the second
    operation moves its bytes."""
    sizes = [64, 4096][:descriptor_count]
    seed = 20 + descriptor_count
    with Peer(__file__, "peer_worker") as peer:
        metas = remote_metadata(peer, PASSIVE_OF[kind], sizes, seed, n=2) if kind in PASSIVE_OF else [None, None]
        connection = nixl_connect.Connection(nixl_connect.Connector(), 1)
        local_bufs = buffers(sizes, seed if kind in ("readable", "write") else None)
        descs = [nixl_connect.Descriptor(b) for b in local_bufs]
        local = descs[0] if descriptor_count == 1 else descs
        old = make_operation(connection, kind, local, metas[0])
        old.__exit__(None, None, None)
        current = make_operation(connection, kind, local, metas[1])
        try:
            del old
            gc.collect()
            assert all(d.is_registered for d in descs)
            complete(peer, kind, current, sizes, seed, local_bufs)
        finally:
            current.__exit__(None, None, None)
        if kind in PASSIVE_OF:
            outcomes = peer.recv("exposed")["outcomes"]
            assert outcomes[1]["status"] == "COMPLETE" and outcomes[1]["verified"], outcomes
            assert outcomes[0]["status"] in ("CANCELLED", "ERRORED", "COMPLETE"), outcomes
        peer.send("stop")
        peer.finish()


def test_release_does_not_claim_later_registration():
    """Deregistered by hand and registered again by a newer operation: the
    older operation's exit leaves the newer registration alone."""
    with Peer(__file__, "peer_worker") as peer:
        connection = nixl_connect.Connection(nixl_connect.Connector(), 1)
        local = [nixl_connect.Descriptor(b) for b in buffers([128], 30)]
        old = make_operation(connection, "readable", local)
        local[0].deregister_with_connector(connection)
        current = make_operation(connection, "readable", local)
        try:
            old.__exit__(None, None, None)
            assert local[0].is_registered
            complete(peer, "readable", current, [128], 30, [])
        finally:
            current.__exit__(None, None, None)
        peer.send("stop")
        peer.finish()


def test_release_preserves_preregistered_duplicate_descriptor_behavior():
    """A descriptor registered by hand, listed twice in one readable: the
    remote reads it, and after the operation's exit (twice) the descriptor
    is no longer registered."""
    with Peer(__file__, "peer_worker") as peer:
        connection = nixl_connect.Connection(nixl_connect.Connector(), 1)
        (buf,) = buffers([256], 31)
        descriptor = nixl_connect.Descriptor(buf)
        descriptor.register_with_connector(connection)
        op = make_operation(connection, "readable", [descriptor, descriptor])
        peer.send("read", metadata=op.metadata().model_dump_json(), sizes=[256, 256], seed=0)
        run_asyncio(op.wait_for_completion())
        assert peer.recv("done")["error"] is None
        op.__exit__(None, None, None)
        op.__exit__(None, None, None)
        assert not descriptor.is_registered
        peer.send("stop")
        peer.finish()


@pytest.mark.parametrize("failure", ["withdrawn", "killed"])
def test_wait_for_completion_raises_runtime_error_when_errored(failure):
    """The transfer cannot complete (the remote withdrew its readable, or
    its process died): begin_read and wait_for_completion end in a
    RuntimeError, and the operation, if one was made, is ERRORED."""
    with Peer(__file__, "peer_worker") as peer:
        (meta,) = remote_metadata(peer, "readable", [1 << 16], 40, timeout=0.01 if failure == "withdrawn" else callers.TIMEOUT)
        if failure == "withdrawn":
            peer.recv("exposed")  # its wait timed out and it left the operation
        else:
            peer.kill()
        connector = nixl_connect.Connector()
        made = []

        async def read() -> None:
            op = await connector.begin_read(meta, nixl_connect.Descriptor(callers.zeros([1 << 16], "uint8")))
            made.append(op)
            await op.wait_for_completion()

        with pytest.raises(RuntimeError):
            run_asyncio(read())
        if made:
            assert made[0].status is nixl_connect.OperationStatus.ERRORED


# ---------------------------------------------------------------- test_nixl_remote_lifetime.py


def test_shared_remote_is_released_once_per_holder():
    """Remotes of one peer share its name; each holder releases once (a
    second __exit__ is harmless), also from several threads at once; the
    connection still reads from and is read by that peer afterwards."""
    with Peer(__file__, "peer_worker") as peer:
        (peer_meta,) = remote_metadata(peer, "readable", [32], 50)
        (other_meta,) = remote_metadata(peer, "readable", [32], 51, via=1, timeout=1)
        connection = nixl_connect.Connection(nixl_connect.Connector(), 1)
        first = nixl_connect.Remote(connection, peer_meta.nixl_metadata)
        second = nixl_connect.Remote(connection, peer_meta.nixl_metadata)
        other = nixl_connect.Remote(connection, other_meta.nixl_metadata)
        assert first.connection is connection and str(first) == first.name
        assert first.name == second.name != other.name
        first.__exit__(None, None, None)
        first.__exit__(None, None, None)
        with ThreadPoolExecutor(max_workers=4) as pool:
            made = list(pool.map(lambda _: nixl_connect.Remote(connection, peer_meta.nixl_metadata), range(8)))
            list(pool.map(lambda r: r.__exit__(None, None, None), made + [second]))
        other.__exit__(None, None, None)
        # The connection still works both ways with that remote.
        readable = make_operation(connection, "readable", nixl_connect.Descriptor(buffers([8], 52)[0]))
        complete(peer, "readable", readable, [8], 52, [])
        readable.__exit__(None, None, None)
        buf = callers.zeros([32], "uint8")
        op = make_operation(connection, "read", nixl_connect.Descriptor(buf), peer_meta)
        complete(peer, "read", op, [32], 50, [buf])
        op.__exit__(None, None, None)
        peer.send("stop")
        peer.finish(timeout=5)


# ---------------------------------------------------------------- test_nixl_passive_notifications.py


def test_completed_notifications_do_not_accumulate():
    """64 readables of one connection, read by the remote one after another:
    each one's status, polled from synchronous code, is COMPLETE."""
    with Peer(__file__, "peer_worker") as peer:
        connection = nixl_connect.Connection(nixl_connect.Connector(), 1)
        for i in range(64):
            op = make_operation(connection, "readable", nixl_connect.Descriptor(buffers([4], i)[0]))
            assert op.status is nixl_connect.OperationStatus.INITIALIZED
            peer.send("read", metadata=op.metadata().model_dump_json(), sizes=[4], seed=i)
            assert wait_status(op, nixl_connect.OperationStatus.COMPLETE) is nixl_connect.OperationStatus.COMPLETE
            done = peer.recv("done")
            assert done["verified"] is True, done
            op.__exit__(None, None, None)
        peer.send("stop")
        peer.finish()


def test_consumption_preserves_other_notifications():
    """Four readables; the remote reads three, in another order: those are
    COMPLETE, the fourth stays INITIALIZED, and asking again changes nothing."""
    with Peer(__file__, "peer_worker") as peer:
        connection = nixl_connect.Connection(nixl_connect.Connector(), 1)
        first, second, third, pending = [
            make_operation(connection, "readable", nixl_connect.Descriptor(buffers([16], 60 + i)[0])) for i in range(4)
        ]
        for i, op in [(1, second), (0, first), (2, third)]:
            peer.send("read", metadata=op.metadata().model_dump_json(), sizes=[16], seed=60 + i)
            done = peer.recv("done")
            assert done["verified"] is True, done
        assert pending.status is nixl_connect.OperationStatus.INITIALIZED
        for op in (first, second, third):
            assert wait_status(op, nixl_connect.OperationStatus.COMPLETE) is nixl_connect.OperationStatus.COMPLETE
        assert pending.status is nixl_connect.OperationStatus.INITIALIZED
        assert first.status is nixl_connect.OperationStatus.COMPLETE
        for op in (first, second, third, pending):
            op.__exit__(None, None, None)
        peer.send("stop")
        peer.finish()


@pytest.mark.parametrize("same_operation", [False, True])
def test_concurrent_status_from_two_threads(same_operation):
    """Two threads poll the status of two readables (or of the same one)
    while the remote reads them: both see COMPLETE."""
    with Peer(__file__, "peer_worker") as peer:
        connection = nixl_connect.Connection(nixl_connect.Connector(), 1)
        first = make_operation(connection, "readable", nixl_connect.Descriptor(buffers([512], 70)[0]))
        second = first if same_operation else make_operation(connection, "readable", nixl_connect.Descriptor(buffers([512], 71)[0]))
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = [pool.submit(wait_status, op, nixl_connect.OperationStatus.COMPLETE) for op in (first, second)]
            for i, op in enumerate({id(first): first, id(second): second}.values()):
                peer.send("read", metadata=op.metadata().model_dump_json(), sizes=[512], seed=70 + i)
                peer.recv("done")
            assert [r.result(callers.TIMEOUT) for r in results] == [nixl_connect.OperationStatus.COMPLETE] * 2
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)
        peer.send("stop")
        peer.finish()


# ---------------------------------------------------------------- test_nixl_connect_device_kind.py


def test_device_kind_nixl_mem_type_and_str():
    assert nixl_connect.DeviceKind.HOST.nixl_mem_type == "DRAM"
    assert nixl_connect.DeviceKind.CUDA.nixl_mem_type == "VRAM"
    assert str(nixl_connect.DeviceKind.HOST) == "cpu"
    assert str(nixl_connect.DeviceKind.CUDA) == "cuda"


# ---------------------------------------------------------------- test_nixl_connect_lazy_import.py


def test_module_imports_without_torch_cupy_or_nixl():
    """Where none of torch, cupy, nixl can be imported, the module imports
    and a connector (and its connection) can be made."""
    code = textwrap.dedent(
        """
        import asyncio, sys
        for name in ("torch", "cupy", "cupy_backends", "nixl", "nixl._api", "nixl._bindings"):
            sys.modules[name] = None  # import fails
        import ferry as nixl_connect
        connector = nixl_connect.Connector()
        connection = asyncio.run(connector._create_connection())
        assert isinstance(connection, nixl_connect.Connection)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=callers.TIMEOUT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
