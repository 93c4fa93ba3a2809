"""The guard between an executor agent and a user's ``command`` workload.

The kernel's parent-death signal reaches only the agent's direct child. A user's command often is a shell or a
launcher whose own children train (``sh -c "python train.py"``); if the agent is SIGKILLed those grandchildren
would keep training and writing checkpoints past the lease. The guard is that direct child: it asks the kernel
for SIGTERM when the agent dies, runs the command in its own process group, and on the agent's death kills that
whole group at once. Every other signal is forwarded to the group, and the command's exit status is passed
through unchanged (128 + N for a command killed by signal N, as a shell reports it).

Usage (by the agent): ``python -m agents.executor.guard -- argv...``
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
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
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != agent:  # the agent died before the request took effect
        return 137
    report_fd = int(os.environ.get("TETO_REPORT_FD", "-1"))
    try:
        # Same process group as the guard: the agent stops a run by signalling the whole group.
        child = subprocess.Popen(argv, pass_fds=(report_fd,) if report_fd >= 0 else ())
    except OSError as exc:
        print(f"guard: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127

    def on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
        if os.getppid() != agent:
            # The agent is gone: nothing may train past its lease. Kill the group: the command, all it
            # started, and the guard itself.
            os.killpg(0, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)  # a signal sent to the guard alone still reaches the command

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    while True:
        try:
            return _exit_status(child.wait())
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
