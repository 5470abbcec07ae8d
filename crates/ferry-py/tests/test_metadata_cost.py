"""What the binding spends on metadata from another process follows the
bytes of that metadata (issue 33, item 7).

- Paged metadata (runs of equal blocks) is described lazily: a document of
  about 250 bytes that claims 2^20 one-byte blocks costs, through
  ``.descriptors``, ``to_descriptors()`` and ``descriptor_runs``, a bounded
  allocation and no work per block.
- Every malformed document raises ``ValueError`` (``ForeignMetadataError``
  for the reference's NIXL metadata), whatever is wrong with it: nesting
  deeper than any parser goes (``RecursionError`` in Python's), a field of
  the wrong type, truncation or any byte changed.
"""

from __future__ import annotations

import json
import pickle
import random
import time
import tracemalloc
from typing import Any, Callable, Dict, List, Optional

import pytest
from conftest import run

import ferry
from ferry import Connector, Descriptor, RdmaMetadata, SerializedDescriptor

BLOCKS = 1 << 20  # the most descriptors metadata may describe

# What accessing the descriptors of the paged document may allocate in
# Python objects, at its peak: a few items and the runs (one here), against
# more than 100 MiB when each block is made (one tuple, one string and one
# object per block).
PEAK_BOUND = 256 << 10
# CPU seconds for the same accesses: microseconds of work; 4 s when each
# block is made. The bound leaves a margin of hundreds on a loaded machine.
CPU_BOUND = 1.0


async def _real_metadata(*buffers: bytearray) -> Dict[str, Any]:
    c = Connector(listen="127.0.0.1:0")
    with await c.create_readable([Descriptor(b) for b in buffers]) as op:
        dumped: Dict[str, Any] = op.metadata().model_dump()
    return dumped


def real_metadata(*buffers: bytearray) -> Dict[str, Any]:
    """The ``model_dump()`` of a real readable's metadata."""
    result: Dict[str, Any] = run(_real_metadata(*(buffers or (bytearray(16),))))
    return result


def paged_document() -> str:
    """What a peer can send: a real metadata document whose descriptors are
    one run of 2^20 one-byte blocks."""
    fields = real_metadata()
    fields["descriptors"] = [{"device": "cpu", "size": 1, "count": BLOCKS}]
    return json.dumps(fields, separators=(",", ":"))


def test_paged_metadata_costs_what_its_bytes_do():
    text = paged_document()
    assert len(text) < 400, len(text)
    m = RdmaMetadata.model_validate_json(text)
    assert m.descriptor_count == BLOCKS

    tracemalloc.start()
    cpu = time.process_time()
    try:
        descriptors = m.descriptors
        count = len(descriptors)
        first, middle, last = descriptors[0], descriptors[BLOCKS // 2], descriptors[-1]
        tail = descriptors[-3:]
        every_other = descriptors[::2]
        remote = m.to_descriptors()
        remote_count = len(remote)  # type: ignore[arg-type]
        remote_last = remote[-1]  # type: ignore[index]
        runs = m.descriptor_runs
        found = SerializedDescriptor(device="cpu", ptr=0, size=1) in descriptors
        # The reference's way of rebuilding metadata from its parts.
        rebuilt = RdmaMetadata(
            descriptors=descriptors,
            nixl_metadata=m.nixl_metadata,
            notification_key=m.notification_key,
            operation_kind=m.operation_kind,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cpu = time.process_time() - cpu

    assert peak < PEAK_BOUND, f"{peak} bytes allocated at the peak (bound {PEAK_BOUND})"
    assert cpu < CPU_BOUND, f"{cpu:.2f} s of CPU (bound {CPU_BOUND} s)"
    assert count == remote_count == BLOCKS
    for d in (first, middle, last):
        assert (d.device, d.ptr, d.size) == ("cpu", 0, 1)
    assert len(tail) == 3 and len(every_other) == BLOCKS // 2
    assert (remote_last.size, remote_last.ptr, str(remote_last.device)) == (1, 0, "cpu")
    assert len(runs) == 1 and runs[0][1] == BLOCKS
    assert found and rebuilt == m
    # Slicing keeps runs: a one-item-shorter list of the reference's fields
    # no longer matches, and says so without listing a million items.
    with pytest.raises(ValueError, match="do not match") as e:
        RdmaMetadata(nixl_metadata=m.nixl_metadata, descriptors=descriptors[:-1])
    assert len(str(e.value)) < 1000


def test_a_visit_of_every_block_keeps_one_item_at_a_time():
    """Iteration makes items as it goes: visiting all 2^20 blocks holds no
    list of them."""
    m = RdmaMetadata.model_validate_json(paged_document())
    tracemalloc.start()
    try:
        total = sum(d.size for d in m.descriptors)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == BLOCKS
    assert peak < PEAK_BOUND, peak


# ---- DescriptorSequence reads as the list it stands for ----


def _item(device: str, size: int) -> SerializedDescriptor:
    return SerializedDescriptor(device=device, ptr=0, size=size)


def test_descriptor_sequence_behaves_as_its_list():
    from ferry import DescriptorSequence

    rng = random.Random(33)
    for _ in range(40):
        runs = [
            (rng.choice(["cpu", "cuda:0", "cuda:1"]), rng.choice([0, 1, 7, 4096]), rng.randint(0, 6))
            for _ in range(rng.randint(0, 6))
        ]
        seq = DescriptorSequence(runs, _item)
        items = [_item(d, s) for d, s, n in runs for _ in range(n)]
        assert len(seq) == len(items)
        assert list(seq) == items and seq == items and seq == tuple(items)
        assert list(reversed(seq)) == items[::-1]
        for i in range(-len(items) - 2, len(items) + 2):
            if -len(items) <= i < len(items):
                assert seq[i] == items[i]
            else:
                with pytest.raises(IndexError):
                    seq[i]
        for _ in range(30):
            a, b = rng.randint(-9, 9), rng.randint(-9, 9)
            step = rng.choice([None, 1, 2, 3, -1, -2, -3])
            sliced = seq[a:b:step]
            assert isinstance(sliced, DescriptorSequence)
            assert list(sliced) == items[a:b:step], (runs, a, b, step)
        for probe in {_item(d, s) for d, s, _ in runs} | {_item("cpu", 3)}:
            assert (probe in seq) == (probe in items)
            assert seq.count(probe) == items.count(probe)
            if probe in items:
                assert seq.index(probe) == items.index(probe)
                start = rng.randint(0, len(items))
                if probe in items[start:]:
                    assert seq.index(probe, start) == items.index(probe, start)
            else:
                with pytest.raises(ValueError):
                    seq.index(probe)
        assert seq + [1] == items + [1] and [1] + seq == [1] + items
        assert pickle.loads(pickle.dumps(seq)) == seq
        assert DescriptorSequence(runs, _item) == seq
        if len(items) <= 16:
            assert repr(seq) == repr(items)
    with pytest.raises(TypeError):
        DescriptorSequence([("cpu", 1, 2)], _item)["0"]  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        hash(DescriptorSequence([], _item))
    big = DescriptorSequence([("cpu", 1, BLOCKS), ("cuda:0", 2, 1)], _item)
    assert "len=1048577" in repr(big) and len(repr(big)) < 500


# ---- every malformed document raises ValueError ----

DEEP = 100_000


def deep_list(depth: int = DEEP) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def reference_fields(ferry_json: str) -> Dict[str, Any]:
    """The reference's fields around Ferry's metadata."""
    return {
        "descriptors": [{"device": "cpu", "ptr": 0, "size": 16}],
        "nixl_metadata": ferry_json,
        "notification_key": "k",
        "operation_kind": 1,
    }


def parsers() -> Dict[str, Callable[[Any], Any]]:
    """Every way a document (text or a dict) becomes metadata or a
    serialized descriptor."""
    return {
        "from_json": RdmaMetadata.from_json,
        "model_validate_json": RdmaMetadata.model_validate_json,
        "from_json(bytes)": lambda t: RdmaMetadata.from_json(t.encode() if isinstance(t, str) else t),
        "from_json(bytearray)": lambda t: RdmaMetadata.from_json(
            bytearray(t.encode()) if isinstance(t, str) else t
        ),
        "nixl_metadata": lambda t: RdmaMetadata(nixl_metadata=t),
        "SerializedDescriptor.model_validate_json": SerializedDescriptor.model_validate_json,
    }


def expect_value_error(parse: Callable[[Any], Any], document: Any) -> Optional[Any]:
    """`parse(document)`: its result, or None for a ValueError; any other
    exception fails the test (pytest shows it)."""
    try:
        return parse(document)
    except ValueError:
        return None


@pytest.mark.parametrize("name", sorted(parsers()))
def test_deeply_nested_json_raises_value_error(name):
    parse = parsers()[name]
    for text in (
        "[" * DEEP,
        '{"a":' + "[" * DEEP,
        '{"nixl_metadata": "' + "[" * DEEP + '"}',
        json.dumps({"nixl_metadata": '{"a":' + "[" * DEEP}),
        json.dumps({"nixl_metadata": "x", "descriptors": deep_list(500)}),
    ):
        with pytest.raises(ValueError):
            parse(text)
    with pytest.raises(ValueError):
        parse(json.dumps(deep_list(500)))


def test_deeply_nested_dicts_and_pydantic_fields_raise_value_error():
    pydantic = pytest.importorskip("pydantic")
    with pytest.raises(ValueError):
        RdmaMetadata.model_validate({"version": deep_list()})
    with pytest.raises(ValueError):
        RdmaMetadata.model_validate({"nixl_metadata": "x", "descriptors": deep_list()})
    with pytest.raises(ValueError):
        SerializedDescriptor.model_validate({"device": deep_list()})

    class Request(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        serialized_request: Optional[RdmaMetadata] = None

    with pytest.raises(ValueError):  # pydantic's ValidationError is one
        Request.model_validate_json('{"serialized_request":' + "[" * DEEP)
    with pytest.raises(ValueError):
        Request.model_validate({"serialized_request": {"version": deep_list()}})


# Values of every JSON type, to put in place of each field.
SUBSTITUTES: List[Any] = [None, 0, -1, 1 << 70, 1.5, True, "", "x", "cpu", [], [0], {}, {"a": 1}, [[[]]]]


def test_fields_of_every_wrong_type_raise_value_error():
    ferry_fields = real_metadata()
    ferry_json = json.dumps(ferry_fields)
    documents: List[Dict[str, Any]] = []
    for base in (ferry_fields, reference_fields(ferry_json)):
        for key in base:
            for value in SUBSTITUTES:
                documents.append({**base, key: value})
    descriptor = {"device": "cpu", "ptr": 0, "size": 16}
    for key in ("device", "size", "count", "ptr"):
        for value in SUBSTITUTES:
            documents.append({**ferry_fields, "descriptors": [{**descriptor, key: value}]})
            documents.append({**reference_fields(ferry_json), "descriptors": [{**descriptor, key: value}]})
    checked = 0
    for document in documents:
        text = json.dumps(document)
        for parse in (RdmaMetadata.from_json, RdmaMetadata.model_validate_json):
            expect_value_error(parse, text)
        expect_value_error(RdmaMetadata.model_validate, document)
        checked += 1
    for key in descriptor:
        for value in SUBSTITUTES:
            expect_value_error(SerializedDescriptor.model_validate_json, json.dumps({**descriptor, key: value}))
            expect_value_error(SerializedDescriptor.model_validate, {**descriptor, key: value})
    assert checked > 200


def test_mutated_documents_raise_value_error():
    """Truncations, and bytes changed or inserted, in Ferry's metadata and in
    the reference's fields around it: each parses or raises ValueError."""
    ferry_json = json.dumps(real_metadata(bytearray(16), bytearray(8)))
    rng = random.Random(7)
    alphabet = '[]{}",:0123456789-.eE\\ntrufalsxyz \x00\xff'
    parsed = 0
    for base in (ferry_json, json.dumps(reference_fields(ferry_json))):
        for _ in range(1500):
            text = base
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(text))
                what = rng.random()
                if what < 0.2:
                    text = text[:at]
                elif what < 0.6:
                    text = text[:at] + rng.choice(alphabet) + text[at + 1 :]
                else:
                    text = text[:at] + rng.choice(alphabet) * rng.randint(1, 3) + text[at:]
                if not text:
                    text = base
            for name, parse in parsers().items():
                if expect_value_error(parse, text) is not None:
                    parsed += 1
    # Some mutations keep a valid document (a changed digit of the token).
    assert parsed > 0


def test_a_valid_document_still_parses():
    fields = real_metadata(bytearray(16))
    m = RdmaMetadata.model_validate_json(json.dumps(fields))
    assert RdmaMetadata.model_validate(fields) == m
    assert RdmaMetadata(**reference_fields(m.nixl_metadata)) == m
    assert ferry.ForeignMetadataError.__mro__[1] is ValueError
