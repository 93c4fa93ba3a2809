"""The throughput bench's CPU accounting (bench/_cpu.py): what each part of a stack spent per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench import _cpu


def test_spent_counts_the_difference_per_label_and_new_processes_from_zero():
    before = {1: ("queue", 2.0), 2: ("executor-1", 1.0), 3: ("pg:teto_queue", 5.0)}
    after = {1: ("queue", 3.5), 2: ("executor-1", 1.25), 3: ("pg:teto_queue", 5.5), 4: ("executor-2", 0.75)}
    assert _cpu.spent(before, after) == {"queue": 1.5, "executor-1": 0.25, "pg:teto_queue": 0.5, "executor-2": 0.75}


def test_a_counter_that_went_backwards_is_a_reused_pid_and_counts_nothing():
    assert _cpu.spent({7: ("nats", 9.0)}, {7: ("nats", 1.0)}) == {"nats": 0.0}


def test_per_job_groups_executors_and_orders_by_cost():
    cpu = {"executor-1": 1.0, "executor-2": 1.0, "queue": 3.0, "pg:teto_queue": 0.5}
    assert _cpu.per_job_ms(cpu, 100) == {"queue": 30.0, "executors": 20.0, "pg:teto_queue": 5.0}
    assert list(_cpu.per_job_ms(cpu, 100)) == ["queue", "executors", "pg:teto_queue"]


@pytest.fixture
def burner() -> Iterator[subprocess.Popen]:
    """A process that burned CPU in a child it has reaped (its CPU is in the process's cutime), then waits."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess,sys,time; subprocess.run([sys.executable,'-c',"
                             "'sum(range(3_000_000))']); print('done', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_snapshot_labels_the_parts_and_counts_their_reaped_children(tmp_path, burner):
    # a part that burns CPU in a child it has reaped: the child's CPU counts for the part
    (tmp_path / "processes.json").write_text(json.dumps([{"name": "executor-1", "pid": burner.pid},
                                                          {"name": "gone", "pid": None}]))
    snap = _cpu.snapshot(tmp_path)
    label, cpu = snap[burner.pid]
    assert label == "executor-1" and cpu > 0.02  # the child's sum, reaped into cutime
    assert os.getpid() not in snap


def test_a_process_tree_counts_each_descendant_by_name_with_what_it_reaped(burner):
    # A child that burned CPU in a grandchild it reaped (as a postmaster reaps its backends): counted under the
    # child's name; this process is "self"; the child is found as a descendant and its parent is this process.
    mine = _cpu.tree_cpu()
    assert _cpu.parent(burner.pid) == os.getpid()
    name = open(f"/proc/{burner.pid}/comm").read().strip()
    assert mine[name] > 0.02 and mine["self"] > 0
    assert _cpu.tree_cpu(burner.pid)["self"] > 0.02  # a root of its own: "self", with what it reaped


def test_tree_spent_takes_differences_and_never_goes_below_zero():
    assert _cpu.tree_spent({"self": 1.0, "postgres": 4.0}, {"self": 1.5, "postgres": 3.0, "nats-server": 0.25}) == {
        "self": 0.5, "postgres": 0.0, "nats-server": 0.25}


def test_an_executors_live_run_guard_counts_for_it_with_the_jobs_it_reaped(tmp_path):
    """The run guard lives as long as its agent (so the agent never reaps it during a bench): its CPU and that of
    the jobs it reaped are read live, under the executor's label (snapshot) and as a parent's guard child."""
    guard = ("import subprocess,sys,time; subprocess.run([sys.executable,'-c','sum(range(3_000_000))']); "
             "print('done', flush=True); time.sleep(30)")
    agent = subprocess.Popen([sys.executable, "-c", "import subprocess,sys; subprocess.run([sys.executable, '-c', "
                              f"{guard!r}, {_cpu.RUN_GUARD!r}])"], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout.readline().strip() == "done"
        (tmp_path / "processes.json").write_text(json.dumps([{"name": "executor-1", "pid": agent.pid}]))
        snap = _cpu.snapshot(tmp_path)
        guards = [cpu for pid, (label, cpu) in snap.items() if label == "executor-1" and pid != agent.pid]
        assert len(guards) == 1 and guards[0] > 0.02
        assert _cpu.children_cpu(agent.pid, _cpu.RUN_GUARD) == pytest.approx(guards[0], abs=0.02)
        assert _cpu.children_cpu(agent.pid, "no such command") == 0.0
    finally:
        for pid in _cpu_children(agent.pid):
            os.kill(pid, 9)
        agent.kill()
        agent.wait()


def _cpu_children(parent: int) -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and _cpu.parent(int(d)) == parent]
