"""Caller: ``dynamo/common/utils/media_nixl.py`` (Dynamo 1.6.1),
``read_decoded_media_via_nixl``, with its users ``ImageLoader``,
``VideoLoader`` and ``AudioLoader`` (``dynamo/common/multimodal/*_loader.py``):
media decoded by the frontend is pulled into a backend with NIXL READ.

The frontend (the peer process, on uvloop) stands for Dynamo's media
decoder: it exposes each decoded image with ``create_readable`` and hands
the backend a ``decoded_meta`` dictionary made of the pieces of the
metadata: ``nixl_metadata``, and the descriptor's ``ptr``/``size`` as
``nixl_descriptor`` ``addr``/``size`` with ``mem_type`` "DRAM".

The backend (this process, on uvloop) makes, as the loaders and the
function do::

    connector = nixl_connect.Connector(); run_async(connector.initialize)   # loader __init__
    from nixl_connect import OperationKind, RdmaMetadata, SerializedDescriptor
    rdma_metadata = RdmaMetadata(
        descriptors=[SerializedDescriptor(device="cpu", ptr=addr, size=size)],
        nixl_metadata=decoded_meta["nixl_metadata"],
        notification_key=str(uuid.uuid4()),                 # a fresh key, not the frontend's
        operation_kind=int(OperationKind.READ))
    tensor = torch.empty(shape, dtype=...)
    read_op = await connector.begin_read(rdma_metadata, nixl_connect.Descriptor(tensor))
    await read_op.wait_for_completion()
    tensor.numpy()[..., :3]

with several images read at once (``asyncio.gather``). So metadata rebuilt
from its public fields, with a notification key of the reader's choosing,
must read the frontend's bytes; the pixels are checked.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Dict, List, Optional, Tuple

import callers
import numpy
import pytest
from callers import Peer, run_async, run_uvloop

import ferry as nixl_connect


def decoded(shape: List[int], seed: int) -> Any:
    return callers.filled(shape, "uint8", seed)


async def read_decoded_media_via_nixl(
    connector: Any, decoded_meta: Dict[str, Any], return_metadata: bool = False
) -> Any:
    """The function's calls, in its order."""
    from ferry import OperationKind, RdmaMetadata, SerializedDescriptor

    descriptor = decoded_meta["nixl_descriptor"]
    remote_device = (
        "cpu" if descriptor.get("mem_type", "dram").lower() == "dram" else f"cuda:{descriptor.get('device_id', 0)}"
    )
    rdma_metadata = RdmaMetadata(
        descriptors=[SerializedDescriptor(device=remote_device, ptr=descriptor["addr"], size=descriptor["size"])],
        nixl_metadata=decoded_meta["nixl_metadata"],
        notification_key=str(uuid.uuid4()),
        operation_kind=int(OperationKind.READ),
    )
    tensor = callers.empty(decoded_meta["shape"], decoded_meta.get("dtype", "uint8").lower())
    local_descriptor = nixl_connect.Descriptor(tensor)
    read_op = await connector.begin_read(rdma_metadata, local_descriptor)
    await read_op.wait_for_completion()
    array = callers.to_numpy(tensor)[..., :3]
    return (array, decoded_meta.get("metadata")) if return_metadata else array


class MediaLoader:
    """What the image, video and audio loaders do with NIXL: one connector,
    initialized synchronously from __init__."""

    def __init__(self) -> None:
        self._nixl_connector = nixl_connect.Connector()
        run_async(self._nixl_connector.initialize)

    async def load_decoded(self, items: List[Dict[str, Any]]) -> List[Tuple[Any, Optional[Dict[str, Any]]]]:
        futures = [read_decoded_media_via_nixl(self._nixl_connector, meta, return_metadata=True) for meta in items]
        return list(await asyncio.gather(*futures))


# ---------------------------------------------------------------- the frontend (peer)


async def peer_frontend(chan: callers.Channel) -> None:
    """Per ``decode`` (shapes, seed, withdraw): exposes each decoded image,
    sends the decoded_meta list, then says ``read`` once every image has
    been read (or, with ``withdraw``, drops the readables and says
    ``withdrawn`` before anything is read)."""
    connector = nixl_connect.Connector()
    while True:
        msg = await chan.arecv()
        if msg["event"] == "stop":
            return
        readables, items = [], []
        for i, shape in enumerate(msg["shapes"]):
            image = decoded(shape, msg["seed"] + i)
            readable = await connector.create_readable(nixl_connect.Descriptor(image))
            meta = readable.metadata()
            (d,) = meta.descriptors
            items.append(
                {
                    "nixl_metadata": meta.nixl_metadata,
                    "nixl_descriptor": {"addr": d.ptr, "size": d.size, "mem_type": "DRAM", "device_id": 0},
                    "shape": shape,
                    "dtype": "uint8",
                    "metadata": {"index": i, "sample_rate": 16000},
                }
            )
            readables.append((readable, image))
        if msg.get("withdraw"):
            del readable, readables
            chan.send("decoded", items=items)
            continue
        chan.send("decoded", items=items)
        await asyncio.wait_for(asyncio.gather(*(r.wait_for_completion() for r, _ in readables)), callers.TIMEOUT)
        for r, _ in readables:
            r.__exit__(None, None, None)
        chan.send("read")


# ---------------------------------------------------------------- tests


def expected(shape: List[int], seed: int) -> Any:
    return callers.to_numpy(decoded(shape, seed))[..., :3]


def test_decoded_images_read_at_once():
    """Three RGBA images of different sizes, read concurrently; each array
    holds the frontend's RGB pixels and its metadata comes back."""
    shapes = [[32, 48, 4], [7, 5, 4], [128, 96, 4]]

    async def main():
        loader = MediaLoader()
        with Peer(__file__, "peer_frontend") as peer:
            peer.send("decode", shapes=shapes, seed=40)
            items = (await peer.arecv("decoded"))["items"]
            results = await loader.load_decoded(items)
            for i, ((array, metadata), shape) in enumerate(zip(results, shapes)):
                assert array.shape == tuple(shape[:2]) + (3,)
                assert numpy.array_equal(array, expected(shape, 40 + i))
                assert metadata == {"index": i, "sample_rate": 16000}
            await peer.arecv("read")
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_video_frames_and_audio_samples():
    """The video loader's frames (N, H, W, 3) and the audio loader's samples
    go through the same function, on the same connector, request after
    request."""

    async def main():
        loader = MediaLoader()
        with Peer(__file__, "peer_frontend") as peer:
            for seed, shapes in [(50, [[8, 16, 16, 3]]), (60, [[1, 4000, 1]]), (70, [[2, 2, 2, 3], [3, 3, 4]])]:
                peer.send("decode", shapes=shapes, seed=seed)
                items = (await peer.arecv("decoded"))["items"]
                for i, ((array, _), shape) in enumerate(zip(await loader.load_decoded(items), shapes)):
                    assert numpy.array_equal(array, expected(shape, seed + i))
                await peer.arecv("read")
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())


def test_media_withdrawn_by_the_frontend_cannot_be_read():
    """The frontend dropped its readable before the backend read it: the
    read fails with a RuntimeError, the loaders' failure path."""

    async def main():
        loader = MediaLoader()
        with Peer(__file__, "peer_frontend") as peer:
            peer.send("decode", shapes=[[4, 4, 4]], seed=80, withdraw=True)
            items = (await peer.arecv("decoded"))["items"]
            with pytest.raises(RuntimeError):
                await asyncio.wait_for(loader.load_decoded(items), callers.TIMEOUT)
            peer.send("stop")
            await peer.afinish()

    run_uvloop(main())
