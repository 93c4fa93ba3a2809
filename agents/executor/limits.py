"""How a run's limits (``JobSpec.limits``: memory, processes, disk) are enforced on this host: the rule, pure.

Each limit goes to the strongest means the host offers, and the plan says which in words, so the run's
``started`` event and log say plainly what holds and what does not:
- memory: the run's cgroup ``memory.max`` (the whole run; the kernel's OOM killer ends it there) with
  ``memory.swap.max`` 0, where cgroup v2's memory controller is delegated to the agent; else ``RLIMIT_DATA`` on
  each process (an allocation past it fails: Python raises MemoryError), which bounds each process, not their sum;
- processes: the cgroup's ``pids.max`` (a fork past it fails with EAGAIN); else ``RLIMIT_NPROC``, which counts
  the processes and threads of the run's uid and so holds for the run only under a per-run uid; else nothing;
- disk: ``RLIMIT_FSIZE`` (a write past it fails with EFBIG, or SIGXFSZ ends a process that does not ignore it),
  which bounds each file the run writes; their sum is the agent's watch (diskwatch.py).
"""

from __future__ import annotations

import resource
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

MIB = 1 << 20


@dataclass(frozen=True)
class LimitPlan:
    cgroup_files: dict[str, str] = field(default_factory=dict)  # file of the run's cgroup -> value to write
    rlimits: list[tuple[int, int]] = field(default_factory=list)  # (resource, value) for every process of the run
    enforced: dict[str, str] = field(default_factory=dict)  # limit -> how it holds, in words
    not_enforced: list[str] = field(default_factory=list)  # what does not hold here, in words

    def lines(self) -> list[str]:
        return [f"{name}: {how}" for name, how in self.enforced.items()] + self.not_enforced


def plan(limits: Mapping[str, int | None], controllers: Collection[str], *, per_run_uid: bool) -> LimitPlan:
    """``limits`` (``RunLimits`` as a dict), ``controllers``: those enabled for the run's cgroup (empty when it
    has none), ``per_run_uid``: whether the run has a uid of its own."""
    out = LimitPlan()
    memory, pids, disk = limits.get("memory_mb"), limits.get("pids"), limits.get("disk_mb")
    if memory is not None:
        if "memory" in controllers:
            out.cgroup_files.update({"memory.max": str(memory * MIB), "memory.swap.max": "0"})
            out.enforced["memory"] = f"{memory} MiB for the whole run (cgroup memory.max; OOM-killed past it)"
        else:
            out.rlimits.append((resource.RLIMIT_DATA, memory * MIB))
            out.enforced["memory"] = f"{memory} MiB per process (RLIMIT_DATA; an allocation past it fails)"
            out.not_enforced.append("memory: no cgroup v2 memory controller delegated to the agent here, so the "
                                    "limit holds per process, not for the run's processes together")
    if pids is not None:
        if "pids" in controllers:
            out.cgroup_files["pids.max"] = str(pids)
            out.enforced["pids"] = f"{pids} processes and threads (cgroup pids.max; a fork past it fails)"
        elif per_run_uid:
            out.rlimits.append((resource.RLIMIT_NPROC, pids))
            out.enforced["pids"] = f"{pids} processes and threads of the run's uid (RLIMIT_NPROC)"
        else:
            out.not_enforced.append(f"pids: limit of {pids} NOT ENFORCED: no cgroup v2 pids controller and no "
                                    "per-run uid here (TETO_WORKLOAD_UID_RANGE, as root)")
    if disk is not None:
        out.rlimits.append((resource.RLIMIT_FSIZE, disk * MIB))
        out.enforced["disk"] = (f"{disk} MiB per file written (RLIMIT_FSIZE; a write past it fails with EFBIG), "
                                "and for all its files (the agent adds them up every 2 s and ends the run past it)")
    return out


def host_lines(filters: bool, controllers: Collection[str]) -> list[str]:
    """What this host cannot do for any run, for the agent's start-up log (``filters``: a seccomp filter exists
    for this machine; ``controllers``: those a run's cgroup gets, empty without one)."""
    lines = []
    if not filters:
        lines.append("seccomp: NOT ENFORCED: no filter for this machine; runs may create namespaces "
                     "(no_new_privs only)")
    missing = [c for c in ("memory", "pids") if c not in controllers]
    if missing:
        lines.append(f"run limits: no cgroup v2 {'/'.join(missing)} controller delegated here: a job's "
                     f"{'/'.join(missing)} limit is a per-process rlimit instead (docs/security/jobs.md)")
    return lines


def exit_reason(rc: int, plan_: LimitPlan | None, oom_killed: bool) -> str | None:
    """The limit that ended a run, read from its exit status and its cgroup's OOM count (None: none known)."""
    if plan_ is None:
        return None
    if oom_killed and "memory" in plan_.enforced:
        return f"killed by its memory limit: {plan_.enforced['memory']}"
    if rc in (-25, 128 + 25) and "disk" in plan_.enforced:  # SIGXFSZ
        return f"stopped by its disk limit: {plan_.enforced['disk']}"
    return None
