"""The type stubs match the compiled module, and the package is typed."""

from __future__ import annotations

import ast
import inspect
import os
from typing import Dict, Set

import ferry
import ferry._ferry as compiled

PACKAGE = os.path.dirname(ferry.__file__)

# What every module and class has without declaring it.
MODULE_NOISE = {"__doc__", "__file__", "__loader__", "__name__", "__package__", "__spec__", "__all__", "__builtins__", "__cached__", "__path__"}


def stub_names(path: str) -> Dict[str, Set[str]]:
    """Top-level public names of a .pyi, each with its public members."""
    with open(path) as f:
        tree = ast.parse(f.read())
    names: Dict[str, Set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {
                n.name
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and (not n.name.startswith("_") or n.name == "__init__")
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names[t.id] = set()
    return {k: v for k, v in names.items() if not k.startswith("_") or k == "__version__"}


def runtime_members(cls: type) -> Set[str]:
    members = {n for n in vars(cls) if not n.startswith("_")}
    if has_constructor(cls):
        members.add("__init__")
    return members


def has_constructor(cls: type) -> bool:
    """Whether a compiled class can be created from Python."""
    if getattr(cls, "__text_signature__", None) is not None:
        return True
    # Older Pythons show no signature; a class without one refuses so.
    try:
        cls.__new__(cls)  # type: ignore[call-overload]
    except TypeError as e:
        return not any(m in str(e) for m in ("No constructor defined", "cannot create"))
    return True


def test_compiled_module_matches_its_stub():
    stub = stub_names(os.path.join(PACKAGE, "_ferry.pyi"))
    runtime = {n for n in dir(compiled) if n not in MODULE_NOISE}
    assert set(stub) == runtime, (
        f"only in the stub: {sorted(set(stub) - runtime)}; only in the module: {sorted(runtime - set(stub))}"
    )
    for name, members in stub.items():
        obj = getattr(compiled, name)
        if inspect.isclass(obj):
            assert members == runtime_members(obj), (
                f"{name}: only in the stub: {sorted(members - runtime_members(obj))}; "
                f"only in the module: {sorted(runtime_members(obj) - members)}"
            )


def test_stub_signatures_match_the_compiled_functions():
    """Parameter names of every function and method, where the compiled
    object exposes its signature."""
    with open(os.path.join(PACKAGE, "_ferry.pyi")) as f:
        tree = ast.parse(f.read())

    def params(fn: ast.FunctionDef):
        return [a.arg for a in fn.args.args if a.arg != "self"]

    checked = 0
    for node in tree.body:
        targets = []
        if isinstance(node, ast.FunctionDef):
            targets.append((getattr(compiled, node.name), node))
        elif isinstance(node, ast.ClassDef):
            cls = getattr(compiled, node.name)
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and not any(
                    isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list
                ):
                    target = cls if fn.name == "__init__" else getattr(cls, fn.name)
                    targets.append((target, fn))
        for obj, fn in targets:
            try:
                sig = inspect.signature(obj)
            except (TypeError, ValueError):
                continue
            names = [p for p in sig.parameters if p not in ("self", "cls")]
            assert names == params(fn), (fn.name, names, params(fn))
            checked += 1
    assert checked >= 10


def test_package_is_typed():
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))
    for name in ferry.__all__:
        assert hasattr(ferry, name), name
    # ferry.nixl and ferry.vllm are subpackages imported on demand (the
    # test modules that use them import them at collection): once imported
    # each is an attribute of the package, not one of its names.
    public = {n for n in dir(ferry) if not n.startswith("_")} - {"annotations", "nixl", "vllm"}
    # Every public name of the package is in __all__ (no stray helper leaks).
    assert public <= set(ferry.__all__), public - set(ferry.__all__)
