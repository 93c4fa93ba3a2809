"""A run's cgroup v2 (I/O): made under its agent's, joined by the child before exec, killed whole when the run
ends (``cgroup.kill``), then removed. Where no cgroup v2 is mounted or it is not writable there is none, and the
sandbox falls back to the process group and a sweep of the run's uid."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from . import isolation

log = logging.getLogger(__name__)

KILL_WAIT_SECONDS = 10.0


_found_root: list[Path] = []  # the cgroup v2 mount once found: it does not move while an agent runs


def find_cgroup_root() -> Path | None:
    """Where cgroup v2 is mounted (read from /proc/self/mounts until found, then remembered: every run asks)."""
    if _found_root:
        return _found_root[0]
    try:
        root = isolation.cgroup2_mount(Path("/proc/self/mounts").read_text())
    except OSError:
        return None
    if root is not None:
        _found_root.append(root)
    return root


@dataclass
class Cgroup:
    path: Path
    procs_fd: int = -1  # opened by the agent: the child joins before it drops its privileges

    @classmethod
    def create(cls, path: Path) -> Cgroup:
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, os.open(path / "cgroup.procs", os.O_WRONLY))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """Every process in the cgroup, at once (``cgroup.kill``, Linux 5.14+), else one by one until none."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    async def kill_and_remove(self, timeout: float = KILL_WAIT_SECONDS) -> bool:
        if self.procs_fd >= 0:
            os.close(self.procs_fd)
            self.procs_fd = -1
        deadline = time.monotonic() + timeout
        while True:
            self.kill()
            if not self.pids():
                break
            if time.monotonic() > deadline:
                log.error("cgroup %s still holds processes %s after %.0fs", self.path, self.pids(), timeout)
                return False
            await asyncio.sleep(0.02)
        for _ in range(50):  # rmdir is refused (EBUSY) until the last exiting task has left
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    log.warning("cannot remove cgroup %s: %s", self.path, exc)
                    return False
                await asyncio.sleep(0.02)
        return False


def agent_cgroup(executor_id: str) -> Path | None:
    """This agent's cgroup parent (made now), or None where no cgroup v2 is mounted or it is not writable."""
    root = find_cgroup_root()
    if root is None:
        return None
    path = root / "teto" / isolation.safe_name(executor_id)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path


def remove_agent_cgroup(executor_id: str) -> None:
    """At shutdown: this agent's cgroup parent goes (refused by the kernel while a run's cgroup is in it)."""
    root = find_cgroup_root()
    if root is not None:
        with contextlib.suppress(OSError):
            (root / "teto" / isolation.safe_name(executor_id)).rmdir()
