"""A run's sandbox on this machine (I/O): its own uid, its private directories, and the cgroup that holds every
process it starts, until the run ends and all of them are killed.

Opened by the agent before the process starts, closed after the main process has exited or been stopped (exit,
stop, lease lost, agent shutdown): ``close`` kills whatever is left (``cgroup.kill``; without a cgroup the
process group, plus every process of the run's uid: uids.py), hands the directories back to the agent, so nothing the
run left can be changed after the agent has judged it, and releases the uid. The rules are in ``isolation.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import isolation
from . import limits
from .cgroup import Cgroup, agent_cgroup, find_cgroup_root, run_controllers
from .confine import shared as confinement
from .uids import UidLease, remove_owned, sweep_uid

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1

_libc: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        # Loaded in the parent: a forked child must not load libraries before exec.
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


# -- directories -------------------------------------------------------------------------------------------------

def chown_tree(root: Path, uid: int, gid: int) -> None:
    """lchown everything under ``root`` (never following a link a run planted to reach the agent's files)."""
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(dirpath, name), uid, gid)


def private_dir(path: Path, uid: int, gid: int, traversed: int = 2) -> None:
    """``path`` made (mode 0700) and handed, with all it holds, to ``uid``; its ``traversed`` nearest ancestors
    (``<work>/jobs`` and ``<work>``, or the checkpoint root) only enterable by others (0711)."""
    path.mkdir(parents=True, exist_ok=True)
    for parent in list(path.parents)[:traversed]:
        with contextlib.suppress(OSError):
            if parent.stat().st_uid == os.geteuid():
                os.chmod(parent, 0o711)  # runs reach their own directory; none can list the others
    if path.is_symlink() or not path.is_dir():
        raise isolation.IsolationError(f"{path} is not a directory")
    chown_tree(path, uid, gid)
    os.chmod(path, 0o700)


# -- the sandbox of one run --------------------------------------------------------------------------------------

@dataclass
class Sandbox:
    """What holds one run; ``preexec`` runs in the forked child, ``close`` after the main process is gone."""

    uid_lease: UidLease | None = None
    uid: int | None = None  # the run's uid when it is not the agent's
    gid: int | None = None
    cgroup: Cgroup | None = None
    dirs: list[Path] = field(default_factory=list)
    pgid: int | None = None
    plan: limits.LimitPlan = field(default_factory=limits.LimitPlan)  # how the job's limits hold here
    oom_killed: bool = False  # the run's cgroup saw the kernel kill for its memory limit (read at close)
    _closing: asyncio.Task | None = None

    def preexec(self, parent_pid: int) -> Callable[[], None]:
        procs_fd, uid, gid = self.cgroup.procs_fd if self.cgroup else -1, self.uid, self.gid
        confined, rlimits = confinement(), list(self.plan.rlimits)

        def run() -> None:
            if procs_fd >= 0:
                os.write(procs_fd, b"0")  # into the run's cgroup before anything can fork
            os.umask(0o077)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid if gid is None else gid)
                os.setuid(uid)
            # After the uid change, which clears the parent-death signal.
            if _libc is not None:
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:  # the agent died between fork and prctl
                os._exit(1)
            confined.apply(rlimits)  # limits, no_new_privs, the seccomp filter: last, they bind the exec

        return run

    async def close(self) -> None:
        """Kill every process the run left, hand its directories back to the agent, release its uid. Safe to call
        from both the stop and the wait of a run: the second caller waits for the first one's work."""
        if self._closing is None:
            self._closing = asyncio.create_task(self._close(), name="sandbox-close")
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        try:
            if self.pgid is not None and self.cgroup is None:
                # Without a cgroup: the group the run was started as (what did not leave it).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pgid, signal.SIGKILL)
            if self.cgroup is not None:
                self.oom_killed = self.cgroup.oom_kills() > 0
                await self.cgroup.kill_and_remove()
            if self.uid_lease is not None:
                await asyncio.to_thread(sweep_uid, self.uid_lease.uid)
                await asyncio.to_thread(remove_owned, self.uid_lease.uid)
            if self.uid is not None:
                for d in self.dirs:
                    with contextlib.suppress(FileNotFoundError):
                        await asyncio.to_thread(chown_tree, d, os.geteuid(), os.getegid())
        finally:
            if self.uid_lease is not None:
                self.uid_lease.release()


def open_sandbox(*, uid_range: str, workload_user: str, lock_dir: Path, use_cgroup: bool, cgroup_root: Path | None,
                 cgroup_name: Callable[[Path], Path], dirs: Iterable[Path], start: int,
                 job_limits: dict[str, int | None] | None = None,
                 controllers: Callable[[], set[str]] = set) -> Sandbox:
    """Take a uid (root only), make the run's directories its own, create its cgroup with the run's limits
    (``controllers``: those its cgroup gets; limits.py decides what holds how). On failure nothing is left
    held. Raises IsolationError (or OSError) with the reason."""
    box = Sandbox(dirs=list(dirs))
    try:
        if os.geteuid() == 0:
            uids = isolation.parse_uid_range(uid_range)
            if uids is not None:
                box.uid_lease = UidLease.take(uids, lock_dir, start)
                box.uid = box.gid = box.uid_lease.uid
            elif workload_user:
                box.uid, box.gid = resolve_user(workload_user)
        for i, d in enumerate(box.dirs):
            if box.uid is not None:
                # A run's tmp/ is inside its work dir, which it owns already: nothing above it to close.
                private_dir(d, box.uid, box.gid if box.gid is not None else box.uid,
                            traversed=0 if i and d.parent == box.dirs[0] else 2 if i == 0 else 1)
            else:
                d.mkdir(parents=True, exist_ok=True)
        if use_cgroup and cgroup_root is not None:
            try:
                box.cgroup = Cgroup.create(cgroup_name(cgroup_root))
            except OSError as exc:
                log.debug("no cgroup for the run (%s): process group and uid sweep only", exc)
        box.plan = limits.plan(job_limits or {}, controllers() if box.cgroup is not None else set(),
                                   per_run_uid=box.uid_lease is not None)
        if box.cgroup is not None and box.plan.cgroup_files:
            for failed in box.cgroup.limit(box.plan.cgroup_files):
                box.plan.not_enforced.append(f"cgroup {failed}")
        return box
    except BaseException:
        _close_now(box)
        raise


def resolve_user(name: str) -> tuple[int, int]:
    """(uid, gid) of a user name, or of a numeric uid (its own number as gid; no passwd entry is needed)."""
    if name.isdigit():
        return int(name), int(name)
    import pwd

    try:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        raise isolation.IsolationError(f"workload user {name!r} does not exist on this machine") from None


# -- what the agent calls ------------------------------------------------------------------------------------------

_reach_checked: dict[tuple[str, ...], list[str]] = {}


def reach_problems_for(python: str) -> list[str]:
    """What a run's uid could not use of the installation (checked once per interpreter: it does not move)."""
    from .launch import PROJECT_ROOT, packages

    key = (python,)
    if key not in _reach_checked:
        _reach_checked[key] = isolation.reach_problems(Path(os.path.realpath(python)), PROJECT_ROOT, packages())
    return _reach_checked[key]


def open_for(settings: Any, grant: Any, *, start: int) -> Sandbox:
    """The sandbox of one grant, as the agent's settings ask (blocking: call it in a thread)."""
    from . import launch

    box = open_sandbox(
        uid_range=settings.workload_uid_range, workload_user=settings.workload_user,
        lock_dir=settings.workload_uid_lock_dir, use_cgroup=settings.workload_cgroup,
        cgroup_root=find_cgroup_root() if settings.workload_cgroup else None,
        cgroup_name=lambda root: isolation.run_cgroup(root, settings.executor_id, grant.job_id, grant.epoch,
                                                      grant.rank),
        dirs=launch.run_dirs(settings, grant), start=start, job_limits=grant.spec.limits.model_dump(),
        controllers=lambda: run_controllers(settings.executor_id))
    if box.uid is not None and (problems := reach_problems_for(launch.interpreter(settings))):
        _close_now(box)
        raise isolation.IsolationError(isolation.reach_advice(problems, box.uid))
    return box


def hand_over(checkpoint: Path, work: Path, box: Sandbox) -> Path:
    """A copy of a checkpoint (and its sidecar; a directory whole), owned by the run's uid, in a fresh directory of its work dir: for
    a gang rank that resumes from a checkpoint directory owned by rank 0's uid. Fresh (mkdtemp), so nothing a
    previous run planted there (a link) is written through."""
    dest = Path(tempfile.mkdtemp(prefix="resume-", dir=work))
    from .checkpoints import sidecar_path
    from .ckpt_dir import holds_checkpoint

    if holds_checkpoint(checkpoint):  # a directory checkpoint (verified: regular files only), manifest included
        shutil.copytree(checkpoint, dest / checkpoint.name, symlinks=True)
    else:
        for src in (checkpoint, sidecar_path(checkpoint)):
            shutil.copyfile(src, dest / src.name, follow_symlinks=False)
    if box.uid is not None:
        chown_tree(dest, box.uid, box.gid if box.gid is not None else box.uid)
    return dest / checkpoint.name


def _close_now(box: Sandbox) -> None:
    """Release what an unstarted sandbox holds (no process ran in it)."""
    if box.cgroup is not None:
        if box.cgroup.procs_fd >= 0:
            os.close(box.cgroup.procs_fd)
        with contextlib.suppress(OSError):
            box.cgroup.path.rmdir()
    if box.uid_lease is not None:
        box.uid_lease.release()


_base_ready: set[Path] = set()  # built (or found valid) by this agent: the check imports torch, once


async def prepare_base(base_dir: Path) -> None:
    """Build the fine-tune's base checkpoint as the agent (with its own interpreter), readable but not writable
    by runs: a run that could write it would poison every later tenant's base model."""
    if base_dir not in _base_ready:
        code = ("import sys; from pathlib import Path; from agents.executor.workloads.model import ensure_base; "
                "ensure_base(Path(sys.argv[1]))")
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(base_dir),
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise isolation.IsolationError(f"cannot build the base model in {base_dir}: "
                                           f"{err.decode(errors='replace')[-2000:]}")
        _base_ready.add(base_dir)
    os.chmod(base_dir, 0o755)
    for entry in base_dir.iterdir():
        if entry.is_file() and not entry.is_symlink():
            os.chmod(entry, 0o644)


def describe_limits(settings: Any) -> list[str]:
    """What this agent cannot enforce on this machine, for its start-up log (and ``teto up``'s output)."""
    found = settings.workload_cgroup and agent_cgroup(settings.executor_id) is not None
    lines = isolation.limits(is_root=os.geteuid() == 0, uid_range=settings.workload_uid_range,
                             workload_user=settings.workload_user, cgroup=settings.workload_cgroup,
                             cgroup_found=found)
    lines += limits.host_lines(confinement().filters, run_controllers(settings.executor_id) if found else set())
    if os.geteuid() == 0 and (settings.workload_uid_range or settings.workload_user):
        from .launch import interpreter

        if problems := reach_problems_for(interpreter(settings)):
            lines.append("runs will fail to start: " + isolation.reach_advice(problems, "of the runs"))
    return lines
