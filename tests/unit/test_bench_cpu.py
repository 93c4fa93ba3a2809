"""The throughput bench's CPU accounting (bench/_cpu.py): what each part of a stack spent per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def test_a_snapshot_labels_the_parts_and_counts_their_reaped_children(tmp_path):
    # a part that burns CPU in a child it has reaped: the child's CPU counts for the part
    burner = subprocess.Popen([sys.executable, "-c",
                               "import subprocess,sys,time; subprocess.run([sys.executable,'-c',"
                               "'sum(range(3_000_000))']); print('done', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout.readline().strip() == "done"
        (tmp_path / "processes.json").write_text(json.dumps([{"name": "executor-1", "pid": burner.pid},
                                                              {"name": "gone", "pid": None}]))
        snap = _cpu.snapshot(tmp_path)
        label, cpu = snap[burner.pid]
        assert label == "executor-1" and cpu > 0.02  # the child's sum, reaped into cutime
        assert os.getpid() not in snap
    finally:
        burner.kill()
        burner.wait()
