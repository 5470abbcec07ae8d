"""Compatibility with ``dynamo.nixl_connect`` (Dynamo 1.6.1) around metadata:
RdmaMetadata as a field of a pydantic v2 model, the reference's
RdmaMetadata fields and SerializedDescriptor, refusal of metadata that is
not Ferry's, and the small surface (Device strings, status strings, XPU)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import uuid
import zlib
from typing import Any, Dict, List, Optional

import pytest
from conftest import run

import ferry
from ferry import (
    Connector,
    Descriptor,
    DescriptorInfo,
    Device,
    DeviceKind,
    ForeignMetadataError,
    OperationKind,
    OperationStatus,
    RdmaMetadata,
    SerializedDescriptor,
)


def connector() -> Connector:
    return Connector(listen="127.0.0.1:0")


async def readable_metadata(c: Connector, *buffers: bytearray) -> Any:
    """A readable over `buffers` and its metadata."""
    op = await c.create_readable([Descriptor(b) for b in buffers])
    return op, op.metadata()


def nixl_blob() -> str:
    """A ``nixl_metadata`` as the reference writes it: a NIXL agent's
    metadata, compressed, in base64 with a ``b64:`` prefix."""
    agent = b"nixl-agent-metadata\x00" + os.urandom(64)
    return "b64:" + base64.b64encode(zlib.compress(agent, 6)).decode()


def reference_dump(nixl_metadata: str, kind: int = 1) -> Dict[str, Any]:
    """What the reference's ``RdmaMetadata.model_dump()`` gives."""
    return {
        "descriptors": [{"device": "cpu", "ptr": 0x7F0000001000, "size": 64}],
        "nixl_metadata": nixl_metadata,
        "notification_key": str(uuid.uuid4()),
        "operation_kind": kind,
    }


# ---- 1. RdmaMetadata as a field of a pydantic v2 model ----


def pydantic_models() -> Any:
    pydantic = pytest.importorskip("pydantic")
    assert pydantic.VERSION.startswith("2.")
    from pydantic import BaseModel, ConfigDict

    class Req(BaseModel):  # no arbitrary_types_allowed
        serialized_request: Optional[RdmaMetadata]

    class Many(BaseModel):
        items: List[RdmaMetadata] = []
        by_name: Dict[str, RdmaMetadata] = {}
        descriptor: Optional[SerializedDescriptor] = None

    class MultimodalRequest(BaseModel):  # examples/multimodal/utils/protocol.py
        model_config = ConfigDict(arbitrary_types_allowed=True)
        request_id: str
        embeddings_shape: Optional[List[int]] = None
        serialized_request: Optional[RdmaMetadata] = None

    class TransferRequest(BaseModel):  # dynamo/common/multimodal/embedding_transfer.py
        embeddings_shape: List[int]
        embedding_dtype_str: str
        serialized_request: Any

    return Req, Many, MultimodalRequest, TransferRequest


def test_pydantic_field_defines_without_arbitrary_types_allowed():
    Req, *_ = pydantic_models()
    assert not Req.model_config.get("arbitrary_types_allowed")
    assert Req(serialized_request=None).model_dump() == {"serialized_request": None}
    schema = Req.model_json_schema()
    assert "RdmaMetadata" in json.dumps(schema)


def test_pydantic_round_trip_with_dicts():
    Req, Many, MultimodalRequest, _ = pydantic_models()

    async def main():
        c = connector()
        op, m = await readable_metadata(c, bytearray(10), bytearray(3))
        with op:
            req = Req(serialized_request=m)
            dumped = req.model_dump()
            assert dumped == {"serialized_request": m.model_dump()}
            assert isinstance(dumped["serialized_request"], dict)
            back = Req.model_validate(dumped)
            assert isinstance(back.serialized_request, RdmaMetadata)
            assert back.serialized_request == m and back == req
            assert back.model_dump() == dumped
            assert Req.model_validate({"serialized_request": None}).serialized_request is None
            # A model built from the instance keeps it as it is.
            assert Req(serialized_request=m).serialized_request is m

            many = Many(items=[m, m], by_name={"a": m}, descriptor=Descriptor(bytearray(4)).metadata)
            assert Many.model_validate(many.model_dump()) == many
            assert Many.model_validate(many.model_dump(mode="json")) == many

            mm = MultimodalRequest(request_id="r1", embeddings_shape=[1, 2], serialized_request=m)
            assert MultimodalRequest.model_validate(mm.model_dump()) == mm

    run(main())


def test_pydantic_round_trip_with_json():
    Req, Many, MultimodalRequest, _ = pydantic_models()

    async def main():
        c = connector()
        op, m = await readable_metadata(c, bytearray(10))
        with op:
            req = Req(serialized_request=m)
            text = req.model_dump_json()
            assert json.loads(text) == {"serialized_request": json.loads(m.model_dump_json())}
            back = Req.model_validate_json(text)
            assert back.serialized_request == m
            assert back.model_dump_json() == text  # exactly
            assert Req.model_validate_json(text.encode()) == req
            assert Req.model_validate(json.loads(text)) == req  # JSON parsed elsewhere

            many = Many(items=[m], by_name={"x": m}, descriptor=SerializedDescriptor(device="cuda:1", ptr=4096, size=8))
            assert Many.model_validate_json(many.model_dump_json()) == many
            assert Many.model_validate_json(many.model_dump_json()).model_dump_json() == many.model_dump_json()

            mm = MultimodalRequest(request_id="r1", serialized_request=m)
            assert MultimodalRequest.model_validate_json(mm.model_dump_json()) == mm

    run(main())


def test_pydantic_embedding_transfer_flow_reads_the_bytes():
    """The embedding_transfer caller: the sender puts ``metadata().model_dump()``
    in an ``Any`` field, the request travels as JSON, the receiver calls
    ``RdmaMetadata.model_validate`` on the field and reads."""
    *_, TransferRequest = pydantic_models()

    async def main():
        sender, receiver = connector(), connector()
        src = bytearray(os.urandom(4096))
        readable = await sender.create_readable(Descriptor(src))
        request = TransferRequest(
            embeddings_shape=[4096],
            embedding_dtype_str="uint8",
            serialized_request=readable.metadata().model_dump(),
        )
        wire = request.model_dump_json()

        received = TransferRequest.model_validate_json(wire)
        metadata = RdmaMetadata.model_validate(received.serialized_request)
        dst = bytearray(4096)
        read = await receiver.begin_read(metadata, Descriptor(dst))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert dst == src

    run(main())


def test_pydantic_refuses_what_is_not_metadata():
    Req, *_ = pydantic_models()
    from pydantic import ValidationError

    for bad in (3, "text", [1], {"version": 1}):
        with pytest.raises(ValidationError):
            Req.model_validate({"serialized_request": bad})
    with pytest.raises(ValidationError, match="NIXL agent"):
        Req.model_validate({"serialized_request": reference_dump(nixl_blob())})
    with pytest.raises(ValidationError, match="NIXL agent"):
        Req.model_validate_json(json.dumps({"serialized_request": reference_dump(nixl_blob())}))


def test_the_package_does_not_import_pydantic():
    code = (
        "import sys, ferry\n"
        "d = ferry.Descriptor(bytearray(8)).metadata\n"
        "assert ferry.SerializedDescriptor.model_validate_json(d.model_dump_json()) == d\n"
        "assert 'pydantic' not in sys.modules and 'pydantic_core' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


# ---- 2. the reference's fields, SerializedDescriptor, foreign metadata ----


def test_reference_fields_construct_from_ferry_metadata():
    async def main():
        a, b = connector(), connector()
        src = bytearray(os.urandom(64))
        op, m = await readable_metadata(a, src)
        # As dynamo/common/utils/media_nixl.py builds it.
        built = RdmaMetadata(
            descriptors=[SerializedDescriptor(device="cpu", ptr=0x7F0000001000, size=64)],
            nixl_metadata=m.nixl_metadata,
            notification_key=str(uuid.uuid4()),
            operation_kind=int(OperationKind.READ),
        )
        assert built == m
        again = RdmaMetadata(
            descriptors=m.descriptors,
            nixl_metadata=m.nixl_metadata,
            notification_key=m.notification_key,
            operation_kind=m.operation_kind,
        )
        assert again == m
        assert RdmaMetadata(nixl_metadata=m.nixl_metadata) == m
        assert RdmaMetadata(nixl_metadata=m.nixl_metadata, descriptors=[]) == m
        fields = reference_dump(m.nixl_metadata)
        assert RdmaMetadata.model_validate(fields) == m
        assert RdmaMetadata.model_validate_json(json.dumps(fields)) == m
        assert RdmaMetadata(**fields) == m

        dst = bytearray(64)
        read = await b.begin_read(built, Descriptor(dst))
        await read.wait_for_completion()
        await op.wait_for_completion()
        assert dst == src

    run(main())


def test_reference_fields_must_agree_with_the_metadata():
    async def main():
        op, m = await readable_metadata(connector(), bytearray(16), bytearray(8))
        with op:
            nm = m.nixl_metadata
            with pytest.raises(ValueError, match="operation_kind 2"):
                RdmaMetadata(nixl_metadata=nm, operation_kind=int(OperationKind.WRITE))
            with pytest.raises(ValueError, match="do not match"):
                RdmaMetadata(nixl_metadata=nm, descriptors=[SerializedDescriptor(device="cpu", ptr=1, size=16)])
            with pytest.raises(ValueError, match="do not match"):
                RdmaMetadata(
                    nixl_metadata=nm,
                    descriptors=[
                        SerializedDescriptor(device="cpu", ptr=1, size=16),
                        SerializedDescriptor(device="cuda:0", ptr=1, size=8),
                    ],
                )
            ok = RdmaMetadata(
                nixl_metadata=nm,
                descriptors=[{"device": "cpu", "ptr": 1, "size": 16}, {"device": "CPU", "ptr": 2, "size": 8}],
            )
            assert ok == m
            with pytest.raises(ValueError, match="worker_id"):
                RdmaMetadata(nixl_metadata=nm, worker_id="x")
            with pytest.raises(TypeError):
                RdmaMetadata(nixl_metadata=nm, notification_key=7)
            with pytest.raises(TypeError):
                RdmaMetadata(nixl_metadata=nm, descriptors=[object()])
            with pytest.raises(ValueError, match="needs nixl_metadata") as missing:
                RdmaMetadata(notification_key="k", operation_kind=1)
            assert not isinstance(missing.value, ForeignMetadataError)
            with pytest.raises(TypeError):
                RdmaMetadata()

    run(main())


@pytest.mark.parametrize(
    "kind",
    ["b64", "hex", "binary", "text", "other_json", "ferry_prefixed"],
)
def test_metadata_that_is_not_ferrys_is_refused(kind):
    """A NIXL agent's metadata (what the reference and the frontend put in
    nixl_metadata) or anything else that Ferry did not write is refused
    with a ForeignMetadataError (a ValueError) that says what to do."""
    agent = zlib.compress(b"nixl-agent-metadata\x00" + os.urandom(32))
    value: Any = {
        "b64": nixl_blob(),
        "hex": agent.hex(),
        "binary": b"\xff\xfe" + agent,
        "text": "agent-0@10.0.0.1:5555",
        "other_json": json.dumps({"agent": "x", "conn": "10.0.0.1"}),
        "ferry_prefixed": "ferry:" + nixl_blob(),
    }[kind]
    with pytest.raises(ForeignMetadataError) as e:
        RdmaMetadata(
            descriptors=[SerializedDescriptor(device="cpu", ptr=0x7F0000001000, size=64)],
            nixl_metadata=value,
            notification_key=str(uuid.uuid4()),
            operation_kind=int(OperationKind.READ),
        )
    assert isinstance(e.value, ValueError)
    message = str(e.value)
    assert "not Ferry's" in message or "NIXL agent" in message
    assert "both workers must use Ferry" in message and "op.metadata()" in message
    if kind in ("b64", "hex"):
        assert "NIXL agent's metadata" in message


def test_reference_json_is_refused_everywhere():
    fields = reference_dump(nixl_blob())
    text = json.dumps(fields)
    for attempt in (
        lambda: RdmaMetadata.model_validate(fields),
        lambda: RdmaMetadata.model_validate_json(text),
        lambda: RdmaMetadata.model_validate_json(text.encode()),
        lambda: RdmaMetadata.from_json(text),
        lambda: RdmaMetadata(**fields),
    ):
        with pytest.raises(ForeignMetadataError, match="NIXL agent"):
            attempt()
    # Bad JSON that is not the reference's keeps Ferry's own message.
    with pytest.raises(ValueError, match="not valid RdmaMetadata JSON") as e:
        RdmaMetadata.model_validate_json('{"version": 1}')
    assert not isinstance(e.value, ForeignMetadataError)


def test_to_descriptors_and_reference_properties():
    async def main():
        c = connector()
        op1, one = await readable_metadata(c, bytearray(12))
        op2, two = await readable_metadata(c, bytearray(5), bytearray(7))
        with op1, op2:
            single = one.to_descriptors()
            assert type(single) is Descriptor and (single.ptr, single.size, single.device) == (0, 12, Device("cpu"))
            several = two.to_descriptors()
            assert [(d.ptr, d.size, d.device) for d in several] == [(0, 5, Device("cpu")), (0, 7, Device("cpu"))]
            assert json.loads(one.nixl_metadata) == one.model_dump()
            assert one.notification_key.startswith(c.name + ":")
            assert one.notification_key != two.notification_key
            assert one.model_dump()["token"] not in one.notification_key
            assert one.operation_kind == 1 and isinstance(one.operation_kind, int)

    run(main())


def test_serialized_descriptor():
    d = SerializedDescriptor(device=" CUDA:1 ", ptr=0x1000, size=256)
    assert (d.device, d.ptr, d.size) == ("cuda:1", 0x1000, 256)
    assert repr(d) == "SerializedDescriptor(device='cuda:1', ptr=4096, size=256)"
    assert d.model_dump() == {"device": "cuda:1", "ptr": 4096, "size": 256}
    assert SerializedDescriptor.model_validate(d.model_dump()) == d
    assert SerializedDescriptor.model_validate_json(d.model_dump_json()) == d
    assert SerializedDescriptor.model_validate(d) is d
    assert pickle.loads(pickle.dumps(d)) == d
    assert len({d, SerializedDescriptor(device="cuda:1", ptr=4096, size=256)}) == 1
    default = SerializedDescriptor()
    assert (default.device, default.ptr, default.size) == ("cpu", 0, 0)
    with pytest.raises(AttributeError):
        d.size = 1  # type: ignore[misc]

    for bad in ({"device": "tpu"}, {"device": "cuda:x"}, {"ptr": 1, "size": -1}, {"ptr": -1}):
        with pytest.raises(ValueError):
            SerializedDescriptor(**bad)
    # A null ptr with a size is accepted (Ferry's metadata carries no
    # addresses: its descriptors' ptr is 0); it becomes a Descriptor that
    # names no memory, which no operation takes.
    null = SerializedDescriptor(device="cpu", ptr=0, size=1)
    assert (null.device, null.ptr, null.size) == ("cpu", 0, 1)
    for remote in (null.to_descriptor(), Descriptor.from_serialized(null)):
        assert (remote.ptr, remote.size, remote.device) == (0, 1, Device("cpu"))
        assert remote.metadata == null
        with pytest.raises(ValueError, match="names no memory"):
            remote._raw
    for bad_type in ({"device": 0}, {"ptr": "1"}, {"size": True}, {"extra": 1}):
        with pytest.raises(TypeError):
            SerializedDescriptor(**bad_type)
    with pytest.raises(ValueError, match="extra"):
        SerializedDescriptor.model_validate({"device": "cpu", "ptr": 1, "size": 1, "extra": 1})


def test_serialized_descriptor_and_descriptor():
    buf = bytearray(b"abcdef")
    desc = Descriptor(buf)
    s = desc.metadata
    assert s == SerializedDescriptor(device="cpu", ptr=desc.ptr, size=6)
    again = s.to_descriptor()
    assert type(again) is Descriptor
    assert (again.ptr, again.size, again.device) == (desc.ptr, desc.size, desc.device)
    assert Descriptor.from_serialized(s).ptr == desc.ptr
    with pytest.raises(TypeError):
        Descriptor.from_serialized(s.model_dump())  # type: ignore[arg-type]
    gpu = SerializedDescriptor(device="cuda", ptr=0xDEAD0000, size=32).to_descriptor()
    assert gpu.device == Device("cuda:0")


# ---- 3. the small surface ----


@pytest.mark.parametrize(
    "text, kind, ident",
    [
        ("cpu", DeviceKind.HOST, 0),
        ("CPU", DeviceKind.HOST, 0),
        ("  cpu\n", DeviceKind.HOST, 0),
        ("cpu:0", DeviceKind.HOST, 0),
        ("host", DeviceKind.HOST, 0),
        ("Host", DeviceKind.HOST, 0),
        ("cuda", DeviceKind.CUDA, 0),
        ("CUDA:1", DeviceKind.CUDA, 1),
        (" cuda:2 ", DeviceKind.CUDA, 2),
        ("cuda : 3", DeviceKind.CUDA, 3),
        ("gpu", DeviceKind.CUDA, 0),
        ("gpu:3", DeviceKind.CUDA, 3),
        ("GPU:07", DeviceKind.CUDA, 7),
        ("xpu", DeviceKind.XPU, 0),
        ("xpu:1", DeviceKind.XPU, 1),
        (" XPU:2", DeviceKind.XPU, 2),
    ],
)
def test_device_strings(text, kind, ident):
    d = Device(text)
    assert (d.kind, d.id) == (kind, ident)
    assert Device(str(d)) == d
    assert str(d) == ("cpu" if kind == DeviceKind.HOST else f"{kind}:{ident}")
    desc = Descriptor((0x1000, 8, text, None))
    assert desc.device == d


@pytest.mark.parametrize("text", ["", "  ", "tpu", "mps", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "cpu:1", "gpu0", "cudax"])
def test_device_strings_refused(text):
    with pytest.raises(ValueError, match="expected"):
        Device(text)


def test_device_kinds_and_tuples():
    assert int(DeviceKind.XPU) == 3 and str(DeviceKind.XPU) == "xpu"
    assert [str(k) for k in DeviceKind] == ["<invalid>", "cpu", "cuda", "xpu"]
    assert {k: k.nixl_mem_type for k in DeviceKind} == {
        DeviceKind.UNSPECIFIED: "VRAM",
        DeviceKind.HOST: "DRAM",
        DeviceKind.CUDA: "VRAM",
        DeviceKind.XPU: "VRAM",
    }
    assert Device((DeviceKind.XPU, 1)) == Device("xpu:1")
    assert repr(Device("xpu:1")) == "Device('xpu:1')"
    with pytest.raises(ValueError):
        Device((DeviceKind.UNSPECIFIED, 0))


def test_status_and_kind_strings():
    assert {s: str(s) for s in OperationStatus} == {
        OperationStatus.UNINITIALIZED: "<invalid>",
        OperationStatus.INITIALIZED: "INIT",
        OperationStatus.IN_PROGRESS: "PROC",
        OperationStatus.COMPLETE: "DONE",
        OperationStatus.CANCELLED: "STOP",
        OperationStatus.ERRORED: "ERR",
    }
    assert f"{OperationStatus.COMPLETE}" == "DONE" and f"{OperationStatus.ERRORED:>4}" == " ERR"
    assert OperationStatus.COMPLETE.name == "COMPLETE"
    assert [str(k) for k in OperationKind] == ["<invalid>", "READ", "WRITE"]

    async def main():
        with await connector().create_readable(Descriptor(bytearray(4))) as op:
            assert str(op.status) == "INIT"
            assert "INIT" in repr(op)

    run(main())


def test_xpu_memory_is_refused_for_transfers():
    xpu = Descriptor((0xDEAD0000, 64, "xpu:0", None))
    assert xpu.device == Device("xpu:0") and xpu.metadata.device == "xpu:0"

    async def main():
        a, b = connector(), connector()
        with pytest.raises(ValueError, match="XPU memory is not supported"):
            await a.create_readable(xpu)
        with pytest.raises(ValueError, match="XPU memory is not supported"):
            await a.create_writable([Descriptor(bytearray(8)), xpu])
        with await a.create_readable(Descriptor(bytearray(64))) as readable:
            with pytest.raises(ValueError, match="XPU memory is not supported"):
                await b.begin_read(readable.metadata(), xpu)
        with await a.create_writable(Descriptor(bytearray(64))) as writable:
            with pytest.raises(ValueError, match="XPU memory is not supported"):
                await b.begin_write(xpu, writable.metadata())

    run(main())


def test_exports():
    for name in ("SerializedDescriptor", "ForeignMetadataError", "DescriptorInfo", "RdmaMetadata"):
        assert name in ferry.__all__ and hasattr(ferry, name)
    assert issubclass(ForeignMetadataError, ValueError)
    assert hasattr(RdmaMetadata, "to_descriptors") and hasattr(SerializedDescriptor, "to_descriptor")
