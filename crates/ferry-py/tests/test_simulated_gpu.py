"""GPU memory between two Python processes without a GPU: both helpers
simulate one (``FERRY_TEST_SIMULATED_GPU=1``: device addresses are host
memory, the device's copies ``memcpy``), and their buffers are objects that
present host memory through ``__cuda_array_interface__``, as CuPy or Numba
arrays on ``cuda:0`` do. READ and WRITE then go the way GPU memory goes
between two processes where CUDA IPC does not reach: in band over TCP, each
side staging its own device memory through host buffers. Checked byte for
byte by the destination's process.

What this does not run: the CUDA driver, and CUDA IPC (a simulated GPU
lends nothing). On a GPU, run ``test_gpu_descriptors.py`` with torch.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from conftest import HelperProcess, Peer, no_libcuda_here, run

SIZES = [1, 4096, (3 << 20) + 5]

# Where a CUDA driver is, the helpers do not simulate (the extension
# ignores the variable there): their host memory is no GPU's.
pytestmark = pytest.mark.skipif(
    not no_libcuda_here(),
    reason="a CUDA driver is here: GPU memory is simulated only on hosts without one",
)


@pytest.fixture(scope="module")
def gpus() -> Iterator[tuple]:
    """Two helper processes that simulate a GPU each."""
    env = {"FERRY_TEST_SIMULATED_GPU": "1"}
    a, b = HelperProcess(env), HelperProcess(env)
    yield a, b
    a.close()
    b.close()


async def between(gpus: tuple, passive: str, active: str, seed: int) -> tuple:
    """`passive` (readable or writable) in one helper, `active` (read or
    write) against it in the other: both processes' answers."""
    there, here = await Peer.connect(gpus[0]), await Peer.connect(gpus[1])
    rid = there.send(passive, sizes=SIZES, kind="cuda_sim", seed=seed)
    meta = (await there.expect(rid, "metadata"))["metadata"]
    mine = await here.request(active, metadata=meta, sizes=SIZES, kind="cuda_sim", seed=seed)
    theirs = await there.expect(rid, "done")
    await there.close()
    await here.close()
    return mine, theirs


def test_read_of_gpu_memory_into_gpu_memory(gpus):
    async def main():
        mine, theirs = await between(gpus, "readable", "read", seed=61)
        assert (mine["status"], mine["error"]) == ("COMPLETE", None), mine
        assert mine["verified"], "the bytes read differ from the source's"
        assert theirs["status"] == "COMPLETE", theirs
        assert (mine["transport"], theirs["transport"]) == ("tcp", "tcp")

    run(main())


def test_write_of_gpu_memory_into_gpu_memory(gpus):
    async def main():
        mine, theirs = await between(gpus, "writable", "write", seed=62)
        assert (mine["status"], mine["error"]) == ("COMPLETE", None), mine
        assert (theirs["status"], theirs["error"]) == ("COMPLETE", None), theirs
        assert theirs["verified"], "the bytes written differ from the source's"
        assert (mine["transport"], theirs["transport"]) == ("tcp", "tcp")

    run(main())


def test_the_helpers_memory_is_cuda_memory():
    """The helpers describe their buffers as cuda:0 (not host memory that
    happens to work): a helper that does not simulate refuses them."""

    async def main():
        plain = HelperProcess({"FERRY_TEST_SIMULATED_GPU": "0"})
        try:
            peer = await Peer.connect(plain)
            done = await peer.request("readable", event="done", sizes=[4096], kind="cuda_sim", seed=1)
            assert done["status"] == "NOT_STARTED", done
            assert "CudaUnavailable" in (done["error"] or ""), done
            await peer.close()
        finally:
            plain.close()

    run(main())
