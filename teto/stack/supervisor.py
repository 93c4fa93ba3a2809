"""A small process supervisor for ``teto up``: starts each part as its own process with its log file,
restarts a part that dies unexpectedly (with back-off), and stops them in order.

A part is never given up on: one that keeps dying (more than ``max_restarts_per_minute`` exits in a minute) is
started again every ``CRASH_LOOP_SECONDS``, each time with an error naming its log, because what kills it at start
(a database restarting, a port another process holds, a NATS cluster still electing) often passes by itself, and
a stack that had stopped trying would stay down until someone restarted all of it.

It records every process in ``<data-dir>/processes.json`` (name, pid, executor id) so scripts and tests can
find, say, the executor that runs a job.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CRASH_LOOP_SECONDS = 60.0


def restart_delay(exits_last_minute: int, max_per_minute: int) -> float:
    """Seconds before a part that exited is started again: 0.5, 1, 2, 4, 8, 10... while it dies at most
    ``max_per_minute`` times a minute, ``CRASH_LOOP_SECONDS`` once it dies more often."""
    if exits_last_minute > max_per_minute:
        return CRASH_LOOP_SECONDS
    return min(10.0, 0.5 * 2 ** (max(exits_last_minute, 1) - 1))


@dataclass
class Part:
    name: str
    argv: list[str]
    env: dict[str, str]
    executor_id: str | None = None
    # An executor restarted after a crash is a new incarnation with a new id: its predecessor's lease must
    # expire on its own rather than be silently inherited by a process that knows nothing of the job.
    new_executor_id: Callable[[], str] | None = None
    # Variables for this start only, made just before it (an executor's bus credentials for its new id).
    prepare: Callable[[Part], dict[str, str]] | None = None
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)
    next_start: float = 0.0


class Supervisor:
    def __init__(self, data_dir: Path, *, max_restarts_per_minute: int = 5) -> None:
        self.data_dir = data_dir
        self.logs = data_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.parts: dict[str, Part] = {}
        self.max_restarts = max_restarts_per_minute
        self.stopping = False
        # Servers that run outside the supervisor's processes (PostgreSQL under pg_ctl): each ``check()`` starts
        # one again when it is gone (teto/stack/servers.py), before the parts that need it are restarted.
        self.watches: list = []

    def add(self, part: Part) -> None:
        self.parts[part.name] = part
        self._start(part)

    def _start(self, part: Part) -> None:
        if part.new_executor_id is not None:
            part.executor_id = part.new_executor_id()
        argv = [a.replace("{executor_id}", part.executor_id or "") for a in part.argv]
        out = open(self.logs / f"{part.name}.log", "ab")
        env = {**part.env, **part.prepare(part)} if part.prepare is not None else part.env
        part.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        out.close()
        log.info("started %s (pid %d)", part.name, part.proc.pid)
        self._record()

    def _record(self) -> None:
        rows = [{"name": p.name, "pid": p.proc.pid if p.proc else None, "executor_id": p.executor_id,
                 "log": str(self.logs / f"{p.name}.log")} for p in self.parts.values()]
        tmp = self.data_dir / "processes.json.tmp"
        tmp.write_text(json.dumps(rows, indent=2))
        os.replace(tmp, self.data_dir / "processes.json")

    def check(self, now: float | None = None) -> list[str]:
        """Start again the parts that exited, each after its back-off; returns the names started again."""
        restarted = []
        now = time.monotonic() if now is None else now
        for watch in [] if self.stopping else self.watches:
            watch.check()
        for part in self.parts.values():
            if self.stopping or part.proc is None or part.proc.poll() is None:
                continue
            if part.next_start == 0.0:
                part.restarts = [t for t in part.restarts if now - t < 60] + [now]
                delay = restart_delay(len(part.restarts), self.max_restarts)
                part.next_start = now + delay
                if delay >= CRASH_LOOP_SECONDS:
                    log.error("%s exited %d times in a minute; starting it again every %.0f s (its log ends: %s; "
                              "see %s)", part.name, len(part.restarts), delay,
                              last_line(self.logs / f"{part.name}.log"), self.logs / f"{part.name}.log")
                else:
                    log.warning("%s exited with %s; restarting in %g s (its log ends: %s)", part.name,
                                part.proc.returncode, delay, last_line(self.logs / f"{part.name}.log"))
            if now >= part.next_start:
                part.next_start = 0.0
                self._start(part)
                restarted.append(part.name)
        return restarted

    def stop(self, names: list[str], timeout: float = 20.0) -> None:
        self.stopping = True
        procs = [self.parts[n].proc for n in names if n in self.parts and self.parts[n].proc]
        for p in procs:
            if p.poll() is None:
                with _suppress():
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ProcessLookupError, PermissionError))


def last_line(path: Path, limit: int = 4096) -> str:
    """The last non-empty line of a part's log (why it exited, most often), or ``-``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "-"
    return lines[-1][:300] if lines else "-"
