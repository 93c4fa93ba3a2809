"""The training process's link to its agent (the SDK's shared state: sdk.py and sdk_gang.py stand on it): the stop
the agent signals (SIGTERM sets a flag), the ``TETO_*`` context, the report pipe (``TETO_REPORT_FD``) that every
report is one JSON line on, step reports held back to at most 4 lines a second (``sdk_steps.py``), and the
background checkpoint writer a process finishes before it exits. A broken pipe means the agent is gone: the
process exits at once with ``EXIT_AGENT_GONE``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

from . import sdk_context, sdk_steps, sdk_trace
from .ckpt_async import BackgroundWriter
from .sdk_context import Context

EXIT_AGENT_GONE = 75  # EX_TEMPFAIL: the report pipe broke, the agent is gone
EXIT_PEER_LOST = 76  # a gang worker whose group could not form or lost a peer: not a training error
EXIT_STOPPED = 143  # 128 + SIGTERM, the conventional status of a process ended by SIGTERM

lock = threading.Lock()
# Set from the SIGTERM handler: a plain flag, never a threading.Event. A stop may be signalled twice (a signal to
# the guard, which forwards it, on top of the agent's), and a handler run that interrupts the first
# inside Event.set() would block forever on the Event's own lock, leaving the process to be killed at the grace.
stop = {"set": False}
state: dict[str, Any] = {"installed": False, "polled": False, "last_step_at": None, "fd": None}
writer = BackgroundWriter()
held_step = sdk_steps.Held()  # the step report held back (sdk_steps.py), written under lock


def context() -> Context:
    """Where this process stands, read from the ``TETO_*`` environment the agent started it with."""
    install()
    return sdk_context.from_environ(os.environ)


def on_sigterm(signum: int, frame: Any) -> None:
    stop["set"] = True


def install() -> None:
    """Catch SIGTERM (once, from the main thread) so a stop can end the step cleanly instead of mid-write."""
    if state["installed"]:
        return
    state["installed"] = True
    sdk_trace.start()
    if threading.current_thread() is threading.main_thread() and os.environ.get("TETO_JOB_ID"):
        signal.signal(signal.SIGTERM, on_sigterm)


def report_fd() -> int | None:
    if state["fd"] is None:
        state["fd"] = sdk_context.env_int(os.environ, "TETO_REPORT_FD", -1)
    fd = state["fd"]
    return fd if fd is not None and fd >= 0 else None


def send(record: dict[str, Any]) -> None:
    sdk_trace.start()  # the job's trace goes on in this process (sdk_trace.py)
    if record.get("type") == "checkpoint":
        sdk_trace.event("checkpoint", step=record.get("step"))
    fd = report_fd()
    if fd is None:
        return
    with lock:
        if record.get("type") == "step":
            held = sdk_steps.hold(held_step, record, time.monotonic())
            if held is None:
                start_step_timer()
                return
            write_line(fd, held)
        else:
            held = sdk_steps.take(held_step, time.monotonic())  # the step a checkpoint covers goes first
            if held is not None:
                write_line(fd, held)
            write_line(fd, record)


def write_line(fd: int, record: dict[str, Any]) -> None:
    """One JSON line on the report pipe; call with lock held."""
    if state["fd"] == -1:
        return
    data = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        # The agent is gone, and with it the lease: stop now, without writing anything else.
        os._exit(EXIT_AGENT_GONE)
    except OSError:
        state["fd"] = -1  # not a pipe we can use: keep training without progress reports


def flush_steps() -> None:
    """Write the held step report, if any (the timer when its interval ends; at exit)."""
    fd = report_fd()
    if fd is None:
        return
    with lock:
        held = sdk_steps.take(held_step, time.monotonic())
        if held is not None:
            write_line(fd, held)


def step_timer() -> None:
    while True:
        time.sleep(sdk_steps.EVERY / 2)
        if sdk_steps.due(held_step, time.monotonic()):
            flush_steps()


def after_fork_in_child() -> None:
    """A forked child (a data loader worker) has no timer thread, and the lock may have been held by it: start
    afresh, holding nothing."""
    global lock
    lock = threading.Lock()
    state["timer"] = False
    held_step.record, held_step.seconds_sum, held_step.seconds_n, held_step.written_at = None, 0.0, 0, None


os.register_at_fork(after_in_child=after_fork_in_child)


def start_step_timer() -> None:
    """The daemon thread that writes a held step when its interval ends (once per process); and the last held
    step at exit."""
    if state.get("timer"):
        return
    state["timer"] = True
    import atexit

    atexit.register(flush_steps)
    threading.Thread(target=step_timer, name="teto-sdk-steps", daemon=True).start()


def flush_at_exit() -> None:
    try:
        writer.wait()
    except RuntimeError as exc:
        import sys

        print(exc, file=sys.stderr, flush=True)
