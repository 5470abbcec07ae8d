"""Ferry has every public name of the reference module, ``dynamo.nixl_connect``
of Dynamo 1.6.1 (and the private ones its real callers use), with a
compatible signature.

The reference's names and signatures are vendored as data,
``reference_names_1_6_1.json`` (its format is described in the file); this
module walks them and checks ``import ferry as nixl_connect``:

- each class (and enum, and pydantic model) exists, and descends from the
  listed bases of the reference (``ReadOperation`` is an ``ActiveOperation``,
  which is an ``AbstractOperation``...);
- each enum member exists with the reference's value;
- each property (or field) exists on the class;
- each method exists and accepts what the reference accepts: the same
  parameter names in the same positions (keyword-only ones by name), a
  default wherever the reference has one, and nothing more that is required
  (``inspect.signature``; a callable without a signature passes on
  existence); for dunders, only the number of positional arguments;
- the private attributes callers use (``Descriptor._data_size``, settable,
  and ``Descriptor._data_ref``) exist on a descriptor.

Whether a reference coroutine is awaitable in Ferry is checked by the
test_caller_*.py modules, which await them.
"""

from __future__ import annotations

import enum
import inspect
import json
import os
from typing import Any, Dict, List, Tuple

import pytest

import ferry as nixl_connect

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "reference_names_1_6_1.json")) as f:
    REFERENCE: Dict[str, Any] = json.load(f)["names"]

CLASSES = sorted(REFERENCE)
MEMBERS: List[Tuple[str, str, Any]] = [
    (cls, name, spec) for cls in CLASSES for name, spec in REFERENCE[cls]["members"].items()
]


def ferry_class(name: str) -> Any:
    cls = getattr(nixl_connect, name, None)
    assert cls is not None, f"ferry has no {name}"
    assert isinstance(cls, type), f"ferry.{name} is a {type(cls).__name__}, not a class"
    return cls


@pytest.mark.parametrize("name", CLASSES)
def test_class(name):
    spec = REFERENCE[name]
    cls = ferry_class(name)
    for base in spec["bases"]:
        if base == "IntEnum":
            assert issubclass(cls, enum.IntEnum), f"{name} is not an IntEnum"
        elif base != "BaseModel":  # a model need only behave as one (see the members)
            assert issubclass(cls, ferry_class(base)), f"{name} does not derive from {base}"


def parse_params(params: List[str]) -> List[Tuple[str, bool, bool]]:
    """``[(name, keyword_only, has_default)]`` of the reference's notation."""
    return [(p.strip("*=").strip(), p.startswith("*"), p.endswith("=")) for p in params]


def own_signature(cls: Any, name: str) -> Any:
    """The signature of ``cls.name`` as a caller sees it: without self/cls."""
    raw = inspect.getattr_static(cls, name)
    obj = getattr(cls, name)
    if name == "__init__":
        # What `cls(...)` accepts (pydantic models synthesize theirs).
        return inspect.signature(cls)
    sig = inspect.signature(obj)
    if inspect.isfunction(raw) or (not isinstance(raw, (staticmethod, classmethod)) and not inspect.ismethod(obj) and callable(raw) and not inspect.isclass(raw)):
        params = list(sig.parameters.values())
        if params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            sig = sig.replace(parameters=params[1:])
    return sig


def check_params(where: str, sig: inspect.Signature, ref: List[Tuple[str, bool, bool]], positional_only: bool) -> None:
    P = inspect.Parameter
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    var_pos = any(p.kind == P.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind == P.VAR_KEYWORD for p in params)
    by_name = {p.name: p for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    if positional_only:
        n = len([r for r in ref if not r[1]])
        assert len(positional) >= n or var_pos, f"{where}{sig} takes fewer than {n} positional arguments"
        required = [p for p in positional if p.default is P.empty]
        assert len(required) <= n, f"{where}{sig} requires more than {n} positional arguments"
        return
    used = set()
    i = 0
    for name, keyword_only, has_default in ref:
        if keyword_only:
            p = by_name.get(name)
            assert p is not None or var_kw, f"{where}{sig} has no keyword {name!r}"
        else:
            if i < len(positional):
                p = positional[i]
                assert p.name == name, f"{where}{sig}: positional argument {i} is {p.name!r}, the reference's is {name!r}"
                assert p.kind == P.POSITIONAL_OR_KEYWORD, f"{where}{sig}: {name!r} cannot be passed by keyword"
            else:
                assert var_pos and (name in by_name or var_kw), f"{where}{sig} has no argument {name!r}"
                p = by_name.get(name)
            i += 1
        if p is not None:
            used.add(p.name)
            if has_default:
                assert p.default is not P.empty, f"{where}{sig}: {name!r} has no default (the reference's has one)"
    for p in params:
        if p.name not in used and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            assert p.default is not P.empty, f"{where}{sig}: {p.name!r} is required, and not in the reference"


def model_fields(cls: Any) -> Dict[str, Any]:
    return dict(getattr(cls, "model_fields", {}) or {})


def has_static(cls: Any, name: str) -> bool:
    """Whether the class (or a base) defines `name`, without running it."""
    try:
        inspect.getattr_static(cls, name)
    except AttributeError:
        return False
    return True


@pytest.mark.parametrize("cls_name,name,spec", MEMBERS, ids=[f"{c}.{n}" for c, n, _ in MEMBERS])
def test_member(cls_name, name, spec):
    cls = ferry_class(cls_name)
    where = f"ferry.{cls_name}.{name}"
    if spec == "property":
        assert has_static(cls, name) or name in model_fields(cls), f"{where} does not exist"
        return
    kind = spec["kind"]
    if kind == "member":
        member = getattr(cls, name, None)
        assert member is not None, f"{where} does not exist"
        assert isinstance(member, cls) and int(member) == spec["value"], f"{where} is {member!r}, not {spec['value']}"
        return
    if kind == "field":
        fields = model_fields(cls)
        if fields:
            assert name in fields, f"{where} is not a field"
            if "default" in spec:
                field = fields[name]
                assert not field.is_required(), f"{where} is required (the reference's defaults to {spec['default']!r})"
        else:
            assert has_static(cls, name), f"{where} does not exist"
        return
    if kind == "attribute":
        data = bytearray(16)
        d = cls(data)
        assert hasattr(d, name), f"{where} does not exist on a descriptor"
        if name == "_data_size":
            assert d._data_size == 16
            if spec.get("settable"):
                d._data_size = 8
                assert d._data_size == 8 and d.size == 8, "setting _data_size does not change the descriptor's size"
                d._data_size = 16
        elif name == "_data_ref":
            assert d._data_ref is data
        return
    # methods
    assert has_static(cls, name), f"{where} does not exist"
    obj = getattr(cls, name)
    assert callable(obj), f"{where} is not callable"
    if kind == "staticmethod":
        assert isinstance(inspect.getattr_static(cls, name), staticmethod), f"{where} is not a staticmethod"
    if kind == "classmethod":
        assert inspect.ismethod(obj) and obj.__self__ is cls, f"{where} is not a classmethod"
    if "params" not in spec:
        return
    try:
        sig = own_signature(cls, name)
    except (TypeError, ValueError):
        return  # a callable without a signature (a C method): it exists
    check_params(where, sig, parse_params(spec["params"]), spec.get("positional_only_check", False))


def test_vendored_list_is_whole():
    """The list names every public class of the reference (a guard against
    an edit that drops one)."""
    assert set(CLASSES) == {
        "AbstractOperation", "ActiveOperation", "Connection", "Connector", "Descriptor", "Device",
        "DeviceKind", "OperationKind", "OperationStatus", "PassiveOperation", "RdmaMetadata",
        "ReadOperation", "ReadableOperation", "Remote", "SerializedDescriptor", "WritableOperation",
        "WriteOperation",
    }
    assert len(MEMBERS) > 80
