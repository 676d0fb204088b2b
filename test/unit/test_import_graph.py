"""The package's import graph: no cycles, no imports of the package hidden inside functions,
and the layers import downwards only (core is pure logic; neither the engine nor the simulator
knows a node)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vla_runtime"
# layer -> packages of vla_runtime it must not import
FORBIDDEN = {
    "core": {"ros", "nodes", "drivers", "data", "bench", "launcher", "cli"},
    "engine": {"ros", "nodes", "drivers", "data", "bench", "launcher", "cli"},
    "sim": {"ros", "nodes", "drivers", "data", "bench", "launcher", "cli"},
    "ros": {"nodes", "drivers", "stack", "data", "bench", "cli"},
    "nodes": {"nodes", "stack", "data", "bench", "cli"},  # a node never imports another node
    "drivers": {"nodes", "stack", "data", "bench", "cli"},
    "stack": {"data", "bench", "cli"},
}


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


def test_no_package_imports_inside_functions():
    hidden = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node, target in package_imports(tree):
            if id(node) not in top_level:
                hidden.append(f"{name}:{node.lineno} imports {target}")
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
