"""The guard: a user's command that trains in a grandchild (``sh -c``) dies with its agent, signals reach it,
and its exit status passes through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents.executor.launch import GUARD

pytestmark = pytest.mark.integration
GUARD_ARGV = [sys.executable, "-I", "-S", str(GUARD), "--"]  # as the agent starts it (launch.argv)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) is not training.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_a_grandchild_of_the_guard_dies_when_the_agent_is_killed(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # A stand-in agent: starts the guard in its own session (as the runner does), then is SIGKILLed.
    agent = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen({GUARD_ARGV!r} + ["sh", "-c",
                          "sleep 300 & echo $! > {pid_file}; wait"], start_new_session=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", agent], cwd=Path(__file__).resolve().parents[2])
    assert _wait(lambda: pid_file.exists() and pid_file.read_text().strip()), "the command did not start"
    grandchild = int(pid_file.read_text())
    assert _alive(grandchild)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait(lambda: not _alive(grandchild)), "the grandchild outlived its agent"


def test_exit_status_and_signals_pass_through(tmp_path):
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([*GUARD_ARGV, "sh", "-c", "exit 3"], cwd=root)
    assert res.returncode == 3
    guard = subprocess.Popen([*GUARD_ARGV, "sleep", "300"], cwd=root,
                             start_new_session=True)
    time.sleep(0.5)
    guard.send_signal(signal.SIGTERM)  # sent to the guard alone: forwarded to the command
    assert guard.wait(10) == 128 + signal.SIGTERM
    res = subprocess.run([*GUARD_ARGV, str(tmp_path / "missing")],
                         cwd=root, capture_output=True, text=True)
    assert res.returncode == 127 and "cannot start" in res.stderr


def test_the_module_form_still_works_and_a_kill_signal_reads_as_a_shell_reports_it():
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "agents.executor.guard", "--", "sh", "-c", "kill -9 $$"], cwd=root)
    assert res.returncode == 128 + signal.SIGKILL


def test_the_report_pipe_reaches_the_command_and_the_environment_passes_unchanged(tmp_path):
    read, write = os.pipe()
    env = {**os.environ, "TETO_REPORT_FD": str(write), "TETO_SOMETHING": "kept"}
    script = 'import os; os.write(int(os.environ["TETO_REPORT_FD"]), os.environ["TETO_SOMETHING"].encode())'
    res = subprocess.run([*GUARD_ARGV, sys.executable, "-c", script], env=env, pass_fds=(write,), timeout=30)
    os.close(write)
    assert res.returncode == 0
    assert os.read(read, 100) == b"kept"
    os.close(read)


def test_the_guard_starts_without_the_costly_imports():
    """It starts once per run: ``os``, ``signal`` (``enum``), ``ctypes`` and ``subprocess`` each cost milliseconds
    of CPU a run, and the guard needs none of them (``posix``, ``_signal``, ``_ctypes``)."""
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", str(GUARD), "--", "true"], cwd=root,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert {"posix", "_signal", "_ctypes"} <= imported
    assert not imported & {"os", "signal", "enum", "ctypes", "subprocess", "functools", "collections"}, imported


def test_a_guard_whose_parent_is_not_the_agent_named_starts_nothing(tmp_path):
    """The agent died between starting the guard and the guard's parent-death request: nothing may start."""
    marker = tmp_path / "ran"
    res = subprocess.run([sys.executable, "-I", "-S", str(GUARD), "--parent", "1", "--", "touch", str(marker)])
    assert res.returncode == 137 and not marker.exists()


async def test_a_run_started_without_a_preexec_is_in_its_cgroup_and_its_leftovers_die(tmp_path):
    """The vfork path (runner.spawn_of): the guard joins the run's cgroup before the command starts, closes the
    agent's cgroup.procs, the umask is the sandbox's, and what the command left behind dies with the run."""
    import uuid

    from agents.executor import sandbox as sandboxes
    from agents.executor.runner import Child, Launch

    root = sandboxes.find_cgroup_root()
    name = f"test-guard-{uuid.uuid4().hex[:8]}"
    try:
        box = sandboxes.open_sandbox(uid_range="", workload_user="", lock_dir=tmp_path / "locks", use_cgroup=True,
                                     cgroup_root=root, cgroup_name=lambda r: r / "teto" / name,
                                     dirs=[tmp_path / "work"], start=0)
    except OSError:
        box = None
    if root is None or box is None or box.cgroup is None:
        pytest.skip("no writable cgroup v2 here")
    pid_file, seen = tmp_path / "left.pid", tmp_path / "seen"
    script = (f"sleep 300 & echo $! > {pid_file}; cat /proc/self/cgroup > {seen}; ls -l /proc/self/fd/ >> {seen}; "
              f"umask >> {seen}")
    argv = [sys.executable, "-I", "-S", str(GUARD), "--", "sh", "-c", script]
    child = await Child.start(Launch(argv=argv, env={"PATH": os.environ["PATH"]}, log_path=tmp_path / "run.log",
                                     guarded=True), lambda record: None, box)
    assert await child.wait() == 0
    text = seen.read_text()
    assert any(line.startswith("0::") and line.endswith(f"/teto/{name}") for line in text.splitlines())
    assert "cgroup.procs" not in text  # the guard closed the agent's descriptor before the command started
    assert "0077" in text
    left = int(pid_file.read_text())
    assert _wait(lambda: not _alive(left)), "the run's leftover outlived it"
    assert not box.cgroup.path.exists()
