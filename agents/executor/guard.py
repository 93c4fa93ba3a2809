"""The guard between an executor agent and its users' ``command`` workloads: one process per agent, started once.

The kernel's parent-death signal reaches only the agent's direct child. A user's command often is a shell or a
launcher whose own children train (``sh -c "python train.py"``); if the agent is SIGKILLed those grandchildren
would keep training and writing checkpoints past the lease. The guard is that direct child: it asks the kernel
for SIGTERM when the agent dies, starts every command the agent asks for in its own session (its pid is its
process group), reports each command's exit status, and when the agent dies (the signal, or the end of its
socket) kills every live command's whole group at once and exits. Each command in turn asks for SIGKILL when
the guard dies, so a guard killed on its own takes its commands with it.

The agent asks over a Unix socket (``guard_client.py``): a 4-byte length, then a JSON request (argv, env, cwd,
umask, uid and gid) with the run's descriptors attached (stdout, stderr, the report pipe, and the run's
``cgroup.procs`` when it has a cgroup). The guard forks (cheap: it is a small process, where forking the agent
copied 100 MB of page tables) and the child, before it execs the command: takes the descriptors (the report pipe
as fd 3, ``TETO_REPORT_FD=3``), starts its session, is in the run's cgroup (born there: ``fork_into``; else it
joins through the agent's ``cgroup.procs``, closed at exec: the command cannot move processes), sets the umask,
takes the run's uid (no supplementary
groups) when it has one, asks for its parent-death signal (after the uid change, which clears it), refuses to
run when its parent is no longer the guard, and then is confined (confine.py: the run's rlimits, no_new_privs,
the seccomp filter refusing new namespaces) so that all it execs is. The command's environment is only ever
handed to ``execve``: the
guard never runs with it, as root or otherwise. Replies are JSON lines: ``{"id": N, "pid": P}`` once forked,
``{"exited": P, "status": S}`` when reaped, S as a shell reports it (128 + N for a command killed by signal N).
A command that cannot start exits 127 (126: cannot join the cgroup; 137: its guard was gone) with the reason on
its stderr, as the per-run guard before it did.

The guard also fences each run by itself (DESIGN.md section 12): a spawn may carry a deadline (``until``, on the
monotonic clock every process of the machine shares, and a ``grace``), which the agent moves on with an
``{"op": "extend", "pid", "until", "grace"}`` request each time the queue acknowledges a renewal of the lease.
When the deadline passes without one, the guard sends SIGTERM to the run's process group, and SIGKILL to the group
(and ``cgroup.kill`` of its cgroup) ``grace`` seconds later: an agent frozen (SIGSTOP, a deadlock, a swap storm)
is alive, so no parent-death signal fires, but its run still ends before the queue can give the job to another.

Usage (by the agent): ``python -I -S .../agents/executor/guard.py --parent PID --socket FD``.
"""

import json
import os
import select
import signal
import socket
import struct
import sys
import time
import warnings  # noqa: F401 - os.execvpe imports it: in the guard, not in a child that may have dropped to a uid
# that cannot read the standard library

PR_SET_PDEATHSIG = 1
AGENT_GONE = 137  # as if killed by SIGKILL with the agent, which it would have been
CANNOT_JOIN = 126
CANNOT_START = 127
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
HEADER = struct.Struct("!I")
MAX_REQUEST = 64 << 20
REPORT_FD = 3  # where a command finds its report pipe
MAX_FDS = 8


def exit_status(returncode: int) -> int:
    """A ``waitstatus_to_exitcode`` result as a shell reports it: 128 + N for a death by signal N (pure)."""
    return 128 - returncode if returncode < 0 else returncode


def parse(argv: list) -> tuple:
    """(agent pid, socket fd) of the guard's arguments; ValueError unless ``--parent PID --socket FD``."""
    options = {"--parent": None, "--socket": None}
    while argv:
        if argv[0] not in options or len(argv) < 2 or not argv[1].isdigit():
            raise ValueError(f"unreadable option {argv[0]!r}: --parent PID --socket FD")
        options[argv[0]] = int(argv[1])
        argv = argv[2:]
    if None in options.values():
        raise ValueError("--parent PID and --socket FD are both needed")
    return options["--parent"], options["--socket"]


def fence_due(fences: dict, now: float) -> tuple:
    """The signals the run guard owes now, and when it must look again. ``fences``: pid -> (until, grace, sent)
    where ``sent`` counts the signals sent under the current deadline (0, 1: SIGTERM, 2: SIGKILL too). A run is sent
    SIGTERM once its deadline has passed, SIGKILL once the grace after it has passed too. Returns
    ([(pid, signal)...], seconds until the next one is due, or None when nothing is pending). Pure."""
    due, wake = [], None
    for pid, (until, grace, sent) in fences.items():
        for stage, (at, sig) in enumerate(((until, signal.SIGTERM), (until + grace, signal.SIGKILL)), 1):
            if sent >= stage:
                continue
            if now < at:
                wake = at - now if wake is None else min(wake, at - now)
                break
            due.append((pid, sig))
    return due, wake


def placement(fds: list, report: bool, cgroup: bool) -> tuple:
    """Which received descriptor goes where: ((target fd, index in ``fds``)...) for stdout, stderr and the report
    pipe, and the index of the cgroup's ``cgroup.procs`` (or None). ValueError when the count does not match."""
    wanted = 2 + int(report) + int(cgroup)
    if len(fds) != wanted:
        raise ValueError(f"{len(fds)} descriptors received, {wanted} expected")
    moves = [(1, 0), (2, 1)] + ([(REPORT_FD, 2)] if report else [])
    return tuple(moves), (wanted - 1 if cgroup else None)


class Guard:
    """The guard's state: the commands alive (pid == process group) and its channel to the agent."""

    def __init__(self, agent: int, sock: socket.socket) -> None:
        self.pid = os.getpid()  # a child between its fork and its exec is not the guard (``on_signal``)
        self.agent = agent
        self.sock = sock
        self.live: set = set()
        self.fences: dict = {}  # pid -> (until, grace, signals sent): ``fence_due``
        self.cgroups: dict = {}  # pid -> its cgroup's directory (an open descriptor), for ``cgroup.kill``
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def kill_all(self) -> None:
        for pid in tuple(self.live):  # a copy: a signal handler may run while the loop changes the set
            try:
                os.killpg(pid, signal.SIGKILL)  # the command, all it started that stayed in its group
            except (ProcessLookupError, PermissionError):
                pass

    def on_signal(self, signum: int, frame: object) -> None:  # noqa: ARG002
        if os.getpid() != self.pid:
            # A signal the guard had received but not yet handled when it forked (``fork_into`` copies that state
            # as it is): the guard handles it; its child, about to exec a command, must not kill every run.
            return
        if os.getppid() != self.agent:  # the agent is gone: nothing may train past its lease
            self.kill_all()
            os._exit(AGENT_GONE)
        for pid in tuple(self.live):  # a signal sent to the guard alone still reaches the commands
            try:
                os.killpg(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def fence(self, request: dict) -> None:
        """A run's deadline set or moved on (the agent's lease renewal was acknowledged): nothing sent yet under it."""
        pid = request.get("pid")
        if pid in self.live and isinstance(request.get("until"), (int, float)):
            self.fences[pid] = (float(request["until"]), max(0.0, float(request.get("grace") or 0.0)), 0)

    def enforce(self) -> object:
        """Signal every run whose deadline passed (its agent stopped extending it); the poll timeout until the
        next deadline, in milliseconds (None: no deadline pending)."""
        due, wake = fence_due(self.fences, time.monotonic())
        for pid, sig in due:
            until, grace, sent = self.fences[pid]
            self.fences[pid] = (until, grace, sent + 1)
            try:
                os.killpg(pid, sig)
                os.write(2, f"guard: run {pid} fenced ({signal.Signals(sig).name}): its deadline passed without a "
                            f"renewal of its lease\n".encode())
            except OSError:  # gone already, or no stderr to say it on: the fence holds all the same
                pass
            if sig == signal.SIGKILL and pid in self.cgroups:
                try:  # what left the group (its own session) is still in the run's cgroup
                    kill = os.open("cgroup.kill", os.O_WRONLY | os.O_CLOEXEC, dir_fd=self.cgroups[pid])
                    try:
                        os.write(kill, b"1")
                    finally:
                        os.close(kill)
                except OSError:
                    pass
        return None if wake is None else max(1, int(wake * 1000) + 1)

    def forget(self, pid: int) -> None:
        self.fences.pop(pid, None)
        if pid in self.cgroups:
            os.close(self.cgroups.pop(pid))

    def send(self, message: dict) -> None:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the agent is gone: its end of the socket is read next, and everything is killed then

    def receive(self) -> tuple:
        """(request, descriptors) read from the agent, or (None, []) at the end of its socket."""
        # Not socket.recv_fds: it drops its flags (3.11), and the descriptors must not reach another run's exec.
        head, ancillary, _, _ = self.sock.recvmsg(HEADER.size, socket.CMSG_SPACE(MAX_FDS * 4),
                                                  socket.MSG_CMSG_CLOEXEC)
        fds = _descriptors(ancillary)
        while head and len(head) < HEADER.size:
            more = self.sock.recv(HEADER.size - len(head))
            if not more:
                break
            head += more
        if len(head) < HEADER.size:
            for fd in fds:
                os.close(fd)
            return None, []
        (size,) = HEADER.unpack(head)
        if size > MAX_REQUEST:
            raise ValueError(f"request of {size} bytes")
        body = bytearray()
        while len(body) < size:
            chunk = self.sock.recv(min(size - len(body), 1 << 20))
            if not chunk:
                return None, fds
            body += chunk
        return json.loads(body), fds

    def reap(self) -> None:
        while self.live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.live:
                self.live.discard(pid)
                self.forget(pid)
                self.send({"exited": pid, "status": exit_status(os.waitstatus_to_exitcode(status))})

    def spawn(self, request: dict, fds: list) -> None:
        try:
            moves, cgroup = placement(fds, bool(request.get("report")), bool(request.get("cgroup")))
            done_r, done_w = os.pipe()  # both close-on-exec
            pid, born_in = fork_into(fds[cgroup] if cgroup is not None else None)
        except (OSError, ValueError) as exc:
            self.send({"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"})
            return
        if pid == 0:  # never returns; a child born in the run's cgroup has no joining to do
            _child(request, fds, moves, None if born_in else cgroup, self.devnull, os.getppid())
        self.live.add(pid)
        self.fence({"pid": pid, "until": request.get("until"), "grace": request.get("grace")})
        if cgroup is not None and request.get("until") is not None:
            directory = _cgroup_dir(fds[cgroup])
            if directory is not None:
                self.cgroups[pid] = directory
        os.close(done_w)
        try:
            # The reply waits for the exec (or the child's end): the pid the agent signals is then the command's,
            # its own process group, in its cgroup and under its uid; never the guard's fork on its way there.
            while os.read(done_r, 1):
                pass
        finally:
            os.close(done_r)
        self.send({"id": request.get("id"), "pid": pid})

    def serve(self) -> int:
        signal.set_wakeup_fd(self.wake_w)  # a SIGCHLD wakes the poll below
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for sig in SIGNALS:
            signal.signal(sig, self.on_signal)
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        poll.register(self.wake_r, select.POLLIN)
        try:
            return self._loop(poll)
        except BaseException:
            self.kill_all()  # a guard that fails takes its commands' groups with it, never leaves them unguarded
            raise

    def _loop(self, poll: select.poll) -> int:
        while True:
            self.reap()
            for fd, _ in poll.poll(self.enforce()):
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                    continue
                request, fds = self.receive()
                if request is None:  # the agent closed its end or died: nothing it started may run on
                    self.kill_all()
                    return 0
                try:
                    if request.get("op") == "extend":
                        self.fence(request)
                    else:
                        self.spawn(request, fds)
                finally:
                    for received in fds:
                        os.close(received)


# A child born in its run's cgroup: clone3 with CLONE_INTO_CGROUP (Linux 5.7+). Joining after a fork, by a write to
# cgroup.procs, migrates the process, and a migration waits for an RCU grace period under the kernel's cgroup
# thread-group lock unless another migration has just done so: measured here, 8-13 ms of every run's start when
# runs start about 70 ms apart (0.4 ms back to back), most of an executor's grant -> process time.
CLONE_INTO_CGROUP = 0x200000000
SYS_CLONE3 = 435  # the same number on every architecture (the generic system call table)
_CLONE3: list = []  # the clone3 call once looked up; [None] where libc or the kernel cannot


def fork_into(procs_fd):
    """``os.fork()``, the child born in the cgroup whose ``cgroup.procs`` is ``procs_fd`` where the kernel allows:
    (pid, True); else a plain fork, (pid, False), and the child joins through ``procs_fd`` itself. 0 in the child,
    as ``os.fork``. The guard is one thread, so a child made by clone3 without Python's fork hooks is in the same
    state as one made by ``os.fork``: it only sets its descriptors, session, uid and signals, then execs."""
    clone = _clone3() if procs_fd is not None else None
    dir_fd = _cgroup_dir(procs_fd) if clone is not None else None
    if dir_fd is None:
        return os.fork(), False
    try:
        pid, error = clone(dir_fd)
    finally:
        os.close(dir_fd)  # in the child too (it is close-on-exec anyway)
    if pid >= 0:
        return pid, True
    import errno

    if error in (errno.ENOSYS, errno.EPERM):  # no clone3 here (an older kernel, a seccomp filter): fork from now on
        _CLONE3[:] = [None]
    return os.fork(), False  # and any other refusal (a cgroup this kernel will not start a process in) alike


def _clone3():
    """``clone(dir_fd) -> (pid, errno)``: clone3 into the cgroup directory ``dir_fd``; None where libc has no
    ``syscall``. Called through ``ctypes.PyDLL``, which keeps the GIL held across the call as ``os.fork`` does."""
    if not _CLONE3:
        try:
            import ctypes

            syscall = ctypes.PyDLL(None, use_errno=True).syscall
        except (OSError, AttributeError, ImportError):
            _CLONE3.append(None)
            return None
        syscall.restype = ctypes.c_long
        syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]

        class CloneArgs(ctypes.Structure):  # struct clone_args, as far as CLONE_INTO_CGROUP (its 88-byte version)
            _fields_ = [(name, ctypes.c_uint64) for name in (
                "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls", "set_tid",
                "set_tid_size", "cgroup")]

        def clone(dir_fd: int) -> tuple:
            args = CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=dir_fd)
            pid = syscall(SYS_CLONE3, ctypes.addressof(args), ctypes.sizeof(args))
            return pid, (ctypes.get_errno() if pid < 0 else 0)
        _CLONE3.append(clone)
    return _CLONE3[0]


def _cgroup_dir(procs_fd: int):
    """The directory of the cgroup whose ``cgroup.procs`` is ``procs_fd``, opened; None unless it is certainly that
    one (the directory's ``cgroup.procs`` is the very file of ``procs_fd``)."""
    try:
        path = os.readlink(f"/proc/self/fd/{procs_fd}")
        if os.path.basename(path) != "cgroup.procs":
            return None
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        found, given = os.stat("cgroup.procs", dir_fd=dir_fd, follow_symlinks=False), os.fstat(procs_fd)
        if (found.st_dev, found.st_ino) == (given.st_dev, given.st_ino):
            return dir_fd
    except OSError:
        pass
    os.close(dir_fd)
    return None


def _descriptors(ancillary: list) -> list:
    """The descriptors of SCM_RIGHTS messages, in the order sent."""
    import array

    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def _child(request: dict, fds: list, moves: tuple, cgroup, devnull: int, guard: int) -> None:
    """In the forked child: what the command's process needs before exec, then exec (never returns)."""
    argv = request["argv"]
    code = CANNOT_START
    try:
        signal.set_wakeup_fd(-1)
        for sig in (*SIGNALS, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # not the guard's handlers; Python ignores SIGPIPE, a command not
        high = [fd if fd > REPORT_FD else _above(fd) for fd in fds]  # no source is overwritten by a move below
        os.dup2(devnull, 0)
        for target, index in moves:
            os.dup2(high[index], target)  # inheritable: the command keeps these
        os.setsid()
        if cgroup is not None:
            code = CANNOT_JOIN
            os.write(high[cgroup], b"0")  # into the run's cgroup before the command can fork (closed at exec)
            code = CANNOT_START
        if request.get("umask", -1) >= 0:
            os.umask(request["umask"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        if request.get("uid") is not None:
            os.setgroups([])
            os.setgid(request["gid"] if request.get("gid") is not None else request["uid"])
            os.setuid(request["uid"])
        _ask_for_signal_on_parent_death(signal.SIGKILL)  # after the uid change, which clears it
        if os.getppid() != guard:  # the guard died before the request took effect
            os._exit(AGENT_GONE)
        if request.get("confine"):  # limits, no_new_privs, the seccomp filter (confine.py): they bind the exec
            if _confinement is None:
                raise OSError(f"the guard cannot confine commands: {_confine_error}")
            _confinement.apply(request.get("rlimits") or ())
        env = dict(request["env"])
        if request.get("report"):
            env["TETO_REPORT_FD"] = str(REPORT_FD)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 - whatever it was, the run's stderr says it and the status tells
        what = "cannot join the run's cgroup" if code == CANNOT_JOIN else f"cannot start {argv[0]!r}"
        try:
            os.write(2, f"guard: {what}: {exc}\n".encode(errors="replace"))
        finally:
            os._exit(code)


def _above(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, REPORT_FD + 1)


_prctl = None


def _ask_for_signal_on_parent_death(signum: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, signum)`` (the libc function looked up once, in the guard, before any fork)."""
    global _prctl
    try:
        if _prctl is None:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        _prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


_confinement = None  # confine.Confinement, prepared once at start (the children only make system calls)
_confine_error = None


def _prepare_confinement() -> None:
    """Import confine.py beside this file (the guard runs as ``python -I -S``: no package, no path of its own) and
    prepare the filter. A guard that cannot refuses every command asking for it: never one run unconfined."""
    global _confinement, _confine_error
    try:
        try:
            from . import confine  # imported as agents.executor.guard (tests)
        except ImportError:
            sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # last: never shadows the stdlib
            import confine
        _confinement = confine.Confinement()
    except Exception as exc:  # noqa: BLE001 - said on every command that needed it
        _confine_error = f"{type(exc).__name__}: {exc}"


def main(argv: list) -> int:
    _prepare_confinement()
    try:
        agent, sock_fd = parse(argv)
    except ValueError as exc:
        print(f"guard: {exc}", file=sys.stderr)
        return 2
    _ask_for_signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != agent:  # the agent died before the request took effect
        return AGENT_GONE
    sock = socket.socket(fileno=sock_fd)
    sock.set_inheritable(False)
    return Guard(agent, sock).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
