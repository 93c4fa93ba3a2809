"""Rules of job isolation (pure): what a run's environment may hold, which uid a run gets, where its cgroup is,
and whether the workload's uid can reach what it must execute.

A run is someone else's code. It must not read the agent's configuration (``TETO_*`` settings, database URL, bus
credentials, the tokens file path) through its environment, must not share a uid with another tenant's run (a
uid is what the kernel separates files and signals by), and must not outlive its lease through processes it
leaves behind (a cgroup per run holds them all). The I/O that applies these rules is in ``sandbox.py``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# The agent's variables a run inherits: locale, time zone and where programs are, nothing that configures or
# authenticates the agent. More names (or NAME_* prefixes) through TETO_WORKLOAD_ENV_ALLOW.
BASE_ALLOW = ("PATH", "LANG", "LANGUAGE", "LC_*", "TZ")
# Set by the agent alone from the devices granted; a job's own value would use devices it is not charged for.
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
MIN_WORKLOAD_UID = 1000  # below: system accounts, whose files a run must not own


class IsolationError(ValueError):
    """A configuration or a host under which the promised isolation cannot hold; the message says what to do."""


def allowed(name: str, allow: Iterable[str]) -> bool:
    """``NAME`` matches itself; ``PREFIX_*`` matches every name starting with ``PREFIX_``."""
    for pattern in allow:
        if pattern.endswith("*") and name.startswith(pattern[:-1]) or name == pattern:
            return True
    return False


def parse_allow(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


def scrub_env(agent_env: Mapping[str, str], extra_allow: Iterable[str] = ()) -> dict[str, str]:
    """The part of the agent's environment a run may see: the allow-list, and never a ``TETO_*`` setting
    (even when allowed by a pattern: those are the agent's configuration and credentials). ``allowed`` for every
    name, with the patterns split once into names and prefixes (it runs once per run over the whole environment)."""
    allow = (*BASE_ALLOW, *extra_allow)
    names = {p for p in allow if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in allow if p.endswith("*"))
    return {k: v for k, v in agent_env.items()
            if not k.startswith("TETO_") and (k in names or k.startswith(prefixes))}


def device_env(indices: list[int] | None) -> dict[str, str]:
    """The device variables of a run: the granted GPUs, or none visible on a CPU-only grant."""
    visible = ",".join(str(i) for i in indices or [])
    return dict.fromkeys(DEVICE_VARIABLES, visible)


@dataclass(frozen=True)
class UidRange:
    first: int
    last: int

    def __len__(self) -> int:
        return self.last - self.first + 1


def parse_uid_range(value: str) -> UidRange | None:
    """``"200000-200999"`` -> UidRange; empty -> None (no per-run uids). Refuses system uids and root."""
    if not value.strip():
        return None
    m = _RANGE.match(value)
    if not m:
        raise IsolationError(f"workload uid range {value!r} is not FIRST-LAST, e.g. 200000-200999")
    first, last = int(m.group(1)), int(m.group(2))
    if first > last:
        raise IsolationError(f"workload uid range {value!r} is empty (first > last)")
    if first < MIN_WORKLOAD_UID or last >= 2**32 - 1:
        raise IsolationError(f"workload uid range {value!r} must lie within {MIN_WORKLOAD_UID}..4294967294 "
                             "(system accounts and root own files a run must not)")
    return UidRange(first, last)


def uid_candidates(uids: UidRange, start: int) -> list[int]:
    """Every uid of the range once, from ``start``'s position on, wrapping around: agents that start at different
    places rarely contend for the same lock, and a uid just released is not the first one handed out again."""
    n = len(uids)
    offset = start % n
    return [uids.first + (offset + i) % n for i in range(n)]


def cgroup2_mount(mounts_text: str) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, from ``/proc/self/mounts`` (a hybrid host mounts it at
    /sys/fs/cgroup/unified, a pure v2 host at /sys/fs/cgroup)."""
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1].replace("\\040", " "))
    return None


def safe_name(value: str) -> str:
    return _UNSAFE.sub("-", value).strip("-.") or "x"


def run_cgroup(mount: Path, executor_id: str, job_id: str, epoch: int, rank: int = 0) -> Path:
    """``<mount>/teto/<executor>/<job>-e<epoch>-r<rank>``: one per run, under its agent's, so a sweep of an
    agent's runs never touches another agent's."""
    return mount / "teto" / safe_name(executor_id) / safe_name(f"{job_id}-e{epoch}-r{rank}")


def unreachable(path: Path, need: int, lstat: Callable[[Path], os.stat_result] = os.stat) -> str | None:
    """Why a user that is neither the owner nor in the group of ``path`` and its ancestors (a per-run uid is
    neither) cannot use ``path``, or None: every ancestor needs o+x, the path itself the ``need`` bits for others
    (``stat.S_IXOTH`` to execute or enter, ``stat.S_IROTH`` to read)."""
    path = Path(path)
    for parent in reversed(path.parents):
        try:
            mode = lstat(parent).st_mode
        except OSError as exc:
            return f"{parent}: {exc.strerror}"
        if not mode & stat.S_IXOTH:
            return f"{parent} (mode {stat.S_IMODE(mode):04o}) cannot be entered by other users"
    try:
        mode = lstat(path).st_mode
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if mode & need != need:
        return f"{path} (mode {stat.S_IMODE(mode):04o}) is not usable by other users"
    return None


def reach_problems(interpreter: Path, project_root: Path, packages: Iterable[Path],
                   lstat: Callable[[Path], os.stat_result] = os.stat) -> list[str]:
    """What a per-run uid could not use of what every run needs: the interpreter (resolved through its symlinks,
    as a venv's python is a link to the real one), the project the SDK is imported from, and the
    installed packages."""
    checks = [(interpreter, stat.S_IXOTH), (project_root, stat.S_IXOTH | stat.S_IROTH)]
    checks += [(p, stat.S_IXOTH | stat.S_IROTH) for p in packages]
    return [why for path, need in checks if (why := unreachable(path, need, lstat))]


def reach_advice(problems: list[str], uid: int | str) -> str:
    """The error a run that cannot start gets, with exactly what the operator can do about it."""
    return (f"the workload user (uid {uid}) cannot use the Python installation: " + "; ".join(problems)
            + ". Install Teto in a virtual environment under a directory every user can enter (e.g. "
            "/opt/teto, made with a Python that is not under /root), or set TETO_WORKLOAD_PYTHON to an "
            "interpreter of the same version other users can run (e.g. /usr/bin/python3.11), or grant "
            "o+x on the directories named above; or unset TETO_WORKLOAD_UID_RANGE to run workloads as the "
            "agent's user (no isolation between tenants)")


def limits(*, is_root: bool, uid_range: str, workload_user: str, cgroup: bool, cgroup_found: bool) -> list[str]:
    """What this agent cannot enforce, as it will say at start-up (empty: every control holds)."""
    out = []
    if not is_root and (uid_range or workload_user):
        out.append("the agent is not root: workloads run as the agent's own user (a per-run uid needs root), so "
                   "a run can read what the agent's user can (its data directory) and other runs' files")
    elif not is_root:
        out.append("the agent is not root: workloads run as the agent's own user (no per-run uid)")
    elif not uid_range and not workload_user:
        out.append("no TETO_WORKLOAD_UID_RANGE or TETO_WORKLOAD_USER: workloads run as root")
    elif not uid_range:
        out.append("one TETO_WORKLOAD_USER for every run: runs are separated from the agent, not from each other")
    if cgroup and not cgroup_found:
        out.append("no writable cgroup v2 here: a run is contained by its process group"
                   + (" and a sweep of its uid" if is_root and uid_range else
                      " only; a process that leaves it (setsid) survives the run"))
    return out
