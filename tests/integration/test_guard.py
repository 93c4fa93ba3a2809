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
