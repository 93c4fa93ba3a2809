"""The run guard fences by itself (DESIGN.md section 12): an agent frozen with SIGSTOP is alive, so no
parent-death signal fires, yet its run (and what the run started) ends at the deadline the agent stopped
extending; a deadline moved on by ``extend`` holds the run until the new one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agents.executor.guard_client import Fence, Guard
from tests.integration.test_guard import ROOT, _alive
from tests.support.services import eventually_blocking

pytestmark = pytest.mark.integration

# A stand-in agent: starts ``sh -c "sleep & wait"`` through its guard with a deadline 3 s ahead, moves it on
# every 0.2 s (as acknowledged renewals would), and prints the guard's pid and the command's pid once started.
FENCED_AGENT = textwrap.dedent("""
    import asyncio, os, sys, time
    from agents.executor.guard_client import Fence, Guard

    async def main():
        g = Guard(sys.executable)
        r, w = os.pipe()
        proc = await g.spawn(["sh", "-c", "sleep 300 & echo $! > " + sys.argv[1] + "; wait"],
                             {"PATH": os.environ["PATH"]}, report_fd=w, fence=Fence(time.monotonic() + 3, 1.0))
        print(g.proc.pid, proc.pid, flush=True)
        while True:
            await asyncio.sleep(0.2)
            await g.extend(proc.pid, Fence(time.monotonic() + 3, 1.0))

    asyncio.run(main())
""")


def test_a_frozen_agents_run_is_ended_by_its_guard_at_the_deadline_the_agent_stopped_extending(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    agent = subprocess.Popen([sys.executable, "-c", FENCED_AGENT, str(pid_file)], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    try:
        guard_pid, command = (int(v) for v in agent.stdout.readline().split())
        eventually_blocking(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command to start",
                            every=0.05)
        grandchild = int(pid_file.read_text())
        agent.send_signal(signal.SIGSTOP)  # alive, holding its socket: only the guard's own deadline can act
        eventually_blocking(lambda: not _alive(grandchild) and not _alive(command), timeout=30,
                            what="the run to end with its lease", every=0.05)
        assert _alive(guard_pid)  # the guard itself serves on: the agent may yet wake and start another run
    finally:
        agent.send_signal(signal.SIGCONT)
        agent.kill()
        agent.wait()


async def test_a_run_lives_past_its_first_deadline_while_it_is_extended_then_ends_at_the_last_one():
    g = Guard(sys.executable)
    try:
        read_fd, write_fd = os.pipe()
        start = time.monotonic()
        proc = await g.spawn(["sleep", "300"], {"PATH": os.environ["PATH"]}, report_fd=write_fd,
                             fence=Fence(start + 0.5, 5.0))
        os.close(write_fd)
        os.close(read_fd)
        last = Fence(start + 2.0, 5.0)
        assert await g.extend(proc.pid, last)
        rc = await asyncio.wait_for(proc.wait(), 30)
        ended = time.monotonic()
        assert rc == 128 + signal.SIGTERM  # sleep ends on SIGTERM: the grace's SIGKILL was not needed
        assert ended >= last.until  # it ran past its first deadline: the extension held it
        assert await g.extend(proc.pid, last) is False  # an ended run has nothing to extend
    finally:
        await g.close()


async def test_a_run_that_ignores_sigterm_is_killed_when_the_grace_after_its_deadline_ends(tmp_path):
    g = Guard(sys.executable)
    try:
        read_fd, write_fd = os.pipe()
        script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); " \
                 "time.sleep(300)"
        proc = await g.spawn([sys.executable, "-c", script], {"PATH": os.environ["PATH"]}, report_fd=write_fd,
                             fence=Fence(time.monotonic() + 1.0, 0.5))
        os.close(write_fd)
        os.close(read_fd)
        assert await proc.stdout.readline() == b"1\n"
        assert await asyncio.wait_for(proc.wait(), 30) == 128 + signal.SIGKILL
    finally:
        await g.close()


async def test_a_run_the_guard_signalled_reads_fenced_even_when_an_extension_came_after_the_signal(tmp_path):
    """The race behind a preempted job's "exit status 143" counted as a training error: the guard sends SIGTERM at
    the deadline, the agent's renewal is acknowledged just after and moves the deadline on, the process exits a
    moment later. Only the guard knows it acted: its exit message says so."""
    go = tmp_path / "go"
    # Says when it is up and when SIGTERM came, and exits 143 only once ``go`` exists: the extension lands between.
    script = ("import os, signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: print('term', flush=True))\n"
              "print('up', flush=True)\n"
              "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
              "sys.exit(143)\n")
    g = Guard(sys.executable)
    try:
        read_fd, write_fd = os.pipe()
        proc = await g.spawn([sys.executable, "-c", script, str(go)], {"PATH": os.environ["PATH"]},
                             report_fd=write_fd, fence=Fence(time.monotonic() + 0.3, 30.0))
        os.close(write_fd)
        os.close(read_fd)
        assert await proc.stdout.readline() == b"up\n"
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"term\n"  # the guard acted
        assert await g.extend(proc.pid, Fence(time.monotonic() + 300, 30.0))  # a renewal acknowledged too late
        go.touch()
        assert await asyncio.wait_for(proc.wait(), 30) == 143
        assert proc.fenced is True

        # Extended in time, never signalled: its exit is its own, not the guard's.
        read_fd, write_fd = os.pipe()
        quiet = await g.spawn(["sh", "-c", "sleep 0.6; exit 143"], {"PATH": os.environ["PATH"]}, report_fd=write_fd,
                              fence=Fence(time.monotonic() + 0.3, 30.0))
        os.close(write_fd)
        os.close(read_fd)
        assert await g.extend(quiet.pid, Fence(time.monotonic() + 300, 30.0))
        assert await asyncio.wait_for(quiet.wait(), 30) == 143
        assert quiet.fenced is False
    finally:
        await g.close()


async def test_a_fence_given_as_a_function_is_read_once_the_guard_is_up():
    """The first run of an agent starts its guard (a new interpreter: seconds on a loaded node, renewals
    acknowledged meanwhile): the deadline handed over is read after that, not before."""
    g = Guard(sys.executable)
    read_at: list[bool] = []

    def fence() -> Fence:
        read_at.append(g.running)
        return Fence(time.monotonic() + 300, 5.0)
    try:
        read_fd, write_fd = os.pipe()
        proc = await g.spawn(["true"], {"PATH": os.environ["PATH"]}, report_fd=write_fd, fence=fence)
        os.close(write_fd)
        os.close(read_fd)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert read_at == [True]  # once, with the guard already running
    finally:
        await g.close()
