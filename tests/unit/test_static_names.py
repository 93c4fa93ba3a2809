"""Mistakes the interpreter finds only when the line runs, found by reading the code (pyflakes): a name that is
not defined anywhere (a helper renamed or moved to another module while one caller still uses the old name), a
local read before it is assigned, an ``__all__`` naming nothing, and, in the product's own code, an import
nobody uses. A mistake of the first kinds on a rarely taken path (an error handler, a retry) stays hidden until
production takes that path; the suite fails here instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyflakes import api, messages

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("libs", "services", "agents", "teto", "bench")
BROKEN = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class Collect:
    """A pyflakes reporter that keeps the messages instead of printing them."""

    def __init__(self) -> None:
        self.found: list[messages.Message] = []
        self.errors: list[str] = []

    def flake(self, message: messages.Message) -> None:
        self.found.append(message)

    def syntaxError(self, filename: str, msg: str, lineno: int, offset: int, text: str) -> None:  # noqa: N802
        self.errors.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename: str, msg: str) -> None:  # noqa: N802
        self.errors.append(f"{filename}: {msg}")


def flakes(folders: tuple[str, ...]) -> Collect:
    report = Collect()
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            api.checkPath(str(path), report)
    assert not report.errors, report.errors
    return report


def shown(found: list[messages.Message]) -> list[str]:
    return [f"{Path(m.filename).relative_to(ROOT)}:{m.lineno}: {m.message % m.message_args}" for m in found]


@pytest.fixture(scope="module")
def everything() -> Collect:
    return flakes((*PRODUCT, "tests"))


def test_every_name_used_is_defined(everything: Collect) -> None:
    assert shown([m for m in everything.found if isinstance(m, BROKEN)]) == []


def test_the_products_code_imports_nothing_it_does_not_use(everything: Collect) -> None:
    # A name kept only to be re-exported says so with ``# noqa: F401`` on its line (pyflakes does not read
    # noqa; this test does), as the modules that re-export do.
    unused = [m for m in everything.found if isinstance(m, messages.UnusedImport)
              and Path(m.filename).relative_to(ROOT).parts[0] in PRODUCT and not _noqa(m)]
    assert shown(unused) == []


def _noqa(m: messages.Message) -> bool:
    line = Path(m.filename).read_text().splitlines()[m.lineno - 1]
    return "noqa" in line and "F401" in line


def test_the_check_finds_what_it_is_for(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import os\n\n\ndef f():\n    return _int('X', -1)\n")
    report = Collect()
    api.checkPath(str(tmp_path / "broken.py"), report)
    kinds = {type(m) for m in report.found}
    assert kinds == {messages.UndefinedName, messages.UnusedImport}
