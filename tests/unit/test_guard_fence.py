"""The run guard's own fence (guard_protocol.py ``fence_due``): past a run's deadline SIGTERM, past the grace after it
SIGKILL, each once, and the time until the next one is due; a deadline moved on starts over."""

from __future__ import annotations

import signal

import pytest

from agents.executor.guard_protocol import fence_due
from agents.executor.guard_client import Fence, extension, request

TERM, KILL = signal.SIGTERM, signal.SIGKILL


@pytest.mark.parametrize(("now", "sent", "due", "wake"), [
    (5.0, 0, [], 5.0),  # before the deadline: nothing, look again at it
    (10.0, 0, [(7, TERM)], 2.0),  # at the deadline: SIGTERM, look again when the grace ends
    (11.0, 1, [], 1.0),  # SIGTERM sent: only the SIGKILL is pending
    (12.0, 1, [(7, KILL)], None),  # the grace is over
    (30.0, 0, [(7, TERM), (7, KILL)], None),  # a guard that woke late sends both at once
    (30.0, 2, [], None),  # all sent: nothing more, ever
], ids=["before", "deadline", "in-grace", "grace-over", "late-wake", "done"])
def test_a_run_past_its_deadline_is_sent_sigterm_then_sigkill_once_each(now, sent, due, wake):
    got_due, got_wake = fence_due({7: (10.0, 2.0, sent)}, now)
    assert got_due == due
    assert got_wake == (None if wake is None else pytest.approx(wake))


def test_the_nearest_deadline_of_several_runs_sets_the_wake_and_a_run_without_one_is_not_fenced():
    due, wake = fence_due({1: (100.0, 5.0, 0), 2: (20.0, 5.0, 0)}, 10.0)
    assert (due, wake) == ([], pytest.approx(10.0))
    assert fence_due({}, 10.0) == ([], None)


def test_a_deadline_moved_on_before_it_passed_signals_nothing():
    # What the guard holds after an ``extend``: the new deadline, nothing sent under it yet.
    assert fence_due({7: (40.0, 2.0, 0)}, 12.0) == ([], pytest.approx(28.0))


def test_a_spawn_and_an_extension_carry_the_deadline_the_guard_reads():
    import json

    fence = Fence(until=123.5, grace=2.0)
    body = json.loads(request(["x"], {}, cwd=None, umask=-1, uid=None, gid=None, cgroup=False, rid=1,
                              fence=fence)[4:])
    assert (body["until"], body["grace"]) == (123.5, 2.0)
    assert json.loads(extension(42, fence)[4:]) == {"op": "extend", "pid": 42, "until": 123.5, "grace": 2.0}
    unfenced = json.loads(request(["x"], {}, cwd=None, umask=-1, uid=None, gid=None, cgroup=False, rid=1)[4:])
    assert "until" not in unfenced
