"""The training process: launched in its own session with the ``TETO_*`` environment, watched, stopped.

The child gets the write end of a pipe (``TETO_REPORT_FD``) and writes JSON lines through ``teto.sdk``; the
agent reads them here. ``PR_SET_PDEATHSIG`` makes the kernel SIGKILL the child when the agent dies, so a
training process can never outlive its agent (and so its lease); the SDK also exits on a broken pipe.
stdout and stderr are read by the agent through pipes (enlarged, so a burst never waits on the agent): each goes
to the run's log file and to ``on_output`` (the log shipping, logsender.py); the last ~4 KB of stderr are kept
for ``RunFinished.error``. With a
``Sandbox`` (sandbox.py) the child joins its cgroup and takes its uid before exec, and whatever it left behind is
killed as soon as it has exited or been stopped. A ``command`` run is started by the agent's guard
(guard.py, guard_client.py), which does the same in the child it forks, not by the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from libs.contracts.logs import LogStream

from .process import F_SETPIPE_SZ, PIPE_BYTES, Launch

if TYPE_CHECKING:
    from .guard_client import Fence, Guard
    from .sandbox import Sandbox

log = logging.getLogger(__name__)

STDERR_TAIL_BYTES = 4096
EXIT_POLL_SECONDS = 0.05
PR_SET_PDEATHSIG = 1
READ_BYTES = 1 << 18  # per read of an output pipe: fewer, larger reads when a process writes fast

Output = Callable[[LogStream, bytes], None]

_libc: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        # Loaded in the parent: a forked child must not load libraries before exec.
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _enlarge(pipe: Any) -> None:
    """Grow a pipe's kernel buffer (Linux; best effort): the process writes on while the agent is busy. A
    process that exits at once (``true``) may have had its pipe read to the end and closed already, on a busy
    machine, before its start returns: nothing to grow then (its ``fileno()`` is a ValueError)."""
    transport = getattr(pipe, "_transport", None)
    if transport is None or transport.is_closing():
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        import fcntl

        fcntl.fcntl(transport.get_extra_info("pipe").fileno(), F_SETPIPE_SZ, PIPE_BYTES)


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        if _libc is not None:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the agent died between fork and prctl
            os._exit(1)

    return preexec


def preexec_of(parent_pid: int, sandbox_preexec: Callable[[int], Callable[[], None]] | None) -> Callable[[], None]:
    """What the forked child of a run the agent starts itself (the built-in fine-tune) does before exec: join its
    cgroup, take its uid and ask for its parent-death signal (sandbox.py), or only ask for the signal."""
    return sandbox_preexec(parent_pid) if sandbox_preexec is not None else _die_with_parent(parent_pid)


@dataclass
class Child:
    """A running training process and what it has said so far."""

    proc: Any  # an asyncio.subprocess.Process, or a guard_client.GuardedProcess for a guarded launch
    launch: Launch
    _tail: bytearray = field(default_factory=bytearray)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _readers: int = 0
    bad_lines: int = 0
    sandbox: Sandbox | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def fenced(self) -> bool:
        """Whether its guard signalled it past its deadline (a guarded run's exit says so; never an unguarded one)."""
        return bool(getattr(self.proc, "fenced", False))

    @classmethod
    async def start(cls, launch: Launch, on_report: Callable[[dict[str, Any]], None],
                    sandbox: Sandbox | None = None, on_output: Output | None = None,
                    guard: Guard | None = None, fence: Fence | Callable[[], Fence] | None = None) -> Child:
        """Start a launch: a guarded one through ``guard`` (required then), any other as the agent's child. A
        guarded run with a ``fence`` (or a function giving it, read as the guard spawns the run) is ended by the
        guard itself once that deadline passes (guard.py)."""
        if launch.guarded and guard is None:
            raise ValueError("a guarded launch needs the agent's guard")
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        # Never through a link: the job directory may have belonged to a run that planted one.
        logf = os.fdopen(os.open(launch.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600),
                         "ab")
        cgroup = sandbox.cgroup if sandbox is not None else None
        umask = 0o077 if sandbox is not None else -1  # as the sandbox's preexec sets it, for every run in one
        try:
            if launch.guarded:
                assert guard is not None
                proc: Any = await guard.spawn(
                    launch.argv, launch.env, report_fd=write_fd, cwd=launch.cwd, umask=umask,
                    uid=sandbox.uid if sandbox is not None else None, gid=sandbox.gid if sandbox is not None else None,
                    cgroup_fd=cgroup.procs_fd if cgroup is not None and cgroup.procs_fd >= 0 else None,
                    rlimits=sandbox.plan.rlimits if sandbox is not None else (), fence=fence)
            else:
                preexec = preexec_of(os.getpid(), sandbox.preexec if sandbox is not None else None)
                proc = await asyncio.create_subprocess_exec(
                    *launch.argv, env=dict(launch.env, TETO_REPORT_FD=str(write_fd)), cwd=launch.cwd,
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                    pass_fds=(write_fd,), start_new_session=True, preexec_fn=preexec, umask=umask)
                for pipe in (proc.stdout, proc.stderr):
                    _enlarge(pipe)
        except BaseException:
            os.close(read_fd)
            logf.close()
            raise
        finally:
            os.close(write_fd)  # only the child holds the write end, so EOF means the child is gone
        if sandbox is not None:
            sandbox.pgid = proc.pid
        child = cls(proc=proc, launch=launch, sandbox=sandbox, _readers=2)
        child._tasks = [asyncio.create_task(child._read_reports(read_fd, on_report), name=f"reports-{proc.pid}"),
                        asyncio.create_task(child._read_output(LogStream.STDOUT, logf, on_output),
                                            name=f"stdout-{proc.pid}"),
                        asyncio.create_task(child._read_output(LogStream.STDERR, logf, on_output),
                                            name=f"stderr-{proc.pid}")]
        return child

    async def _read_reports(self, fd: int, on_report: Callable[[dict[str, Any]], None]) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                    os.fdopen(fd, "rb", buffering=0))
        try:
            while line := await reader.readline():
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise ValueError("not an object")
                except ValueError:
                    self.bad_lines += 1
                    if self.bad_lines == 1:
                        log.warning("process %s wrote an unreadable report line: %r", self.pid, line[:200])
                    continue
                try:
                    on_report(record)
                except Exception:  # noqa: BLE001 - a bad report must not stop the reading
                    log.exception("could not handle report %r", record)
        except ValueError:  # a line over the limit: stop reading reports, the process keeps running
            log.warning("process %s wrote an over-long report line; ignoring its further reports", self.pid)
        finally:
            transport.close()

    async def _read_output(self, stream: LogStream, logf: Any, on_output: Output | None) -> None:
        pipe = self.proc.stdout if stream is LogStream.STDOUT else self.proc.stderr
        assert pipe is not None
        try:
            while chunk := await pipe.read(READ_BYTES):
                if stream is LogStream.STDERR:
                    self._tail += chunk
                    del self._tail[:-STDERR_TAIL_BYTES]
                with contextlib.suppress(OSError):
                    logf.write(chunk)
                    logf.flush()
                if on_output is not None:
                    try:
                        on_output(stream, chunk)
                    except Exception:  # noqa: BLE001 - shipping must never stop the reading (the process would block)
                        log.exception("could not ship output of process %s", self.pid)
                        on_output = None
        finally:
            self._readers -= 1
            if self._readers == 0:
                logf.close()

    def stderr_tail(self) -> str:
        return bytes(self._tail).decode("utf-8", "replace")

    async def wait(self, drain_seconds: float = 2.0) -> int:
        """The exit status, after the reports and stderr written before exit have been read."""
        rc = await self.exited()
        await self.end()  # the run's exit is its main process's: what it left dies now
        # A grandchild may still hold the pipes open; do not wait for it forever.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), drain_seconds)
        for t in self._tasks:
            t.cancel()
        return rc

    async def exited(self) -> int:
        """The main process's exit status, as soon as it has exited. Not ``proc.wait()`` alone: on Python 3.11
        that returns only once the child's pipes are closed too, and a process the run left behind holds its
        stderr, so the run's end would wait for the leftover (forever, for ``sh -c 'sleep 1000 & exit 0'``)."""
        waiting = asyncio.ensure_future(asyncio.shield(self.proc.wait()))
        try:
            while self.proc.returncode is None and not waiting.done():
                await asyncio.wait({waiting}, timeout=EXIT_POLL_SECONDS)
        finally:
            waiting.cancel()
        return self.proc.returncode

    async def end(self) -> None:
        """Kill whatever the run left behind and give its directories back to the agent (once)."""
        if self.sandbox is not None:
            await self.sandbox.close()

    def signal(self, sig: int) -> None:
        """Signal the whole session: a script that started helpers (a shell running python) stops with them.

        Never through ``proc.send_signal``: Popen.send_signal polls first, and that poll can reap a child the
        group signal has just killed, behind asyncio's child watcher, which then reports exit status 255 instead
        of the real one (a stopped run would look like a failed one)."""
        if self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)  # not a group leader any more: the process alone

    async def stop(self, grace_seconds: float) -> None:
        """SIGTERM, then SIGKILL if still running after the grace; returns once the process is gone."""
        if self.proc.returncode is not None:
            await self.end()
            return
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.exited(), grace_seconds)
        except TimeoutError:
            log.warning("process %s ignored SIGTERM for %.1fs: SIGKILL", self.pid, grace_seconds)
            self.signal(signal.SIGKILL)
            await self.exited()
        await self.end()
