"""The suite compiles the project's modules once before any test runs (tests/conftest.py ``pytest_sessionstart``):
with PYTHONDONTWRITEBYTECODE set, every service, agent and CLI process the suite starts would otherwise compile
every module it imports again."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["services/queue/app.py", "services/gateway/api.py", "agents/executor/agent.py",
                                    "libs/contracts/envelope.py", "teto/cli.py"])
def test_the_modules_every_process_imports_are_compiled_before_the_tests_run(module):
    source = REPO / module
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.exists(), cached
    assert cached.stat().st_mtime >= source.stat().st_mtime
