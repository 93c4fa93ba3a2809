"""A stop may reach a training process as SIGTERM more than once (the agent signals the process group, and a
signal sent to the guard is forwarded to it too): a handler run interrupted by the next SIGTERM must never block, or the process
sits out the whole grace and is killed there (an overshoot of the grace past a GPU ceiling; seen as "process
ignored SIGTERM for 10.0s" with the process stuck in the handler inside the handler)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# Runs the handler with the next SIGTERM arriving between every two lines of it (and of whatever it calls), as
# a signal may: a nested run of the handler at each point. Python runs signal handlers in the main thread; here
# a thread is enough to see whether one ever blocks (the process exits whatever the thread does).
SCRIPT = """
import signal, sys, threading
from agents.executor import sdk, sdk_link

def tracer(frame, event, arg):
    if event == "line":
        sdk_link.on_sigterm(signal.SIGTERM, None)  # the tracer itself is never traced: one level of nesting
    return tracer

def first():
    sys.settrace(tracer)
    try:
        sdk_link.on_sigterm(signal.SIGTERM, None)
    finally:
        sys.settrace(None)

t = threading.Thread(target=first, daemon=True)
t.start()
t.join(3)
print("blocked" if t.is_alive() else ("stopped" if sdk.stop_requested() else "not stopped"), flush=True)
"""


def test_a_sigterm_handler_interrupted_by_the_next_sigterm_never_blocks():
    env = dict(os.environ, TETO_JOB_ID="j1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "stopped", (out.stdout, out.stderr[-2000:])
