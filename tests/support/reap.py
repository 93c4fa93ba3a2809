"""The servers of a test session that never reached its teardown, stopped by the next session.

A ``pytest`` killed by a signal leaves its embedded NATS and PostgreSQL running (they run in sessions of their own,
so that a signal to the test process group does not stop them mid-test), holding memory, ports and disk under
``/tmp/teto-test-*`` and, when the tests run as root, a cluster under ``/var/lib/teto``. Each session's ``infra``
writes its owner (pid and the process's start time, so a reused pid does not pass for it) into its root
(``claim``), and ``MARK`` into its environment, which every process it starts from then on inherits (servers,
executors, training processes, whole ``teto up`` stacks: ``_clean_env`` keeps it, not being ``TETO_*``). The next
session finds every root whose owner is gone (``abandoned``), kills what still runs from it and deletes it
(``reap``). Only processes marked with that root, or whose command line names it or a cluster whose ``.origin``
file points into it, are touched.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from teto.stack.embedded import SHARED_ROOT

OWNER = "owner"
MARK = "PYTEST_TETO_SESSION"


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def claim(root: Path, pid: int | None = None) -> None:
    """Mark ``root`` as this process's (or ``pid``'s); this process's children from now on carry ``MARK``."""
    pid = os.getpid() if pid is None else pid
    # Whole or absent, never half written: another session reading an empty file would take the root for abandoned.
    tmp = root / f".{OWNER}.{os.getpid()}"
    tmp.write_text(f"{pid} {_started(pid)}")
    os.replace(tmp, root / OWNER)
    if pid == os.getpid():
        os.environ[MARK] = str(root)


def owner_alive(root: Path) -> bool:
    """Whether the process that claimed ``root`` still runs (a root never claimed counts as alive: not ours)."""
    try:
        pid, started = (root / OWNER).read_text().split()
        return _started(int(pid)) == started
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False


def abandoned(tmp: Path, prefix: str = "teto-test-") -> list[Path]:
    return [root for root in sorted(tmp.glob(f"{prefix}*")) if root.is_dir() and not owner_alive(root)]


def _clusters(root: Path, shared: Path) -> list[Path]:
    """PostgreSQL clusters kept under ``shared`` for data directories inside ``root`` (embedded.py, as root)."""
    found = []
    for origin in shared.glob("*.origin"):
        try:
            points = Path(origin.read_text().strip())
        except OSError:
            continue
        if points == root or root in points.parents:
            found.append(origin.with_suffix(""))
    return found


def _naming(root: Path, paths: list[Path]) -> list[int]:
    """Pids of the processes marked with ``root`` or whose command line names one of ``paths`` (never this one)."""
    needles, mark = [str(p).encode() for p in paths], f"{MARK}={root}\0".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if any(n in cmdline for n in needles) or mark in environ:
            pids.append(int(proc.name))
    return pids


def reap(root: Path, shared: Path = SHARED_ROOT) -> list[int]:
    """Kill what still runs from ``root`` (and its clusters under ``shared``), delete them; the pids killed."""
    clusters = _clusters(root, shared)
    killed = []
    for pid in _naming(root, [root, *clusters]):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    for cluster in clusters:
        shutil.rmtree(cluster, ignore_errors=True)
        cluster.with_name(cluster.name + ".origin").unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    return sorted(killed)
