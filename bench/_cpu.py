"""CPU seconds spent by a local stack's processes between two snapshots, per part (issue 12, item 1).

A throughput on a shared machine moves with the load; the CPU a job costs each process does not, or much less.
`snapshot(data_dir)` reads /proc: the parts ``teto up`` started (processes.json: gateway, queue, ...,
executor-N), each with the children it has reaped and an executor with its live run guard (the guard and the
jobs' own processes, which the guard reaps),
the NATS server(s) whose command lines name the stack's data directory, and PostgreSQL (the postmaster of the
data directory's postmaster.pid, and each backend, labelled by its login: ``pg:teto_queue``). Backends that exit
between the snapshots are not counted (the services keep pooled connections, so few do)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
RUN_GUARD = "agents/executor/guard.py"  # in the command line of an executor's run guard


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, own CPU s, reaped children's CPU s) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, (utime + stime) / TICK, (cutime + cstime) / TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def snapshot(data_dir: Path) -> dict[int, tuple[str, float]]:
    """pid -> (label, CPU seconds so far, own plus reaped children's)."""
    parts = {p["pid"]: p["name"] for p in json.loads((data_dir / "processes.json").read_text()) if p.get("pid")}
    stats = {pid: s for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()) if (s := _stat(pid))}
    labels: dict[int, str] = {}
    for pid in stats:
        cmd = _cmdline(pid)
        if pid in parts:
            labels[pid] = parts[pid]
        elif str(data_dir) in cmd and "nats-server" in cmd:
            labels[pid] = "nats"
    for pid, (ppid, _own, _kids) in stats.items():
        if ppid in parts and pid not in labels and RUN_GUARD in _cmdline(pid):
            labels[pid] = parts[ppid]  # an executor's run guard lives as long as it: its CPU is read live
    for pidfile in [*data_dir.glob("pgdata/postmaster.pid"), *data_dir.glob("*/pgdata/postmaster.pid")]:
        try:  # the data directory may be a link elsewhere (as root: under /var/lib/teto), its pid file is not
            labels[int(pidfile.read_text().split()[0])] = "pg:postmaster"
        except (OSError, ValueError, IndexError):
            pass
    postmasters = {pid for pid, label in labels.items() if label == "pg:postmaster"}
    for pid, (ppid, _own, _kids) in stats.items():
        if ppid in postmasters and pid not in labels:
            cmd = _cmdline(pid)  # "postgres: teto_queue teto 127.0.0.1(5432) idle"
            words = cmd.split()
            labels[pid] = f"pg:{words[1]}" if len(words) > 2 and words[0] == "postgres:" else "pg:background"
    return {pid: (label, stats[pid][1] + stats[pid][2]) for pid, label in labels.items()}


def children_cpu(parent: int, naming: str) -> float:
    """CPU seconds so far of ``parent``'s live children whose command line contains ``naming``, each with the
    children it reaped (an agent's run guard and the jobs it ran; the agent reaps the guard only at its end)."""
    total = 0.0
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        found = _stat(pid)
        if found is not None and found[0] == parent and naming in _cmdline(pid):
            total += found[1] + found[2]
    return total


def spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per label between the snapshots (a process new in ``after`` counts from zero)."""
    out: dict[str, float] = defaultdict(float)
    for pid, (label, cpu) in after.items():
        start = before.get(pid, (label, 0.0))[1]
        out[label] += max(0.0, cpu - start)
    return dict(out)


def per_job_ms(cpu: dict[str, float], jobs: int) -> dict[str, float]:
    """Milliseconds of CPU per job, grouped: every executor-N as ``executors``, PostgreSQL backends per login."""
    grouped: dict[str, float] = defaultdict(float)
    for label, seconds in cpu.items():
        grouped["executors" if label.startswith("executor") else label] += seconds
    return {k: round(1000 * v / jobs, 1) for k, v in sorted(grouped.items(), key=lambda kv: -kv[1])}


def parent(pid: int) -> int | None:
    """The parent of a live process (e.g. of a PostgreSQL backend: its postmaster)."""
    found = _stat(pid)
    return found[0] if found is not None else None


def tree_cpu(root: int | None = None) -> dict[str, float]:
    """CPU seconds so far of ``root`` (default this process: ``self``) and of each live process descended from it,
    summed by command name (``postgres``, ``nats-server``), each with the children it reaped: a backend that
    exits between two snapshots is then counted in its postmaster's reaped time."""
    root = os.getpid() if root is None else root
    stats = {pid: s for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()) if (s := _stat(pid))}
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _own, _kids) in stats.items():
        children[ppid].append(pid)
    out: dict[str, float] = defaultdict(float)
    todo = list(children[root])
    while todo:
        pid = todo.pop()
        todo.extend(children[pid])
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        out[name] += stats[pid][1] + stats[pid][2]
    if root in stats:
        out["self"] = stats[root][1] + stats[root][2]
    return dict(out)


def tree_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per name between two ``tree_cpu`` snapshots (processes that exited in between are lost)."""
    return {name: max(0.0, cpu - before.get(name, 0.0)) for name, cpu in after.items()}
