"""How the agent starts a run: a ``command`` run through its long-lived guard (the guard's options, where the
descriptors it receives go, the request it reads, the status it reports: guard_protocol.py, guard_client.py), any
other run as the agent's own child with a preexec (runner.preexec_of)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from agents.executor import guard_client, guard_protocol, launch
from agents.executor.runner import preexec_of


def _sandbox_preexec(parent: int):
    def run() -> None:
        raise AssertionError("never run here")

    run.parent = parent
    return run


def test_a_run_the_agent_starts_itself_keeps_the_sandbox_preexec_or_only_dies_with_the_agent():
    assert preexec_of(5, _sandbox_preexec).parent == 5
    bare = preexec_of(5, None)
    assert callable(bare) and not hasattr(bare, "parent")


def test_a_command_run_is_the_command_itself_started_by_the_guard(tmp_path):
    from libs.contracts.agents import RunJob
    from libs.contracts.jobs import CommandWorkload, FinetuneWorkload, JobSpec

    def grant(workload) -> RunJob:
        return RunJob(job_id="j1", epoch=1, executor_id="ex-1", attempt=1, lease_seconds=6, heartbeat_seconds=1,
                      spec=JobSpec(workload=workload))

    assert launch.argv(grant(CommandWorkload(command=["sh", "-c", "train -- --fast"]))) == ["sh", "-c",
                                                                                            "train -- --fast"]
    assert launch.argv(grant(FinetuneWorkload()))[1:] == ["-m", launch.FINETUNE_MODULE]


@pytest.mark.parametrize(("argv", "parsed"), [
    (["--parent", "12", "--socket", "5"], (12, 5)),
    (["--socket", "9", "--parent", "3"], (3, 9)),
])
def test_the_guard_reads_its_options(argv, parsed):
    assert guard_protocol.parse(argv) == parsed


@pytest.mark.parametrize("argv", [[], ["--parent", "3"], ["--socket", "4"], ["--parent", "x", "--socket", "4"],
                                  ["--parent", "3", "--socket"], ["--parent", "3", "--socket", "4", "--", "true"]])
def test_the_guard_refuses_options_it_cannot_read(argv):
    with pytest.raises(ValueError):
        guard_protocol.parse(argv)


@pytest.mark.parametrize(("count", "report", "cgroup", "moves", "procs"), [
    (2, False, False, ((1, 0), (2, 1)), None),
    (3, True, False, ((1, 0), (2, 1), (guard_protocol.REPORT_FD, 2)), None),
    (4, True, True, ((1, 0), (2, 1), (guard_protocol.REPORT_FD, 2)), 3),
    (3, False, True, ((1, 0), (2, 1)), 2),
])
def test_the_descriptors_received_go_to_stdout_stderr_the_report_pipe_and_the_cgroup(count, report, cgroup, moves,
                                                                                       procs):
    assert guard_protocol.placement(list(range(10, 10 + count)), report, cgroup) == (moves, procs)


@pytest.mark.parametrize(("count", "report", "cgroup"), [(1, False, False), (3, False, False), (3, True, True)])
def test_a_request_with_the_wrong_number_of_descriptors_is_refused(count, report, cgroup):
    with pytest.raises(ValueError):
        guard_protocol.placement(list(range(count)), report, cgroup)


@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (-signal.SIGTERM, 143), (-signal.SIGKILL, 137)])
def test_a_command_killed_by_a_signal_reads_as_a_shell_reports_it(code, status):
    assert guard_protocol.exit_status(code) == status


def test_a_request_is_its_length_then_what_the_guard_needs_to_start_the_command():
    data = guard_client.request(["sh", "-c", "x"], {"A": "1"}, cwd=Path("/w"), umask=0o077, uid=200001, gid=None,
                                cgroup=True, rid=7)
    (size,) = guard_protocol.HEADER.unpack(data[:guard_protocol.HEADER.size])
    assert size == len(data) - guard_protocol.HEADER.size
    assert json.loads(data[guard_protocol.HEADER.size:]) == {
        "id": 7, "argv": ["sh", "-c", "x"], "env": {"A": "1"}, "cwd": "/w", "umask": 0o077, "uid": 200001,
        "gid": None, "report": True, "cgroup": True, "confine": True, "rlimits": []}


def test_growing_the_pipe_of_a_process_that_already_ended_is_no_error():
    """CI once failed a trivial job with "cannot start '/usr/bin/true': ValueError: I/O operation on closed
    file": on a busy machine ``true`` had exited and its output pipe had been read to the end and closed before
    the start returned, and growing that pipe's buffer asked a closed file for its descriptor."""
    import asyncio
    import os

    from agents.executor.runner import _enlarge

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                    os.fdopen(read_fd, "rb", buffering=0))
        os.close(write_fd)
        assert await reader.read() == b""  # the end read; the transport closes its pipe
        await asyncio.sleep(0)
        closed = transport.get_extra_info("pipe").closed
        _enlarge(reader)
        return closed

    assert asyncio.run(scenario())  # the case really arose (the pipe's file closed), and nothing was raised
