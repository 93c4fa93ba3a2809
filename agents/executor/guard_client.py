"""The agent's side of its guard (guard.py): started once, on the first ``command`` run, and asked to start every
command after it, over a Unix socket.

A per-run guard was a Python interpreter started for every run (about 15 ms of CPU for a job running ``true``,
half of an executor's CPU per trivial job); this one starts once per agent. ``spawn`` hands it the run's argv,
environment, working directory, umask and uid, with the write ends of the run's stdout, stderr and report pipes
and the run's ``cgroup.procs`` attached, and returns a ``GuardedProcess``: what ``runner.Child`` needs of an
``asyncio.subprocess.Process`` (pid, which is also the command's process group; returncode; wait; the output
streams). The command's exit status arrives from the guard, which reaps it. If the guard dies, every command it
started dies with it (their parent-death signal) and reads as killed (137); the next run starts a new guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import guard_protocol
from .process import F_SETPIPE_SZ, PIPE_BYTES

log = logging.getLogger(__name__)

GUARD = Path(__file__).resolve().with_name("guard.py")  # run as a file, with -I -S: no site, no user path (guard.py)
GUARD_LOST = guard_protocol.AGENT_GONE  # a command whose guard died was SIGKILLed with it (its parent-death signal)


class GuardUnavailable(OSError):
    """The guard could not be started or asked (its reason says why)."""


@dataclass
class GuardedProcess:
    """A command started by the guard, as ``runner.Child`` uses a process."""

    pid: int = 0
    returncode: int | None = None
    fenced: bool = False  # the guard signalled it past a deadline (its exit says so: guard.py ``reap``)
    stdout: asyncio.StreamReader | None = None
    stderr: asyncio.StreamReader | None = None
    _exited: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    async def wait(self) -> int:
        await asyncio.shield(self._exited)
        assert self.returncode is not None
        return self.returncode

    def exited(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = status
        if not self._exited.done():
            self._exited.set_result(status)


def request(argv: list[str], env: Mapping[str, str], *, cwd: Path | None, umask: int, uid: int | None,
            gid: int | None, cgroup: bool, rid: int, rlimits: Sequence[tuple[int, int]] = (),
            fence: Fence | None = None) -> bytes:
    """One request as the guard reads it: the 4-byte length, then the JSON (pure). Every command is confined
    (no_new_privs, the seccomp filter: confine.py) with ``rlimits``."""
    body = {"id": rid, "argv": list(argv), "env": dict(env), "cwd": str(cwd) if cwd else None,
            "umask": umask, "uid": uid, "gid": gid, "report": True, "cgroup": cgroup,
            "confine": True, "rlimits": [list(r) for r in rlimits]}
    if fence is not None:
        body.update(until=fence.until, grace=fence.grace)
    return _framed(body)


def extension(pid: int, fence: Fence) -> bytes:
    """The request that moves a run's deadline on (pure)."""
    return _framed({"op": "extend", "pid": pid, "until": fence.until, "grace": fence.grace})


def _framed(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return guard_protocol.HEADER.pack(len(data)) + data


@dataclass(frozen=True)
class Fence:
    """A run's deadline as its guard holds it: ``until`` on the machine's monotonic clock (``time.monotonic``, the
    same in every process), SIGTERM then, SIGKILL ``grace`` seconds later, unless the agent moves it on first."""

    until: float
    grace: float


class Guard:
    """One agent's guard process, started on first use (from the event loop's thread: the guard's parent-death
    signal follows the thread that started it)."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._pending: dict[int, tuple[GuardedProcess, asyncio.Future]] = {}
        self._live: dict[int, GuardedProcess] = {}
        self._ids = 0

    @property
    def running(self) -> bool:
        return self.sock is not None

    async def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Its own session (a terminal's Ctrl-C stops runs through the agent, with their grace), none of the
            # agent's environment (its credentials): the guard needs neither.
            env = {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}
            self.proc = await asyncio.create_subprocess_exec(
                self.python, "-I", "-S", str(GUARD), "--parent", str(os.getpid()), "--socket", str(theirs.fileno()),
                pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL, env=env, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self._reader = asyncio.create_task(self._read(ours), name="guard-replies")
        log.info("run guard started as process %d", self.proc.pid)

    async def spawn(self, argv: list[str], env: Mapping[str, str], *, report_fd: int, cwd: Path | None = None,
                    umask: int = -1, uid: int | None = None, gid: int | None = None,
                    cgroup_fd: int | None = None, rlimits: Sequence[tuple[int, int]] = (),
                    fence: Fence | Callable[[], Fence] | None = None) -> GuardedProcess:
        """Start ``argv`` through the guard; its output is read from the returned process's streams. With a
        ``fence`` the guard ends it by itself once that deadline passes unless ``extend`` moves it on. A function
        giving the fence is read once the guard is up, just before the request: a guard started for this run
        (a new interpreter, seconds on a loaded node) never gets the deadline from before its start."""
        loop = asyncio.get_running_loop()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            async with self._lock:
                if not self.running:
                    await self._start()
                assert self.sock is not None
                self._ids += 1
                rid = self._ids
                proc, started = GuardedProcess(), loop.create_future()
                self._pending[rid] = (proc, started)
                data = request(argv, env, cwd=cwd, umask=umask, uid=uid, gid=gid, cgroup=cgroup_fd is not None,
                               rid=rid, rlimits=rlimits, fence=fence() if callable(fence) else fence)
                fds = [out_w, err_w, report_fd] + ([cgroup_fd] if cgroup_fd is not None else [])
                try:
                    await self._send(data, fds)
                except OSError as exc:
                    self._pending.pop(rid, None)
                    self._lost(exc, self.sock)
                    raise GuardUnavailable(f"the run guard cannot be asked: {exc}") from exc
            await started  # the guard has forked; its exit is reported on the same socket, after this
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        proc.stdout, proc.stderr = await _reader(out_r), await _reader(err_r)
        return proc

    async def extend(self, pid: int, fence: Fence) -> bool:
        """Move the deadline of run ``pid`` on (the lease renewal was acknowledged); False when the guard is gone
        (its runs died with it)."""
        async with self._lock:
            if not self.running or pid not in self._live:
                return False
            try:
                await self._send(extension(pid, fence), [])
            except OSError as exc:
                self._lost(exc, self.sock)
                return False
        return True

    async def _send(self, data: bytes, fds: list[int]) -> None:
        assert self.sock is not None
        loop = asyncio.get_running_loop()
        if not fds:
            await loop.sock_sendall(self.sock, data)
            return
        while True:
            try:  # the descriptors travel with the first bytes
                sent = socket.send_fds(self.sock, [data], fds)
                break
            except BlockingIOError:
                await asyncio.sleep(0.005)
        if sent < len(data):
            await loop.sock_sendall(self.sock, data[sent:])

    async def _read(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        buffer = b""
        try:
            while chunk := await loop.sock_recv(sock, 65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._on_reply(json.loads(line))
            self._lost(EOFError("the run guard closed its socket"), sock)
        except (OSError, ValueError) as exc:
            self._lost(exc, sock)

    def _on_reply(self, reply: dict[str, Any]) -> None:
        if "exited" in reply:
            proc = self._live.pop(reply["exited"], None)
            if proc is not None:
                proc.fenced = bool(reply.get("fenced"))
                proc.exited(int(reply["status"]))
            return
        proc, started = self._pending.pop(reply.get("id"), (None, None))
        if proc is None or started is None:
            return
        if "pid" in reply:
            proc.pid = int(reply["pid"])
            self._live[proc.pid] = proc  # before anything else is read: its exit may be the very next line
            started.set_result(proc.pid)
        else:
            started.set_exception(GuardUnavailable(f"the run guard could not start the command: {reply.get('error')}"))

    def _lost(self, why: BaseException, sock: socket.socket | None) -> None:
        """The guard is gone: its commands died with it; the next spawn starts a new one."""
        if self.sock is None or sock is not self.sock:
            return
        if not isinstance(why, EOFError) or self._live or self._pending:
            log.error("run guard lost (%r): %d run(s) ended with it", why, len(self._live))
        self.sock.close()
        self.sock = None
        for proc in self._live.values():
            proc.exited(GUARD_LOST)
        self._live.clear()
        for _, started in self._pending.values():
            if not started.done():
                started.set_exception(GuardUnavailable(f"the run guard was lost: {why!r}"))
        self._pending.clear()

    async def close(self, timeout: float = 5.0) -> None:
        """Stop the guard (it kills whatever it still runs: close it after the runs have been stopped)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self._reader is not None:
            self._reader.cancel()
        if self.proc is not None:
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.wait_for(self.proc.wait(), timeout)
            if self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
            self.proc = None


async def _reader(fd: int) -> asyncio.StreamReader:
    """A stream of a pipe's read end, its kernel buffer enlarged (Linux; best effort)."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    reader = asyncio.StreamReader(limit=1 << 16)
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                       os.fdopen(fd, "rb", buffering=0))
    return reader
