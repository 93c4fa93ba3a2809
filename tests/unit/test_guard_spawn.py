"""How the agent starts a run (runner.spawn_of) and how the guard reads its options (guard.parse): a guarded run
that keeps the agent's uid is started without a preexec (vfork) and the guard takes over the preexec's duties;
every other run keeps the preexec."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.executor import guard
from agents.executor.runner import Launch, spawn_of

GUARDED = ["python", "-I", "-S", "/x/guard.py", "--", "sh", "-c", "train -- --fast"]


def _launch(argv: list[str], guarded: bool) -> Launch:
    return Launch(argv=argv, env={}, log_path=Path("/dev/null"), guarded=guarded)


def _sandbox_preexec(parent: int):
    def run() -> None:
        raise AssertionError("never run here")

    run.parent = parent
    return run


def test_a_guarded_run_without_uid_change_gets_no_preexec_and_the_guard_gets_the_duties():
    how = spawn_of(_launch(GUARDED, True), 4242, uid_change=False, cgroup_fd=7, sandbox_preexec=_sandbox_preexec)
    assert how.preexec is None
    assert how.argv == ["python", "-I", "-S", "/x/guard.py", "--parent", "4242", "--cgroup-fd", "7", "--",
                        "sh", "-c", "train -- --fast"]
    assert how.fds == (7,)


def test_without_a_cgroup_the_guard_only_checks_its_parent():
    how = spawn_of(_launch(GUARDED, True), 11, uid_change=False, cgroup_fd=None, sandbox_preexec=None)
    assert how.preexec is None and how.fds == ()
    assert how.argv[3:7] == ["/x/guard.py", "--parent", "11", "--"]


def test_a_uid_change_keeps_the_sandbox_preexec_and_the_argv():
    how = spawn_of(_launch(GUARDED, True), 5, uid_change=True, cgroup_fd=7, sandbox_preexec=_sandbox_preexec)
    assert how.argv == GUARDED and how.fds == ()
    assert how.preexec is not None and how.preexec.parent == 5


@pytest.mark.parametrize("sandboxed", [True, False])
def test_an_unguarded_run_keeps_a_preexec(sandboxed):
    argv = ["python", "-m", "agents.executor.workloads.finetune"]
    how = spawn_of(_launch(argv, False), 5, uid_change=False, cgroup_fd=7,
                   sandbox_preexec=_sandbox_preexec if sandboxed else None)
    assert how.argv == argv and how.fds == () and how.preexec is not None
    assert getattr(how.preexec, "parent", None) == (5 if sandboxed else None)


@pytest.mark.parametrize(("argv", "parsed"), [
    (["--", "true"], (None, None, ["true"])),
    (["true", "--x"], (None, None, ["true", "--x"])),
    (["--parent", "12", "--", "sh", "-c", "x"], (12, None, ["sh", "-c", "x"])),
    (["--parent", "12", "--cgroup-fd", "9", "--", "--parent"], (12, 9, ["--parent"])),
    (["--cgroup-fd", "9", "--parent", "3", "--", "a", "--", "b"], (3, 9, ["a", "--", "b"])),
])
def test_the_guard_reads_its_options_then_the_command(argv, parsed):
    assert guard.parse(argv) == parsed


@pytest.mark.parametrize("argv", [[], ["--"], ["--parent"], ["--parent", "x", "--", "true"],
                                  ["--cgroup-fd", "--", "true"], ["--parent", "3", "--"]])
def test_the_guard_refuses_options_it_cannot_read(argv):
    with pytest.raises(ValueError):
        guard.parse(argv)


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
