"""``teto up``'s part in job isolation: the data directory's modes, and the executors' isolation settings.

A run must reach its own job and checkpoint directories (under the data directory) and read the base model, and
nothing else there: not ``stack.json`` (the admin token), the tokens file, the embedded servers' state, the logs.
So the data directory is 0711 (enter, not list), what runs need is 0711/0755, everything else 0700/0600. As root,
executors run each workload as its own uid from ``DEFAULT_UID_RANGE``; what cannot be enforced is printed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

from agents.executor import isolation
from agents.executor.launch import PROJECT_ROOT, packages

DEFAULT_UID_RANGE = "200000-200999"
# Entries of the data directory runs pass through (their own subdirectories are 0700, made by the agent).
TRAVERSED = {"executors": 0o711, "checkpoints": 0o711, "base": 0o755}
UNTOUCHED = {"postgres"}  # the embedded PostgreSQL's own user keeps its own modes


def harden_data_dir(data_dir: Path) -> None:
    """Runs can enter the data directory but not list it, and read nothing in it but what is theirs."""
    if data_dir.stat().st_uid != os.geteuid():
        return
    os.chmod(data_dir, 0o711)
    for name, mode in TRAVERSED.items():  # made now, so no part makes them later with its own umask's mode
        (data_dir / name).mkdir(mode=mode, exist_ok=True)
    for entry in data_dir.iterdir():
        if entry.name in UNTOUCHED or entry.is_symlink():  # a link: see place_run_dirs
            continue
        if entry.name in TRAVERSED:
            if entry.is_dir():
                os.chmod(entry, TRAVERSED[entry.name])
        elif entry.is_dir():
            os.chmod(entry, 0o700)
        else:
            os.chmod(entry, stat.S_IMODE(entry.stat().st_mode) & 0o700)


SHARED_ROOT = Path("/var/lib/teto")  # where the embedded PostgreSQL's cluster goes for the same reason


def place_run_dirs(data_dir: Path, shared_root: Path = SHARED_ROOT) -> list[str]:
    """Where runs must enter (``TRAVERSED``) lives under the data directory; if other users cannot enter the data
    directory's parents (a data directory under /root, or under pytest's 0700 temporary root), runs under their
    own uid could not reach their job and checkpoint directories. Then those directories are placed under
    ``shared_root/runs-<digest>/`` and linked from the data directory (as the embedded PostgreSQL's cluster is), so
    every path stays the same for the parts and the operator. Returns the lines to print."""
    data_dir = data_dir.resolve()
    why = isolation.unreachable(data_dir.parent, stat.S_IXOTH)
    if why is None:
        return []
    if shared_root == SHARED_ROOT:
        from teto.stack.embedded import _collect_orphans

        _collect_orphans()  # places whose data directory is gone
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    target = shared_root / f"runs-{digest}"
    shared_root.mkdir(parents=True, exist_ok=True)
    os.chmod(shared_root, 0o755)
    target.mkdir(mode=0o711, exist_ok=True)
    os.chmod(target, 0o711)
    (shared_root / f"runs-{digest}.origin").write_text(str(data_dir))
    for name, mode in TRAVERSED.items():
        link, place = data_dir / name, target / name
        if link.is_symlink():
            continue
        if link.exists():  # an older data directory: its runs' files move with it
            shutil.move(str(link), str(place))
        place.mkdir(mode=mode, exist_ok=True)
        os.chmod(place, mode)
        link.symlink_to(place)
    return [f"runs' directories are under {target} (linked from {data_dir}): {why}"]


def _problems(python: str) -> list[str]:
    return isolation.reach_problems(Path(os.path.realpath(python)), PROJECT_ROOT, packages())


def workload_python() -> tuple[str | None, list[str]]:
    """An interpreter a per-run uid can execute: this one, else the system's of the same version (a venv made
    from a Python under /root cannot be run by other users); (None, why not) when there is none."""
    problems = _problems(sys.executable)
    if not problems:
        return "", []
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.access(candidate, os.X_OK) and not _problems(candidate):
            return candidate, problems
    return None, problems


def executor_env(env: dict[str, str], is_root: bool | None = None) -> tuple[dict[str, str], list[str]]:
    """The executors' isolation variables under ``teto up`` (what the operator set wins), and the lines to print
    about what is enforced and what is not."""
    is_root = os.geteuid() == 0 if is_root is None else is_root
    own: dict[str, str] = {}
    lines: list[str] = []
    wants_uid = is_root and not env.get("TETO_WORKLOAD_USER")
    if wants_uid and "TETO_WORKLOAD_UID_RANGE" not in env:
        own["TETO_WORKLOAD_UID_RANGE"] = DEFAULT_UID_RANGE
    uid_range = env.get("TETO_WORKLOAD_UID_RANGE", own.get("TETO_WORKLOAD_UID_RANGE", ""))
    if is_root and (uid_range or env.get("TETO_WORKLOAD_USER")) and not env.get("TETO_WORKLOAD_PYTHON"):
        python, problems = workload_python()
        if python:
            own["TETO_WORKLOAD_PYTHON"] = python
            lines.append(f"workloads run with {python} (this installation's interpreter is not reachable by "
                         f"the workload users: {'; '.join(problems)})")
        elif python is None:
            own["TETO_WORKLOAD_UID_RANGE"] = ""
            uid_range = ""
            lines.append("NOT ENFORCED: " + isolation.reach_advice(problems, "of the runs")
                         + ". Until then workloads run as root")
    if uid_range:
        lines.append(f"each workload runs as its own uid from {uid_range}, in a private work and checkpoint "
                     "directory, with a scrubbed environment")
    for line in isolation.limits(is_root=is_root, uid_range=uid_range, workload_user=env.get("TETO_WORKLOAD_USER",
                                 ""), cgroup=False, cgroup_found=False):
        lines.append("NOT ENFORCED: " + line)
    return own, lines


def cgroup_line() -> str | None:
    """Whether runs can be held in a cgroup v2 here (the executors say it again in their logs)."""
    root = isolation.cgroup2_mount(Path("/proc/self/mounts").read_text()) if Path("/proc/self/mounts").exists() \
        else None
    if root is not None and os.access(root, os.W_OK):
        return None
    return ("NOT ENFORCED: no writable cgroup v2: a run is contained by its process group (and, as root, a sweep "
            "of its uid); without root a process that leaves its group (setsid) can outlive the run")


def confinement_lines() -> list[str]:
    """What the executors here cannot do for a run's filter and limits (each agent says it again in its log and
    in every run's ``started`` event): read from the machine and the cgroup v2 root's controllers."""
    import platform

    from agents.executor import limits
    from agents.executor.confine import seccomp_program

    root = isolation.cgroup2_mount(Path("/proc/self/mounts").read_text()) if Path("/proc/self/mounts").exists() \
        else None
    try:
        controllers = set((root / "cgroup.controllers").read_text().split()) if root is not None else set()
    except OSError:
        controllers = set()
    return ["NOT ENFORCED: " + line.replace("NOT ENFORCED: ", "")
            for line in limits.host_lines(seccomp_program(platform.machine()) is not None, controllers)]
