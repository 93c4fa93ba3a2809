"""The house rules (docs/architecture.md, "House rules"), checked by reading the product's code, never running it:

(a) no import circle among the modules of libs/, services/, agents/ and teto/, counting every import statement
    (relative ones, those inside functions and those under ``TYPE_CHECKING``): a circle found by Tarjan's
    strongly connected components;
(b) no product module over ``MAX_LINES`` lines (every line counted);
(c) arrows only downward: libs imports nothing from services, agents or teto; services and agents never import
    teto nor each other; one service never imports another (services.queue -> services.budget);
(d) no module alias made with ``from . import X as Y`` (X a module of the product: ``from . import nodes as
    store`` hides which module is used), and no module's attribute assigned from outside it (``checks.kick =
    relay.kick``, or ``setattr(checks, ...)``, at module or function level, ``checks`` an imported product module):
    wiring is done by passing things in, not by patching another module.

Each rule is a pure function of a source tree, proven on a small synthetic tree that breaks it, then applied to
the real tree, where a failure names every offender (module, file and line).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("libs", "services", "agents", "teto")
MAX_LINES = 400
# What each top-level package may not import (rule c); teto may import anything.
FORBIDDEN = {"libs": {"services", "agents", "teto"}, "services": {"teto", "agents"}, "agents": {"teto", "services"}}


@dataclass(frozen=True)
class Edge:
    source: str  # the importing module
    target: str  # the product module imported
    path: str  # the importing file, relative to the tree's root
    line: int


@dataclass
class Tree:
    """The product's modules (dotted name -> file) and their parsed sources."""

    root: Path
    files: dict[str, Path]
    parsed: dict[str, ast.Module]

    def rel(self, module: str) -> str:
        return str(self.files[module].relative_to(self.root))


def read_tree(root: Path) -> Tree:
    files: dict[str, Path] = {}
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    parsed = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in files.items()}
    return Tree(root, files, parsed)


def _package_of(tree: Tree, module: str) -> list[str]:
    parts = module.split(".")
    return parts if tree.files[module].name == "__init__.py" else parts[:-1]


def _base(tree: Tree, module: str, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from ... import`` reads from (None: a relative import leaving the tree)."""
    if not node.level:
        return node.module or ""
    package = _package_of(tree, module)
    if node.level - 1 > len(package):
        return None
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _known(tree: Tree, dotted: str) -> str | None:
    """The product module ``dotted`` names, else the closest enclosing one (``a.b.f`` -> ``a.b``)."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in tree.files:
            return name
        parts.pop()
    return None


def imported(tree: Tree, module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(product module imported, the name it is bound to here, or None) for each name of one import."""
    out: list[tuple[str, str | None]] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = _known(tree, alias.name)
            if target is not None:
                out.append((target, alias.asname))
        return out
    base = _base(tree, module, node)
    if base is None:
        return out
    for alias in node.names:
        full = f"{base}.{alias.name}" if base else alias.name
        if full in tree.files:
            out.append((full, alias.asname or alias.name))
        elif base in tree.files:
            out.append((base, None))
    return out


def edges(tree: Tree) -> Iterator[Edge]:
    """Every import of a product module, wherever the statement is (function, ``if TYPE_CHECKING``, try)."""
    for module, parsed in tree.parsed.items():
        for node in ast.walk(parsed):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in imported(tree, module, node):
                    if target != module:
                        yield Edge(module, target, tree.rel(module), node.lineno)


# -- (a) circles -------------------------------------------------------------------------------------------


def circles(tree: Tree) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan, without recursion), sorted."""
    graph: dict[str, set[str]] = {m: set() for m in tree.files}
    for e in edges(tree):
        graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
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
    return sorted(found)


def circle_findings(tree: Tree) -> list[str]:
    out = []
    for component in circles(tree):
        members = set(component)
        inside = sorted({f"{e.path}:{e.line} {e.source} -> {e.target}" for e in edges(tree)
                         if e.source in members and e.target in members})
        out.append("circle " + " <-> ".join(component) + ": " + "; ".join(inside))
    return out


# -- (b) size ----------------------------------------------------------------------------------------------


def oversized(tree: Tree) -> list[str]:
    out = []
    for module, path in tree.files.items():
        with path.open() as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            out.append(f"{tree.rel(module)}: {lines} lines (most {MAX_LINES})")
    return sorted(out)


# -- (c) arrows --------------------------------------------------------------------------------------------


def upward(tree: Tree) -> list[str]:
    out = set()
    for e in edges(tree):
        src, dst = e.source.split("."), e.target.split(".")
        if dst[0] in FORBIDDEN.get(src[0], set()):
            out.add(f"{e.path}:{e.line} {e.source} -> {e.target} ({src[0]} never imports {dst[0]})")
        elif src[0] == dst[0] == "services" and len(src) > 1 and len(dst) > 1 and src[1] != dst[1]:
            out.add(f"{e.path}:{e.line} {e.source} -> {e.target} (one service imports another)")
    return sorted(out)


# -- (d) aliases and wiring --------------------------------------------------------------------------------


def module_aliases(tree: Tree) -> list[str]:
    out = []
    for module, parsed in tree.parsed.items():
        for node in ast.walk(parsed):
            if not (isinstance(node, ast.ImportFrom) and node.level and node.module is None):
                continue
            for alias in node.names:
                base = _base(tree, module, node)
                if alias.asname and alias.asname != alias.name and f"{base}.{alias.name}" in tree.files:
                    out.append(f"{tree.rel(module)}:{node.lineno} from {'.' * node.level} import {alias.name} "
                               f"as {alias.asname} (a module under another name)")
    return sorted(out)


def _module_names(tree: Tree, module: str, scope: ast.AST) -> dict[str, str]:
    """Names bound to a product module by the imports directly in ``scope`` (not in nested functions)."""
    names: dict[str, str] = {}
    for node in _own_nodes(scope):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is None:  # ``import a.b`` binds ``a``
                    head = alias.name.split(".")[0]
                    if head in tree.files:
                        names[head] = head
                elif alias.name in tree.files:
                    names[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            for target, bound in imported(tree, module, node):
                if bound is not None:
                    names[bound] = target
    return names


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a module or function body, not descending into nested functions or classes."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _local_names(scope: ast.AST) -> set[str]:
    """Names a function binds itself other than by import (its parameters, assignments): they hide a module."""
    names: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = scope.args
        names |= {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p is not None}
    for node in _own_nodes(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _root_name(target: ast.expr) -> str | None:
    while isinstance(target, ast.Attribute):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def patched_modules(tree: Tree) -> list[str]:
    out = []
    for module, parsed in tree.parsed.items():
        top = _module_names(tree, module, parsed)
        scopes: list[tuple[ast.AST, dict[str, str]]] = [(parsed, top)]
        scopes += [(f, {**{k: v for k, v in top.items() if k not in _local_names(f)},
                        **_module_names(tree, module, f)})
                   for f in ast.walk(parsed) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope, names in scopes:
            for node in _own_nodes(scope):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = [t for t in node.targets if isinstance(t, ast.Attribute)]
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Attribute):
                    targets = [node.target]
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                      and node.args and isinstance(node.args[0], (ast.Name, ast.Attribute))):
                    targets = [node.args[0]]
                for target in targets:
                    name = _root_name(target)
                    if name in names:
                        out.append(f"{tree.rel(module)}:{node.lineno} {ast.unparse(target)} assigned from outside "
                                   f"the module {names[name]}")
    return sorted(set(out))


RULES = {"circles": circle_findings, "size": oversized, "arrows": upward, "aliases": module_aliases,
         "patching": patched_modules}


# -- the checker, proven on synthetic trees ----------------------------------------------------------------


def make_tree(root: Path, files: dict[str, str]) -> Tree:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_tree(root)


PACKAGES = {"libs/__init__.py": "", "libs/runtime/__init__.py": "", "services/__init__.py": "",
            "services/queue/__init__.py": "", "services/budget/__init__.py": "", "agents/__init__.py": "",
            "agents/executor/__init__.py": "", "teto/__init__.py": ""}


@pytest.mark.parametrize("second", [
    "from libs.runtime import a\n",
    "from . import a\n",
    "from .a import thing\n",
    "def f():\n    from .a import thing\n    return thing\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import Thing\n",
    "import libs.runtime.a\n",
], ids=["absolute", "relative module", "relative name", "inside a function", "under TYPE_CHECKING", "import"])
def test_a_circle_is_found_however_the_import_is_written(tmp_path, second):
    tree = make_tree(tmp_path, {**PACKAGES, "libs/runtime/a.py": "from .b import g\n", "libs/runtime/b.py": second})
    assert circles(tree) == [["libs.runtime.a", "libs.runtime.b"]]
    assert "libs/runtime/a.py:1 libs.runtime.a -> libs.runtime.b" in circle_findings(tree)[0]


def test_a_long_circle_is_one_finding_and_a_chain_is_none(tmp_path):
    tree = make_tree(tmp_path, {**PACKAGES, "teto/a.py": "from . import b\n", "teto/b.py": "from . import c\n",
                                "teto/c.py": "from teto import a\n", "teto/d.py": "from . import a\n",
                                "teto/e.py": "from . import d\n"})
    assert circles(tree) == [["teto.a", "teto.b", "teto.c"]]
    tree = make_tree(tmp_path, {"teto/c.py": "import json\n"})
    assert circles(tree) == [] and circle_findings(tree) == []


def test_a_package_and_its_modules_importing_each_other_is_a_circle(tmp_path):
    tree = make_tree(tmp_path, {**PACKAGES, "teto/pages/__init__.py": "def pages():\n    from . import one\n",
                                "teto/pages/one.py": "from . import NavItem\n"})
    assert circles(tree) == [["teto.pages", "teto.pages.one"]]


def test_a_module_over_the_limit_is_named_and_one_at_it_is_not(tmp_path):
    tree = make_tree(tmp_path, {**PACKAGES, "services/queue/big.py": "x = 1\n" * (MAX_LINES + 1),
                                "services/queue/full.py": "x = 1\n" * MAX_LINES})
    assert oversized(tree) == [f"services/queue/big.py: {MAX_LINES + 1} lines (most {MAX_LINES})"]


@pytest.mark.parametrize(("path", "source", "why"), [
    ("libs/runtime/x.py", "from services.queue import app\n", "libs never imports services"),
    ("libs/runtime/x.py", "def f():\n    import agents.executor.run\n", "libs never imports agents"),
    ("libs/runtime/x.py", "from teto import cli\n", "libs never imports teto"),
    ("services/queue/x.py", "from teto import cli\n", "services never imports teto"),
    ("services/queue/x.py", "from agents.executor import run\n", "services never imports agents"),
    ("agents/executor/x.py", "from services.queue.app import main\n", "agents never imports services"),
    ("agents/executor/x.py", "from teto.cli import main\n", "agents never imports teto"),
    ("services/queue/x.py", "from services.budget import ledger\n", "one service imports another"),
    ("services/queue/x.py", "from ..budget.ledger import spend\n", "one service imports another"),
])
def test_an_arrow_pointing_upward_is_named(tmp_path, path, source, why):
    tree = make_tree(tmp_path, {**PACKAGES, "services/queue/app.py": "", "services/budget/ledger.py": "spend = 1\n",
                                "agents/executor/run.py": "", "teto/cli.py": "", path: source})
    found = upward(tree)
    assert len(found) == 1 and found[0].startswith(f"{path}:") and why in found[0], found


def test_downward_arrows_and_imports_inside_one_service_are_allowed(tmp_path):
    tree = make_tree(tmp_path, {**PACKAGES, "libs/runtime/bus.py": "", "services/queue/store.py": "",
                                "services/queue/app.py": "from libs.runtime import bus\nfrom . import store\n",
                                "agents/executor/run.py": "from libs.runtime import bus\n",
                                "teto/cli.py": "from services.queue import app\nfrom agents.executor import run\n"})
    assert upward(tree) == []


def test_a_module_imported_under_another_name_is_named(tmp_path):
    tree = make_tree(tmp_path, {**PACKAGES, "services/queue/nodes.py": "", "services/queue/domain/__init__.py": "",
                                "services/queue/domain/rules.py": "",
                                "services/queue/a.py": "from . import nodes as store\n",
                                "services/queue/domain/b.py": "from .. import nodes as n, app\n",
                                "services/queue/app.py": "from . import nodes\nfrom .nodes import x as y\n"
                                                         "from .domain import rules\nfrom . import nodes as nodes\n"})
    assert module_aliases(tree) == [
        "services/queue/a.py:1 from . import nodes as store (a module under another name)",
        "services/queue/domain/b.py:1 from .. import nodes as n (a module under another name)"]


@pytest.mark.parametrize("source", [
    "from . import checks, relay\nchecks.kick = relay.kick\n",
    "from . import checks\ndef wire(f):\n    checks.kick = f\n",
    "from services.queue import checks\nasync def wire(f):\n    checks.kick = f\n",
    "import services.queue.checks\nservices.queue.checks.kick = print\n",
    "import services.queue.checks as c\nc.limit += 1\n",
    "from . import checks\nsetattr(checks, 'kick', print)\n",
    "def wire(f):\n    from . import checks\n    checks.kick: object = f\n",
], ids=["module level", "in a function", "in a coroutine", "dotted", "augmented", "setattr", "imported in the function"])
def test_a_module_attribute_assigned_from_outside_is_named(tmp_path, source):
    tree = make_tree(tmp_path, {**PACKAGES, "services/queue/checks.py": "kick = None\nlimit = 1\n",
                                "services/queue/relay.py": "def kick():\n    pass\n",
                                "services/queue/wiring.py": source})
    found = patched_modules(tree)
    assert len(found) == 1 and found[0].startswith("services/queue/wiring.py:"), found
    assert "services.queue.checks" in found[0]


def test_assigning_attributes_of_objects_and_of_shadowed_names_is_allowed(tmp_path):
    source = ("import json\nfrom . import checks\nfrom .checks import Box\n"
              "json.decoder = None\n"  # not a product module
              "box = Box()\nbox.kick = 1\n"
              "def f(checks):\n    checks.kick = 1\n"  # a parameter, not the module
              "def g():\n    checks = Box()\n    checks.kick = 2\n"
              "class C:\n    def __init__(self):\n        self.kick = 3\n")
    tree = make_tree(tmp_path, {**PACKAGES, "services/queue/checks.py": "class Box:\n    kick = 0\n",
                                "services/queue/wiring.py": source})
    assert patched_modules(tree) == []


# -- the real tree -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def product() -> Tree:
    return read_tree(ROOT)


def test_the_tree_reader_sees_the_whole_product(product):
    # A sanity check that the rules below look at something: every layer is there, with its packages.
    assert {m.split(".")[0] for m in product.files} == set(LAYERS)
    assert "services.queue.app" in product.files and "libs.runtime.service" in product.files
    assert any(e.source == "libs.runtime.service" and e.target == "libs.runtime.observe" for e in edges(product))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_product_keeps_the_house_rule(product, rule):
    found = RULES[rule](product)
    assert found == [], f"house rule {rule!r} broken ({len(found)}):\n" + "\n".join(found)
