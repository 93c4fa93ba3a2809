"""The per-run uids of this machine (I/O): which uids own a process now, the lease that keeps a uid to one run,
and the sweep of what a uid left behind (its processes, its files in the world-writable directories) once its
run has ended. Which uids a run may take is decided in ``isolation.py``; the sandbox (sandbox.py) uses these.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import isolation

log = logging.getLogger(__name__)

SHARED_TMP = (Path("/tmp"), Path("/dev/shm"), Path("/var/tmp"))  # writable by every uid, a run's included


def live_processes(proc: Path = Path("/proc")) -> list[tuple[int, int]]:
    """(pid, real uid) of every process that runs (a zombie runs nothing: it only waits to be reaped, which in a
    container whose init does not reap may be never).

    Called twice per run that takes a uid (the uid taken, the uid swept), so it is kept cheap: one read of each
    ``status`` through a bare descriptor (no file object) and only its State and Uid lines found (a full parse of
    every line was most of an executor's CPU per trivial job: 77 ms against 18 ms for 180 processes; the file
    objects and the split of every line were another 6 of 11 ms for 190 processes)."""
    found = []
    root = os.fspath(proc)
    for name in os.listdir(root):
        if name.isdigit():
            try:
                fd = os.open(f"{root}/{name}/status", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                seen = state_and_uid(os.read(fd, 8192))
            except OSError:
                continue
            finally:
                os.close(fd)
            if seen is not None and seen[0] not in (b"Z", b"X"):
                found.append((int(name), seen[1]))
    return found


def state_and_uid(status: bytes) -> tuple[bytes, int] | None:
    """(state letter, real uid) from a /proc/<pid>/status text, or None when it has not both, State first. The
    lines are found, not split (a process's name in the first line is escaped: it holds no newline)."""
    text = b"\n" + status
    at = text.find(b"\nState:")
    uid_at = text.find(b"\nUid:", at) if at >= 0 else -1
    if uid_at < 0:
        return None
    state = (text[at + 7:text.find(b"\n", at + 7)].split() or [b"?"])[0]
    end = text.find(b"\n", uid_at + 5)
    uid = text[uid_at + 5:end if end >= 0 else len(text)].split()
    if not uid or not uid[0].isdigit():
        return None
    return state, int(uid[0])


def uids_with_processes(proc: Path = Path("/proc")) -> set[int]:
    """Real uids that own a process now (a uid still running something is not free, whoever left it)."""
    return {uid for _, uid in live_processes(proc)}


@dataclass
class UidLease:
    """A uid held for one run: an exclusive flock on ``<lock_dir>/<uid>.lock``, so two agents on one machine
    (and two runs of one agent) never hand out the same uid; released when the run's processes are all gone."""

    uid: int
    fd: int

    @classmethod
    def take(cls, uids: isolation.UidRange, lock_dir: Path, start: int) -> UidLease:
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        busy = uids_with_processes()
        for uid in isolation.uid_candidates(uids, start):
            if uid in busy:
                continue
            fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(uid, fd)
        raise isolation.IsolationError(f"every workload uid in {uids.first}-{uids.last} is in use on this machine")

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def sweep_uid(uid: int, proc: Path = Path("/proc"), rounds: int = 50) -> int:
    """SIGKILL every process of ``uid`` until none is left (a process may fork while being swept). Only safe for a
    uid no one else uses: a per-run uid."""
    killed = 0
    for _ in range(rounds):
        pids = [pid for pid, owner in live_processes(proc) if owner == uid]
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.02)
    log.error("processes of uid %d still alive after %d sweeps", uid, rounds)
    return killed


def remove_owned(uid: int, roots: Iterable[Path] = SHARED_TMP) -> list[Path]:
    """Remove what ``uid`` left in the world-writable directories (``/tmp``, ``/dev/shm``, ``/var/tmp``): the next
    run that draws the same uid, another tenant's perhaps, must not find it. Only entries the uid owns at the
    top level; ``rmtree`` never follows links."""
    removed = []
    for root in roots:
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError as exc:
                log.warning("cannot remove %s left by uid %d: %s", entry.path, uid, exc)
    return removed
