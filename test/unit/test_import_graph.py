"""The package's import graph: no cycles; no imports hidden inside functions, but of a few
heavy libraries and of optional ones; the layers import downwards only (core is pure logic;
neither the engine nor the simulator knows a node)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vla_runtime"
# layer -> packages of vla_runtime it must not import
LOWER = {"core", "engine", "sim", "ros"}  # import nothing of the package but core
PACKAGES = {"core", "engine", "sim", "ros", "nodes", "drivers", "stack", "data", "bench",
            "testing", "cli"}  # fmt: skip
FORBIDDEN = {
    **{layer: PACKAGES - {layer, "core"} for layer in LOWER},
    "nodes": {"nodes", "stack", "data", "bench", "testing", "cli"},  # no node imports another
    "drivers": {"engine", "nodes", "stack", "data", "bench", "testing", "cli"},
    "stack": {"nodes", "data", "bench", "testing", "cli"},
    "testing": {"nodes", "drivers", "stack", "data", "bench", "cli"},
}
# Imported where they are used, never at module top: heavy libraries and robot SDKs that a
# process loads only when it runs that back end or that robot (torch: core sets its threads
# without making every process that reads a config pay for loading it).
# ray and starlette: the optional fleet extra.
LAZY = (
    "tensorrt", "lerobot", "franky", "rtde_control", "rtde_receive", "torch", "ray", "starlette",
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(name: str) -> str | None:
    """The package module an import of `name` loads (a name inside a module: that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def package_imports(tree: ast.Module):
    """(import node, imported package module) for every import of the package in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            if name.startswith("vla_runtime"):
                target = resolve(name)
                if target:
                    yield node, target


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for _, target in package_imports(ast.parse(path.read_text())):
            if target != name:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle_and_a_layer_violation():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert resolve("vla_runtime.core.topics.JOINT_STATES") == "vla_runtime.core.topics"
    assert resolve("numpy") is None


def test_no_import_cycles():
    assert cycles(graph()) == []


def catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = {k.id for k in kinds if isinstance(k, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception"})


def hidden_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import below module level, except of a LAZY library and of an
    optional one (inside a `try` that handles its absence)."""
    found = []

    def visit(node: ast.AST, top: bool, optional: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names = (
                    [a.name for a in child.names] if isinstance(child, ast.Import)
                    else [child.module or ""]
                )  # fmt: skip
                for name in names:
                    if not (top or optional or name.split(".")[0].startswith(LAZY)):
                        found.append((child.lineno, name))
                continue
            nested = top and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
            )
            handled = isinstance(child, ast.Try) and any(map(catches_import_error, child.handlers))
            visit(child, nested and not isinstance(child, ast.If), optional or handled)

    visit(tree, True, False)
    return found


def test_the_hidden_import_check_sees_what_it_must():
    tree = ast.parse(
        "import os\n"
        "def f():\n    import json\n    import torch\n"
        "    try:\n        import franka_msgs\n    except ImportError:\n        pass\n"
        "if True:\n    import math\n"
    )
    assert hidden_imports(tree) == [(3, "json"), (10, "math")]


def test_no_imports_inside_functions():
    """Every import at module top, so import cycles and missing dependencies show at once."""
    hidden = [
        f"{name}:{line} imports {module}"
        for name, path in MODULES.items()
        for line, module in hidden_imports(ast.parse(path.read_text()))
    ]
    assert hidden == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_downwards_only(layer):
    prefix = f"vla_runtime.{layer}"
    bad = {f"vla_runtime.{p}" for p in FORBIDDEN[layer]}
    violations = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name == prefix or name.startswith(prefix + ".")
        for target in targets
        if target != name and any(target == b or target.startswith(b + ".") for b in bad)
    ]
    assert violations == []
