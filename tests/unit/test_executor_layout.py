"""The executor agent's house shape (issue 29, point 7), read from its source (pure: nothing is imported but the
SDK): no import circle inside agents/executor, counting imports inside functions and under TYPE_CHECKING; no
module of it over 400 lines; the run guard's modules use only the standard library and each other (the guard
runs as ``python -I -S``: no package, no site); the SDK's public names stay importable from ``teto.sdk``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agents" / "executor"
MAX_LINES = 400
GUARD_MODULES = ("guard", "guard_protocol", "guard_child", "confine")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def imported(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source (functions and TYPE_CHECKING too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                         for alias in node.names)
    return {m for m in found if m in MODULES and m != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_through_a_type_checking_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_executor_is_in_an_import_circle():
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    assert circles({name: imported(name, path) for name, path in MODULES.items()}) == []


@pytest.mark.parametrize("name", sorted(MODULES), ids=str)
def test_every_module_of_the_executor_is_under_400_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)}: {lines} lines"


@pytest.mark.parametrize("name", GUARD_MODULES, ids=str)
def test_the_guards_modules_import_only_the_standard_library_and_each_other(name):
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [alias.name for alias in node.names] if node.level else [(node.module or "").split(".")[0]]
        else:
            continue
        for root in roots:
            assert root in sys.stdlib_module_names or root in GUARD_MODULES, f"{name}.py imports {root}"


def test_the_sdk_keeps_its_public_names_under_teto_sdk():
    import agents.executor.sdk
    import teto.sdk

    assert {"init_distributed", "report_ready", "context", "EXIT_STOPPED", "EXIT_AGENT_GONE"} <= set(teto.sdk.__all__)
    assert teto.sdk.__all__ == agents.executor.sdk.__all__
    for name in agents.executor.sdk.__all__:
        assert getattr(teto.sdk, name) is getattr(agents.executor.sdk, name), name
