"""What starting a run's process takes, shared by the agent's own start (runner.py), the launch it builds
(launch.py) and its guard's start (guard_client.py): the ``Launch`` and the size of a run's output pipes.

It imports nothing of the package: the modules that start a process all stand on it, none on another for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20  # room for a burst of output while the agent's loop is busy elsewhere


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    cwd: Path | None = None
    guarded: bool = False  # started by the agent's guard (guard.py), which outlives no agent and fences the run
