"""CPU time of a process tree from /proc (Linux): what a benchmark's work cost in CPU seconds, part by part, which
other processes' load on a shared machine moves far less than wall-clock rates.

``parse_stat`` is pure (one ``/proc/<pid>/stat`` line); ``tree_cpu`` reads /proc once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat(line: str) -> tuple[int, str, int, float]:
    """(pid, command name, parent pid, CPU seconds used: user + system) of one /proc/<pid>/stat line. The name
    is in parentheses and may itself hold spaces and parentheses, so fields are counted from the last ')'."""
    head, _, rest = line.rpartition(")")
    pid_text, _, name = head.partition(" (")
    fields = rest.split()
    # After the name: state(0) ppid(1) ... utime(11) stime(12), in clock ticks.
    return int(pid_text), name, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _all() -> dict[int, tuple[str, int, float, str]]:
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            pid, name, ppid, cpu = parse_stat((d / "stat").read_text())
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        out[pid] = (name, ppid, cpu, cmd)
    return out


def descendants(parents: dict[int, int], roots: Iterable[int]) -> set[int]:
    """Every pid under ``roots`` (the roots included), given each pid's parent."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), [r for r in roots if r in parents]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return seen


def tree_cpu(roots: Iterable[int], markers: Iterable[str], names: dict[int, str]) -> dict[str, float]:
    """CPU seconds of every live process under ``roots`` or under a process whose command line holds one of
    ``markers`` (a server started apart, such as PostgreSQL under its own user: its data directory or port),
    summed by part: ``names`` for the pids it names, else the command name (``postgres``, ``nats-server``)."""
    procs = _all()
    markers = list(markers)
    tops = {*roots, *(pid for pid, (_, _, _, cmd) in procs.items() if any(m in cmd for m in markers))}
    under = descendants({pid: p[1] for pid, p in procs.items()}, tops)
    parents = {pid: p[1] for pid, p in procs.items()}
    totals: dict[str, float] = {}
    for pid in under:
        part, up = names.get(pid), pid
        while part is None and up in parents and up not in tops:  # a child of a named part counts as that part
            up = parents[up]
            part = names.get(up)
        part = part or procs[pid][0]
        totals[part] = totals.get(part, 0.0) + procs[pid][2]
    return totals
