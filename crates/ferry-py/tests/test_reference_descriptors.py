"""``metadata.descriptors`` items behave as the reference's (issue 33, item
10): each is a ``SerializedDescriptor`` (``device`` a string such as
``"cpu"`` or ``"cuda:0"``, ``ptr``, ``size``, ``model_dump()``,
``to_descriptor()``), so code written for ``dynamo.nixl_connect`` that
reads them works unchanged. Ferry's metadata carries no addresses: ``ptr``
is 0, and ``to_descriptor()`` gives a descriptor that names no memory.

The metadata comes from another process (tests/helper.py), as it does in a
graph, and the reads made with the rebuilt metadata move real bytes.
"""

from __future__ import annotations

import json
from typing import Any, List

import buffers
import pytest
from conftest import Peer, run

import ferry as nixl_connect
from ferry import Descriptor, Device, RdmaMetadata, SerializedDescriptor

# Three blocks of one size (one run of the metadata), then two others.
SIZES = [4096, 4096, 4096, 100, 1]


def connector() -> nixl_connect.Connector:
    return nixl_connect.Connector(listen="127.0.0.1:0")


def reference_request_model() -> Any:
    """A request carrying the reference's RdmaMetadata fields, as Dynamo's
    workers define theirs (a pydantic model with a list of
    SerializedDescriptor)."""
    pydantic = pytest.importorskip("pydantic")

    class SerializedRequest(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        descriptors: List[nixl_connect.SerializedDescriptor] = []
        nixl_metadata: str = ""
        notification_key: str = ""
        operation_kind: int = 0

    return SerializedRequest


def test_descriptors_read_as_the_references(helper):
    SerializedRequest = reference_request_model()

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=SIZES, kind="bytearray", seed=21)
        meta = RdmaMetadata.model_validate_json((await peer.expect(rid, "metadata"))["metadata"])

        # Reading the items, as reference code does.
        assert len(meta.descriptors) == len(SIZES)
        for d, size in zip(meta.descriptors, SIZES):
            assert isinstance(d, nixl_connect.SerializedDescriptor)
            assert d.device == "cpu" and isinstance(d.device, str)
            assert d.ptr == 0
            assert d.size == size
            assert d.model_dump() == {"device": "cpu", "ptr": 0, "size": size}
            assert json.loads(d.model_dump_json()) == d.model_dump()
            assert SerializedDescriptor.model_validate(d.model_dump()) == d
        assert meta.descriptors[0].size == SIZES[0] and meta.descriptors[-1].size == SIZES[-1]
        assert [d.size for d in meta.descriptors] == SIZES
        assert sum(d.size for d in meta.descriptors) == meta.total_size
        first, *rest = meta.descriptors
        assert first.size == SIZES[0] and len(rest) == len(SIZES) - 1
        assert meta.descriptors == [SerializedDescriptor(device="cpu", ptr=0, size=n) for n in SIZES]

        # to_descriptor() of each item, and to_descriptors(): the remote's
        # sizes and devices, with no address.
        remote = [d.to_descriptor() for d in meta.descriptors]
        assert all(type(r) is Descriptor for r in remote)
        assert [r.size for r in remote] == SIZES
        assert all(r.ptr == 0 and r.device == Device("cpu") and str(r.device) == "cpu" for r in remote)
        listed = meta.to_descriptors()
        assert [r.size for r in listed] == SIZES  # type: ignore[union-attr]
        assert [r.metadata for r in listed] == list(meta.descriptors)  # type: ignore[union-attr]

        # The reference's fields carried in a request model, through JSON,
        # then metadata rebuilt from them, as Dynamo's workers do.
        request = SerializedRequest(
            descriptors=meta.descriptors,
            nixl_metadata=meta.nixl_metadata,
            notification_key=meta.notification_key,
            operation_kind=meta.operation_kind,
        )
        received = SerializedRequest.model_validate_json(request.model_dump_json())
        assert received.descriptors == list(meta.descriptors)
        rebuilt = RdmaMetadata(**received.model_dump())
        assert rebuilt == meta
        rebuilt_by_hand = RdmaMetadata(
            descriptors=[SerializedDescriptor(ptr=d.ptr, size=d.size, device=d.device) for d in received.descriptors],
            nixl_metadata=received.nixl_metadata,
            notification_key=received.notification_key,
            operation_kind=received.operation_kind,
        )
        assert rebuilt_by_hand == meta

        # Local buffers sized from the items; the read moves the bytes.
        local = [bytearray(d.size) for d in received.descriptors]
        async with await c.begin_read(rebuilt, [Descriptor(b) for b in local]) as op:
            await op.wait_for_completion()
            assert op.status == nixl_connect.OperationStatus.COMPLETE
        assert buffers.verify("bytearray", local, 21)
        done = await peer.expect(rid, "done")
        assert done["status"] == "COMPLETE" and done["error"] is None
        await peer.close()

    run(main())


def test_a_descriptor_of_remote_memory_names_no_local_memory(helper):
    """What ``to_descriptor()`` gives for an item with ``ptr`` 0 can be read
    but never moved nor registered: no operation touches address 0."""

    async def main():
        c = connector()
        peer = await Peer.connect(helper)
        rid = peer.send("readable", sizes=[64], kind="bytearray", seed=3)
        meta = RdmaMetadata.model_validate_json((await peer.expect(rid, "metadata"))["metadata"])
        one = meta.to_descriptors()
        assert type(one) is Descriptor and (one.ptr, one.size) == (0, 64)
        (d,) = meta.descriptors
        with pytest.raises(ValueError, match="names no memory"):
            await c.begin_read(meta, d.to_descriptor())
        with pytest.raises(ValueError, match="names no memory"):
            await c.create_readable(one)
        connection = await c._create_connection()
        with pytest.raises(ValueError, match="null pointer"):
            one.register_with_connector(connection)
        # The real read still works, and the helper's readable completes.
        local = bytearray(d.size)
        async with await c.begin_read(meta, Descriptor(local)) as op:
            await op.wait_for_completion()
        assert buffers.verify("bytearray", [local], 3)
        assert (await peer.expect(rid, "done"))["status"] == "COMPLETE"
        await peer.close()

    run(main())


def test_device_strings_of_gpu_descriptors():
    """The device of a CUDA descriptor reads ``"cuda:N"``, as the
    reference's ``f"{device}"`` writes it (metadata as another process
    sends it; nothing is moved)."""

    async def main():
        c = connector()
        with await c.create_readable(Descriptor(bytearray(8))) as op:
            fields = op.metadata().model_dump()
        fields["descriptors"] = [{"device": "cuda:1", "size": 256, "count": 2}, {"device": "cpu", "size": 8}]
        meta = RdmaMetadata.model_validate(fields)
        assert [d.device for d in meta.descriptors] == ["cuda:1", "cuda:1", "cpu"]
        assert [d.model_dump() for d in meta.descriptors][0] == {"device": "cuda:1", "ptr": 0, "size": 256}
        assert [str(d.to_descriptor().device) for d in meta.descriptors] == ["cuda:1", "cuda:1", "cpu"]
        assert meta.descriptor_runs == [
            (SerializedDescriptor(device="cuda:1", ptr=0, size=256), 2),
            (SerializedDescriptor(device="cpu", ptr=0, size=8), 1),
        ]

    run(main())
