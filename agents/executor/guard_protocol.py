"""What the agent and its guard say to each other, and the guard's pure rules (stdlib only, like guard.py, which runs
as ``python -I -S``): a request is a 4-byte length then JSON; the exit status a command reports; the guard's
options; where the descriptors it receives go; which fence signals are due. guard_client.py writes the requests,
guard.py serves them, guard_child.py is the forked child that becomes the command.
"""

import signal
import struct

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
