"""The guard between an executor agent and a user's ``command`` workload.

The kernel's parent-death signal reaches only the agent's direct child. A user's command often is a shell or a
launcher whose own children train (``sh -c "python train.py"``); if the agent is SIGKILLed those grandchildren
would keep training and writing checkpoints past the lease. The guard is that direct child: it asks the kernel
for SIGTERM when the agent dies, runs the command in its own process group, and on the agent's death kills that
whole group at once. Every other signal is forwarded to the group, and the command's exit status is passed
through unchanged (128 + N for a command killed by signal N, as a shell reports it).

Usage (by the agent): ``python -I -S .../agents/executor/guard.py [--parent PID] [--cgroup-fd FD] -- argv...``
(``-m agents.executor.guard`` works too). With ``--parent`` the agent starts the guard without a ``preexec_fn``
(so with ``vfork``, not a ``fork`` that copies the agent's page tables: about 8 ms of CPU a run less), and the
guard does what the preexec did before it runs anything: it joins the run's cgroup through the agent's open
``cgroup.procs`` (``--cgroup-fd``, closed before the command starts), and refuses to start the command when its
parent is no longer that agent (the agent died before the parent-death signal was asked for). A run that
changes uid keeps the preexec: the guard never runs as root with the run's environment. It starts once per run, so it imports only what the interpreter has built in or loads anyway: no
site, no package, no ``os`` (``posix``), no ``signal`` (``_signal``: ``signal`` imports ``enum``, ``functools``
and ``collections``), no ``ctypes`` (``prctl`` through ``_ctypes``: ``ctypes`` defines its whole type system at
import), no ``subprocess`` (``posix_spawnp`` and ``waitpid``). Each of those cost several milliseconds of CPU a
run; ``tests/integration/test_guard.py`` checks that none comes back.
"""

import _signal
import posix
import sys

PR_SET_PDEATHSIG = 1
AGENT_GONE = 137  # as if killed by SIGKILL with the agent, which it would have been
CANNOT_JOIN = 126
SIGNALS = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)  # forwarded to the command (the agent's stop)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def parse(argv: list) -> tuple:
    """(parent pid or None, cgroup.procs fd or None, the command) of the guard's arguments; ValueError when they
    are not ``[--parent PID] [--cgroup-fd FD] [--] command...``."""
    options = {"--parent": None, "--cgroup-fd": None}
    while argv and argv[0] in options:
        if len(argv) < 2 or not argv[1].isdigit():
            raise ValueError(f"{argv[0]} needs a number")
        options[argv[0]] = int(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise ValueError("no command given")
    return options["--parent"], options["--cgroup-fd"], argv


def main(argv: list) -> int:
    try:
        parent, cgroup_fd, argv = parse(argv)
    except ValueError as exc:
        print(f"guard: {exc}", file=sys.stderr)
        return 2
    agent = posix.getppid() if parent is None else parent
    _ask_for_sigterm_on_parent_death()
    if posix.getppid() != agent:  # the agent died before the request took effect
        return AGENT_GONE
    if cgroup_fd is not None:
        try:
            posix.write(cgroup_fd, b"0")  # into the run's cgroup before the command can fork
            posix.close(cgroup_fd)  # the command must not move processes
        except OSError as exc:
            print(f"guard: cannot join the run's cgroup: {exc}", file=sys.stderr)
            return CANNOT_JOIN
    try:
        # Same process group as the guard: the agent stops a run by signalling the whole group. Inheritable
        # descriptors (the report pipe, TETO_REPORT_FD) pass through, as the agent passed them to the guard.
        child = posix.posix_spawnp(argv[0], argv, posix.environ)
    except OSError as exc:
        print(f"guard: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127

    def on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
        if posix.getppid() != agent:
            # The agent is gone: nothing may train past its lease. Kill the group: the command, all it
            # started, and the guard itself.
            posix.killpg(0, _signal.SIGKILL)
        try:
            posix.kill(child, signum)  # a signal sent to the guard alone still reaches the command
        except ProcessLookupError:
            pass

    for sig in SIGNALS:
        _signal.signal(sig, on_signal)
    while True:
        try:
            _, status = posix.waitpid(child, 0)  # retried after a handled signal (PEP 475)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        return _exit_status(posix.waitstatus_to_exitcode(status))


def _ask_for_sigterm_on_parent_death() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGTERM)`` through ``_ctypes``, what ``ctypes.CDLL(None).prctl(...)`` does
    underneath: the interpreter's own libc symbols (no library lookup), an ``int`` result."""
    try:
        import _ctypes

        class Int(_ctypes._SimpleCData):
            _type_ = "i"

        class Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = Int

        class Process:  # what CFuncPtr reads a symbol's library from
            _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)

        Function(("prctl", Process))(PR_SET_PDEATHSIG, _signal.SIGTERM, 0, 0, 0)
    except (ImportError, OSError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
