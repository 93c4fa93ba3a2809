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

pytestmark = pytest.mark.integration


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
        subprocess.Popen([sys.executable, "-m", "agents.executor.guard", "--", "sh", "-c",
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
    res = subprocess.run([sys.executable, "-m", "agents.executor.guard", "--", "sh", "-c", "exit 3"], cwd=root)
    assert res.returncode == 3
    guard = subprocess.Popen([sys.executable, "-m", "agents.executor.guard", "--", "sleep", "300"], cwd=root,
                             start_new_session=True)
    time.sleep(0.5)
    guard.send_signal(signal.SIGTERM)  # sent to the guard alone: forwarded to the command
    assert guard.wait(10) == 128 + signal.SIGTERM
    res = subprocess.run([sys.executable, "-m", "agents.executor.guard", "--", str(tmp_path / "missing")],
                         cwd=root, capture_output=True, text=True)
    assert res.returncode == 127 and "cannot start" in res.stderr
