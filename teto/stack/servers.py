"""``teto up`` keeps its embedded servers alive, as it keeps its services alive.

A killed nats-server or PostgreSQL was left dead: every part then retried against nothing, the executors lost
their leases and stopped their runs, and the stack stayed down until someone restarted all of it (one crash of
either server was a 42-minute outage). Now:

- the single embedded nats-server is a part of the supervisor (``nats``, in processes.json and logs/ like every
  part, as the members of a clustered rehearsal already were): one that dies is started again on its ports and
  JetStream store with the supervisor's back-off, and every client reconnects to it;
- the embedded PostgreSQL runs under ``pg_ctl`` (it daemonizes), so ``PostgresWatch`` looks at it from the
  supervisor's loop and starts it again, on its data and port, when its postmaster is gone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from teto.stack.supervisor import Part, Supervisor, restart_delay

log = logging.getLogger(__name__)


@dataclass
class SupervisedNats:
    """The embedded nats-server as the supervisor's part ``nats``."""

    server: object  # EmbeddedNats: its ports, store and command line
    sup: Supervisor
    name: str = "nats"

    @classmethod
    def start(cls, server, sup: Supervisor, timeout: float = 20.0) -> SupervisedNats:
        server.data_dir.mkdir(parents=True, exist_ok=True)
        sup.add(Part(cls.name, server.argv(), dict(os.environ)))
        server.wait_healthy(timeout)
        return cls(server, sup)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def monitor_url(self) -> str:
        return self.server.monitor_url

    def pid(self) -> int | None:
        part = self.sup.parts.get(self.name)
        return part.proc.pid if part is not None and part.proc is not None and part.proc.poll() is None else None

    def stop(self) -> None:
        self.sup.stop([self.name])


def process_alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed child not yet reaped is dead for us)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def postmaster_pid(pgdata: Path) -> int | None:
    """The postmaster's pid from its lock file (None: no server, or the file is unreadable)."""
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
        return int(first)
    except (OSError, ValueError):
        return None


@dataclass
class PostgresWatch:
    """Start the embedded PostgreSQL again when its postmaster is gone, with the supervisor's back-off."""

    pg: object  # EmbeddedPostgres, started
    max_restarts_per_minute: int = 5
    restarts: list[float] = field(default_factory=list)
    next_start: float = 0.0
    clock: Callable[[], float] = time.monotonic
    pgdata: Path | None = None  # found once: finding it may ask the system whether the service user can enter

    def alive(self) -> bool:
        if self.pgdata is None:
            self.pgdata = self.pg._pgdata()
        pid = postmaster_pid(self.pgdata)
        return pid is not None and process_alive(pid)

    def check(self) -> bool:
        """True when it was started again now."""
        if self.alive():
            self.next_start = 0.0
            return False
        now = self.clock()
        if self.next_start == 0.0:
            self.restarts = [t for t in self.restarts if now - t < 60] + [now]
            delay = restart_delay(len(self.restarts), self.max_restarts_per_minute)
            self.next_start = now + delay
            log.error("PostgreSQL (%s) is not running; starting it again in %g s", self.pg.url.rsplit("@", 1)[-1],
                      delay)
        if now < self.next_start:
            return False
        self.next_start = 0.0
        try:
            self.pg.start(timeout=60.0)
        except Exception as exc:  # noqa: BLE001 - tried again after the next back-off
            log.error("PostgreSQL did not start again: %s", exc)
            return False
        log.warning("PostgreSQL is running again")
        return True
