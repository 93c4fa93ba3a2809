"""The guard between an executor agent and a user's ``command`` workload.

The kernel's parent-death signal reaches only the agent's direct child. A user's command often is a shell or a
launcher whose own children train (``sh -c "python train.py"``); if the agent is SIGKILLed those grandchildren
would keep training and writing checkpoints past the lease. The guard is that direct child: it asks the kernel
for SIGTERM when the agent dies, runs the command in its own process group, and on the agent's death kills that
whole group at once. Every other signal is forwarded to the group, and the command's exit status is passed
through unchanged (128 + N for a command killed by signal N, as a shell reports it).

Usage (by the agent): ``python -I -S .../agents/executor/guard.py -- argv...`` (``-m agents.executor.guard``
works too). It starts once per run, so it imports as little as it can: no site, no package, no ``subprocess``
(``posix_spawn`` and ``waitpid``), libc's ``prctl`` from the interpreter's own symbols: about 25 ms of CPU a
run less than the site-enabled ``-m`` start with ``subprocess`` and ``ctypes.util``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("guard: no command given", file=sys.stderr)
        return 2
    agent = os.getppid()
    _ask_for_sigterm_on_parent_death()
    if os.getppid() != agent:  # the agent died before the request took effect
        return 137
    try:
        # Same process group as the guard: the agent stops a run by signalling the whole group. Inheritable
        # descriptors (the report pipe, TETO_REPORT_FD) pass through, as the agent passed them to the guard.
        child = os.posix_spawnp(argv[0], argv, os.environ)
    except OSError as exc:
        print(f"guard: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127

    def on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
        if os.getppid() != agent:
            # The agent is gone: nothing may train past its lease. Kill the group: the command, all it
            # started, and the guard itself.
            os.killpg(0, signal.SIGKILL)
        try:
            os.kill(child, signum)  # a signal sent to the guard alone still reaches the command
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    while True:
        try:
            _, status = os.waitpid(child, 0)  # retried after a handled signal (PEP 475)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        return _exit_status(os.waitstatus_to_exitcode(status))


def _ask_for_sigterm_on_parent_death() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the interpreter's own libc symbols: no library lookup
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
