"""The agent's side of the guard reads its replies (guard_client.Guard._on_reply, _lost): a command's exit that
arrives in the same read as its start is not lost, and a guard that dies takes its commands' statuses with it."""

from __future__ import annotations

import asyncio

from agents.executor.guard_client import GUARD_LOST, Guard, GuardedProcess, GuardUnavailable


class _Sock:
    closed = False

    def close(self) -> None:
        self.closed = True


async def test_an_exit_read_right_after_its_start_reaches_the_process():
    g = Guard("python")
    proc, started = GuardedProcess(), asyncio.get_running_loop().create_future()
    g._pending[1] = (proc, started)
    g._on_reply({"id": 1, "pid": 4242})
    g._on_reply({"exited": 4242, "status": 3})  # before the spawning coroutine has resumed
    assert started.result() == 4242 and proc.pid == 4242
    assert await proc.wait() == 3 and proc.returncode == 3
    g._on_reply({"exited": 4242, "status": 9})  # a repeated or unknown exit changes nothing
    assert proc.returncode == 3


async def test_a_start_the_guard_refused_raises_with_its_reason():
    g = Guard("python")
    proc, started = GuardedProcess(), asyncio.get_running_loop().create_future()
    g._pending[2] = (proc, started)
    g._on_reply({"id": 2, "error": "OSError: fork failed"})
    assert isinstance(started.exception(), GuardUnavailable) and "fork failed" in str(started.exception())


async def test_a_lost_guard_ends_its_commands_as_killed_and_fails_pending_starts():
    g = Guard("python")
    sock = g.sock = _Sock()
    running, waiting = GuardedProcess(pid=10), GuardedProcess()
    g._live[10] = running
    starting = asyncio.get_running_loop().create_future()
    g._pending[3] = (waiting, starting)
    g._lost(EOFError("gone"), _Sock())  # another (an older) guard's socket: not this one's loss
    assert running.returncode is None and g.running
    g._lost(EOFError("gone"), sock)
    assert await running.wait() == GUARD_LOST and sock.closed and not g.running
    assert isinstance(starting.exception(), GuardUnavailable)
