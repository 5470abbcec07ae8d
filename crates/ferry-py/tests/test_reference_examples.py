"""The examples of the reference pages (Dynamo's NIXL Connect), run with only
the import changed: ``import dynamo.nixl_connect`` becomes the namespace
below. The bodies of ``read_from_remote`` and ``recv_data`` are the
reference's, line for line.

They run with host tensors, and with GPU memory on both sides: CUDA tensors
where torch has a GPU, device memory behind ``__cuda_array_interface__``
where the CUDA driver is (as CuPy or Numba arrays; no wheel needed), and,
on hosts without a GPU, in two processes that simulate one (run as a
script: ``python test_reference_examples.py cuda_sim``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import types

import buffers
import pytest
from conftest import HelperProcess, Peer, no_libcuda_here, run

import ferry

dynamo = types.SimpleNamespace(nixl_connect=ferry)  # was: import dynamo.nixl_connect

# A NumPy array stands in for the tensor where torch is not installed.
TENSOR_KINDS = ["numpy"] + (["torch"] if buffers.torch is not None else []) + buffers.CUDA_KINDS


def remote_kind(kind: str) -> str:
    """The other worker's memory: GPU memory of the same kind for GPU
    memory here (GPU to GPU, as the reference's callers move it), else
    host memory."""
    return kind if kind in buffers.CUDA_KINDS or kind == "cuda_sim" else "bytearray"


class Worker:
    """The reference's snippets are methods of a worker that owns a connector."""

    def __init__(self, peer: Peer, kind: str = "bytearray") -> None:
        self.connector = dynamo.nixl_connect.Connector(listen="127.0.0.1:0")
        self.peer = peer
        self.kind = kind
        self.replies: list = []

    async def request_remote_data(self, op_metadata) -> None:
        # The side channel: the remote worker writes into our writable.
        size = op_metadata.descriptors[0].size
        self.replies.append(
            await self.peer.request(
                "write", metadata=op_metadata.model_dump_json(), sizes=[size], seed=42, kind=self.kind
            )
        )

    # From the reference page of ReadOperation.
    async def read_from_remote(
        self,
        remote_metadata: dynamo.nixl_connect.RdmaMetadata,
        local_tensor: torch.Tensor,  # noqa: F821 - annotations are not evaluated
    ) -> None:
        descriptor = dynamo.nixl_connect.Descriptor(local_tensor)
        with self.connector.begin_read(descriptor, remote_metadata) as read_op:
            # Wait for the operation to complete writing data from the remote worker to local_tensor.
            await read_op.wait_for_completion()

    # From the reference page of WritableOperation.
    async def recv_data(
        self,
        local_tensor: torch.Tensor,  # noqa: F821
    ) -> None:
        descriptor = dynamo.nixl_connect.Descriptor(local_tensor)
        with self.connector.create_writable(descriptor) as write_op:
            op_metadata = write_op.metadata()
            # Send the metadata to the remote worker via sideband communication.
            await self.request_remote_data(op_metadata)
            # Wait the remote worker to complete its write operation to local_tensor.
            # AKA receive data from remote worker.
            await write_op.wait_for_completion()


async def read_example(peer: Peer, kind: str) -> None:
    """The ReadOperation example into a `kind` tensor, from the other
    worker's readable."""
    size = 1 << 16
    worker = Worker(peer, remote_kind(kind))
    rid = peer.send("readable", sizes=[size], seed=41, kind=remote_kind(kind))
    remote_metadata = dynamo.nixl_connect.RdmaMetadata.model_validate_json(
        (await peer.expect(rid, "metadata"))["metadata"]
    )
    local_tensor = buffers.new(kind, size)
    await worker.read_from_remote(remote_metadata, local_tensor)
    assert buffers.contents(kind, local_tensor) == buffers.pattern(41, 0, size)
    assert (await peer.expect(rid, "done"))["status"] == "COMPLETE"


async def writable_example(peer: Peer, kind: str) -> None:
    """The WritableOperation example into a `kind` tensor, which the other
    worker writes."""
    size = 1 << 16
    worker = Worker(peer, remote_kind(kind))
    local_tensor = buffers.new(kind, size)
    await worker.recv_data(local_tensor)
    assert worker.replies[0]["status"] == "COMPLETE", worker.replies
    assert buffers.contents(kind, local_tensor) == buffers.pattern(42, 0, size)


@pytest.mark.parametrize("kind", TENSOR_KINDS)
def test_read_operation_example(helper, kind):
    async def main():
        peer = await Peer.connect(helper)
        await read_example(peer, kind)
        await peer.close()

    run(main())


@pytest.mark.parametrize("kind", TENSOR_KINDS)
def test_writable_operation_example(helper, kind):
    async def main():
        peer = await Peer.connect(helper)
        await writable_example(peer, kind)
        await peer.close()

    run(main())


@pytest.mark.skipif(
    not no_libcuda_here(),
    reason="a CUDA driver is here: GPU memory is simulated only on hosts without one",
)
def test_the_examples_with_gpu_memory_in_processes_that_simulate_a_gpu():
    """Both examples with ``__cuda_array_interface__`` objects on both sides,
    in this file run as a script by a process that simulates a GPU, against
    a helper that does too: GPU memory staged through host memory."""
    env = {**os.environ, "FERRY_TEST_SIMULATED_GPU": "1"}
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "cuda_sim"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "both examples ok with cuda_sim", done.stdout


def test_reference_names_exist():
    """Every class and member the reference pages name."""
    nc = dynamo.nixl_connect
    for name in [
        "Connector",
        "Descriptor",
        "Device",
        "DeviceKind",
        "OperationKind",
        "OperationStatus",
        "RdmaMetadata",
        "ReadOperation",
        "ReadableOperation",
        "WritableOperation",
        "WriteOperation",
    ]:
        assert hasattr(nc, name), name
    for cls in (nc.ReadOperation, nc.WriteOperation):
        for member in ("cancel", "wait_for_completion", "status"):
            assert hasattr(cls, member), (cls, member)
    for cls in (nc.ReadableOperation, nc.WritableOperation):
        for member in ("metadata", "wait_for_completion", "status"):
            assert hasattr(cls, member), (cls, member)
    assert hasattr(nc.ReadOperation, "results")
    for member in ("create_readable", "create_writable", "begin_read", "begin_write", "name", "hostname", "is_cuda_available"):
        assert hasattr(nc.Connector, member), member
    for member in ("model_dump_json", "model_validate_json"):
        assert hasattr(nc.RdmaMetadata, member), member


def test_readme_example():
    """The Python example of crates/ferry-py/README.md runs as written."""
    pytest.importorskip("numpy")
    import os
    import re

    path = os.path.join(os.path.dirname(__file__), "..", "README.md")
    with open(path) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


async def _both_examples(kind: str) -> None:
    helper = HelperProcess({"FERRY_TEST_SIMULATED_GPU": "1"} if kind == "cuda_sim" else None)
    try:
        peer = await Peer.connect(helper)
        await read_example(peer, kind)
        await writable_example(peer, kind)
        await peer.close()
    finally:
        helper.close()


if __name__ == "__main__":
    # Both examples in this process, with `kind` memory on both sides.
    kind = sys.argv[1]
    asyncio.run(asyncio.wait_for(_both_examples(kind), 60))
    print(f"both examples ok with {kind}")
