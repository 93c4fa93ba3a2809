"""The executor agent's own shape beyond the house rules (tests/unit/test_house_rules.py: no circle, no module over
400 lines, no module alias), read from its source (pure: nothing is imported but the SDK): the run guard's modules
use only the standard library and each other (the guard runs as ``python -I -S``: no package, no site, so a
product import would stop every ``command`` run), and the SDK's public names stay importable from ``teto.sdk``
as from ``agents.executor.sdk``, however its implementation is split (sdk.py, sdk_link.py, sdk_gang.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "agents" / "executor"
GUARD_MODULES = ("guard", "guard_protocol", "guard_child", "confine")


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
