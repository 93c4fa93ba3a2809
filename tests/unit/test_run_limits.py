"""A run's limits and confinement, without an agent: how each limit is enforced for every host capability
(limits.plan, exhaustively), what an exit says about them (limits.exit_reason), and the seccomp filter itself
(confine.py) applied to real child processes: no namespace of any kind, threads and forks as before."""

from __future__ import annotations

import itertools
import platform
import resource
import subprocess
import sys

import pytest

from agents.executor import confine
from agents.executor import limits as run_limits
from libs.contracts.jobs import JobSpec, RunLimits

pytestmark = pytest.mark.unit

ALL = {"memory_mb": 512, "pids": 64, "disk_mb": 100}
HOSTS = [set(c) for n in range(3) for c in itertools.combinations(("memory", "pids"), n)]


@pytest.mark.parametrize("per_run_uid", [True, False], ids=["per-run-uid", "shared-uid"])
@pytest.mark.parametrize("controllers", HOSTS, ids=lambda c: "+".join(sorted(c)) or "no-controllers")
def test_every_limit_is_enforced_by_the_strongest_means_or_said_not_to_hold(controllers, per_run_uid):
    plan = run_limits.plan(ALL, controllers, per_run_uid=per_run_uid)
    rlimits = dict(plan.rlimits)
    if "memory" in controllers:
        assert plan.cgroup_files["memory.max"] == str(512 << 20) and resource.RLIMIT_DATA not in rlimits
    else:
        assert rlimits[resource.RLIMIT_DATA] == 512 << 20
        assert any(line.startswith("memory: no cgroup v2 memory controller") for line in plan.not_enforced)
    if "pids" in controllers:
        assert plan.cgroup_files["pids.max"] == "64" and resource.RLIMIT_NPROC not in rlimits
    elif per_run_uid:
        assert rlimits[resource.RLIMIT_NPROC] == 64
    else:
        assert "pids" not in plan.enforced and any("NOT ENFORCED" in line for line in plan.not_enforced)
    assert rlimits[resource.RLIMIT_FSIZE] == 100 << 20  # always: per file
    assert "for all its files" in plan.enforced["disk"] and not any("disk" in x for x in plan.not_enforced)


def test_no_limits_means_nothing_set_and_nothing_said():
    plan = run_limits.plan({}, {"memory", "pids"}, per_run_uid=True)
    assert plan == run_limits.LimitPlan() and plan.lines() == []


@pytest.mark.parametrize(("rc", "oom", "why"), [
    (-9, True, "killed by its memory limit"), (137, True, "killed by its memory limit"),
    (153, False, "stopped by its disk limit"), (-25, False, "stopped by its disk limit"),
    (1, False, None), (-9, False, None)], ids=["oom-signal", "oom-status", "sigxfsz-status", "sigxfsz-signal",
                                              "plain-failure", "plain-kill"])
def test_the_limit_that_ended_a_run_is_named(rc, oom, why):
    plan = run_limits.plan(ALL, {"memory"}, per_run_uid=True)
    found = run_limits.exit_reason(rc, plan, oom)
    assert (found is None) if why is None else found.startswith(why)


def test_a_job_spec_carries_its_limits_within_bounds():
    spec = JobSpec.model_validate({"workload": {"kind": "finetune"}, "limits": {"memory_mb": 2048, "pids": 256}})
    assert spec.limits == RunLimits(memory_mb=2048, pids=256)
    assert JobSpec.model_validate({"workload": {"kind": "finetune"}}).limits == RunLimits()
    for bad in ({"memory_mb": 1}, {"pids": 0}, {"disk_mb": -1}, {"swap": 1}):
        with pytest.raises(ValueError):
            JobSpec.model_validate({"workload": {"kind": "finetune"}, "limits": bad})


def test_the_filter_is_eight_bytes_an_instruction_for_each_known_machine():
    for machine in confine.ARCHES:
        program = confine.seccomp_program(machine)
        assert program is not None and len(program) == 17 * 8
    assert confine.seccomp_program("sparc64") is None


needs_filter = pytest.mark.skipif(confine.seccomp_program(platform.machine()) is None,
                                  reason="no system call table for this machine")


def confined(argv: list[str], rlimits=()) -> subprocess.CompletedProcess:
    box = confine.Confinement()
    return subprocess.run(argv, preexec_fn=lambda: box.apply(rlimits), capture_output=True, text=True, timeout=60)


@needs_filter
@pytest.mark.parametrize("flag", ["-U", "-n", "-m", "-p", "-i", "-u", "-C"], ids=str)
def test_no_namespace_of_any_kind_can_be_made(flag):
    done = confined(["unshare", flag, "--fork" if flag == "-p" else "--", "true"])
    assert done.returncode != 0 and "Operation not permitted" in done.stderr


@needs_filter
def test_threads_forks_and_exec_work_as_before_under_the_filter():
    code = ("import subprocess, threading, os; t = threading.Thread(target=lambda: None); t.start(); t.join(); "
            "print(subprocess.run(['sh', '-c', 'echo child'], capture_output=True, text=True).stdout.strip()); "
            "print(open('/proc/self/status').read().count('NoNewPrivs:\\t1'))")
    done = confined([sys.executable, "-c", code])
    assert done.returncode == 0 and done.stdout.split() == ["child", "1"], done.stderr


def test_rlimits_are_applied_to_the_child():
    done = confined([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE))"],
                    rlimits=[(resource.RLIMIT_FSIZE, 1 << 20)])
    assert done.stdout.strip() == f"({1 << 20}, {1 << 20})"


def test_the_disk_watch_counts_each_file_once_and_names_the_overshoot(tmp_path):
    from agents.executor import diskwatch

    work = tmp_path / "work"
    (work / "tmp").mkdir(parents=True)
    (work / "tmp" / "a").write_bytes(b"x" * (3 << 20))
    assert diskwatch.outermost([work, work / "tmp", tmp_path / "ckpt"]) == [work, tmp_path / "ckpt"]
    used = diskwatch.used_bytes([work, work / "tmp"])
    assert (3 << 20) <= used < (4 << 20)
    assert diskwatch.over(2 << 20, 2) is None
    assert diskwatch.over((2 << 20) + 1, 2).startswith("stopped by its disk limit: its files grew by 2.0 MiB")


@pytest.mark.parametrize("controllers", HOSTS, ids=lambda c: "+".join(sorted(c)) or "no-controllers")
@pytest.mark.parametrize("filters", [True, False], ids=["filter", "no-filter"])
def test_the_agent_says_at_start_what_this_host_cannot_do(filters, controllers):
    lines = run_limits.host_lines(filters, controllers)
    assert any(line.startswith("seccomp: NOT ENFORCED") for line in lines) is (not filters)
    limited = [line for line in lines if line.startswith("run limits:")]
    assert bool(limited) is (controllers != {"memory", "pids"})
    for name in {"memory", "pids"} - controllers:
        assert name in limited[0]
