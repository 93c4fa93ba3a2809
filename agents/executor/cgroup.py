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
LIMIT_CONTROLLERS = ("memory", "pids")  # what a run's limits use (limits.py), when the host delegates them


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

    def limit(self, files: dict[str, str]) -> list[str]:
        """Write the run's limits (``memory.max``...) before anything joins; the files it could not write."""
        failed = []
        for name, value in files.items():
            try:
                (self.path / name).write_text(value)
            except OSError as exc:
                failed.append(f"{name}: {exc.strerror}")
        return failed

    def oom_kills(self) -> int:
        """Processes the kernel killed for the cgroup's memory limit (``memory.events``), 0 when unknown."""
        try:
            for line in (self.path / "memory.events").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

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
    for level in (root, root / "teto", path):  # each level hands the controllers down to the next
        for controller in LIMIT_CONTROLLERS:
            with contextlib.suppress(OSError):
                (level / "cgroup.subtree_control").write_text(f"+{controller}")
    return path


_controllers: dict[str, set[str]] = {}  # per agent: what its runs' cgroups get does not change while it runs


def run_controllers(executor_id: str) -> set[str]:
    """The controllers a run's cgroup under this agent's has (its parent's ``cgroup.subtree_control``)."""
    if executor_id not in _controllers:
        parent = agent_cgroup(executor_id)
        try:
            found = set((parent / "cgroup.subtree_control").read_text().split()) if parent is not None else set()
        except OSError:
            found = set()
        _controllers[executor_id] = found
    return _controllers[executor_id]


def remove_agent_cgroup(executor_id: str) -> None:
    """At shutdown: this agent's cgroup parent goes (refused by the kernel while a run's cgroup is in it)."""
    root = find_cgroup_root()
    if root is not None:
        with contextlib.suppress(OSError):
            (root / "teto" / isolation.safe_name(executor_id)).rmdir()
