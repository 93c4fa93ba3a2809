"""A job's Python environment for tests, made the way an operator makes one (``teto env create``, issue 27).

``shared_environment(extras)`` makes it once per test process under a directory every user can enter (the jobs of
``teto up`` as root run as their own uids, and pytest's temp root is 0700) and removes it at exit. A test offers
it to its executors (``TETO_ENVIRONMENTS``) and names it in its job spec (``"environment"``).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_made: dict[tuple[str, ...], Path] = {}


def shared_environment(extras: list[str] | tuple[str, ...] = ()) -> Path:
    """The environment with Teto's SDK, this installation's packages and ``extras``; made on first use."""
    from teto.cli_env import create

    key = tuple(sorted(extras))
    if key not in _made:
        root = Path(tempfile.mkdtemp(prefix="teto-env-", dir="/tmp"))
        root.chmod(0o755)
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        path = root / ("env-" + "-".join(key) if key else "env")
        create(path, list(key))
        _made[key] = path
    return _made[key]
