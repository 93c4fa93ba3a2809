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
A run's exit message says whether the guard signalled it (``"fenced": true``), even when an extension the agent
sent late moved its deadline on after the signal: the agent then reads the run as abandoned, not as a failure.

Here is the guard's loop; what it reads and its pure rules are in guard_protocol.py, the forked child on its way to
the command in guard_child.py (both imported beside this file: no package when run as ``python -I -S``).

Usage (by the agent): ``python -I -S .../agents/executor/guard.py --parent PID --socket FD``.
"""

import json
import os
import select
import signal
import socket
import sys
import time

try:  # imported as agents.executor.guard (the agent's tests)
    from . import guard_child, guard_protocol
except ImportError:  # run as a file with -I -S: no package, no path of its own
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # last: never shadows the stdlib
    import guard_child
    import guard_protocol


class Guard:
    """The guard's state: the commands alive (pid == process group) and its channel to the agent."""

    def __init__(self, agent: int, sock: socket.socket) -> None:
        self.pid = os.getpid()  # a child between its fork and its exec is not the guard (``on_signal``)
        self.agent = agent
        self.sock = sock
        self.live: set = set()
        self.fences: dict = {}  # pid -> (until, grace, signals sent): ``fence_due``
        self.fenced: set = set()  # runs this guard has signalled, whatever deadline came after: told at their exit
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
            os._exit(guard_protocol.AGENT_GONE)
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
        due, wake = guard_protocol.fence_due(self.fences, time.monotonic())
        for pid, sig in due:
            until, grace, sent = self.fences[pid]
            self.fences[pid] = (until, grace, sent + 1)
            self.fenced.add(pid)
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
        self.fenced.discard(pid)
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
        head, ancillary, _, _ = self.sock.recvmsg(
            guard_protocol.HEADER.size, socket.CMSG_SPACE(guard_protocol.MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC)
        fds = _descriptors(ancillary)
        while head and len(head) < guard_protocol.HEADER.size:
            more = self.sock.recv(guard_protocol.HEADER.size - len(head))
            if not more:
                break
            head += more
        if len(head) < guard_protocol.HEADER.size:
            for fd in fds:
                os.close(fd)
            return None, []
        (size,) = guard_protocol.HEADER.unpack(head)
        if size > guard_protocol.MAX_REQUEST:
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
                # Whether the guard ended it: only the guard knows (an extension the agent sent after the signal
                # moves the deadline on, not what was already sent).
                fenced = pid in self.fenced
                self.forget(pid)
                self.send({"exited": pid, "status": guard_protocol.exit_status(os.waitstatus_to_exitcode(status)),
                           "fenced": fenced})

    def spawn(self, request: dict, fds: list) -> None:
        try:
            moves, cgroup = guard_protocol.placement(fds, bool(request.get("report")), bool(request.get("cgroup")))
            done_r, done_w = os.pipe()  # both close-on-exec
            pid, born_in = guard_child.fork_into(fds[cgroup] if cgroup is not None else None)
        except (OSError, ValueError) as exc:
            self.send({"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"})
            return
        if pid == 0:  # never returns; a child born in the run's cgroup has no joining to do
            guard_child.exec_command(request, fds, moves, None if born_in else cgroup, self.devnull, os.getppid())
        self.live.add(pid)
        self.fence({"pid": pid, "until": request.get("until"), "grace": request.get("grace")})
        if cgroup is not None and request.get("until") is not None:
            directory = guard_child.cgroup_dir(fds[cgroup])
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
        for sig in guard_protocol.SIGNALS:
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


def _descriptors(ancillary: list) -> list:
    """The descriptors of SCM_RIGHTS messages, in the order sent."""
    import array

    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def main(argv: list) -> int:
    guard_child.prepare_confinement()
    try:
        agent, sock_fd = guard_protocol.parse(argv)
    except ValueError as exc:
        print(f"guard: {exc}", file=sys.stderr)
        return 2
    guard_child.ask_for_signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != agent:  # the agent died before the request took effect
        return guard_protocol.AGENT_GONE
    sock = socket.socket(fileno=sock_fd)
    sock.set_inheritable(False)
    return Guard(agent, sock).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
