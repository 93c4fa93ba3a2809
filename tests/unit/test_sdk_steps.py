"""Step reports held back in the training process (agents/executor/sdk_steps.py): the first, the last and the
first after an interval are written at once; the rest are held, the latest replacing the one before, and stand
with their mean step time when written; the agent weighs such a line by the steps it stands for."""

from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.executor.reports import Reports
from agents.executor.sdk_steps import EVERY, Held, due, hold, take
from libs.contracts.telemetry import Phase, StepReport

pytestmark = pytest.mark.unit


def step(n: int, seconds: float | None = 0.01, total: int | None = 100) -> dict:
    return {"type": "step", "step": n, "total_steps": total, "loss": 1.0, "step_seconds": seconds, "metrics": {}}


def test_the_first_step_is_written_at_once_as_it_is():
    held = Held()
    assert hold(held, step(1, None), now=10.0) == step(1, None)
    assert held.record is None and held.written_at == 10.0


def test_steps_within_the_interval_are_held_and_the_latest_stands_for_them():
    held = Held()
    hold(held, step(1, None), now=10.0)
    for n in range(2, 6):
        assert hold(held, step(n, 0.01 * n), now=10.0 + 0.01 * n) is None
    assert held.record["step"] == 5 and not due(held, 10.0 + EVERY / 2)
    assert due(held, 10.0 + EVERY)
    out = take(held, now=10.3)
    assert out["step"] == 5 and out["step_seconds"] == pytest.approx((0.02 + 0.03 + 0.04 + 0.05) / 4)
    assert out["step_seconds_n"] == 4 and held.record is None and take(held, 10.4) is None


def test_a_step_after_the_interval_is_written_at_once_with_those_held_before_it():
    held = Held()
    hold(held, step(1), now=0.0)
    assert hold(held, step(2, 0.1), now=0.1) is None
    out = hold(held, step(3, 0.3), now=0.1 + EVERY)
    assert out["step"] == 3 and out["step_seconds"] == pytest.approx(0.2) and out["step_seconds_n"] == 2


def test_the_last_step_is_never_held():
    held = Held()
    hold(held, step(1, total=3), now=0.0)
    assert hold(held, step(2, total=3), now=0.01) is None
    assert hold(held, step(3, total=3), now=0.02)["step"] == 3
    assert hold(held, step(4, total=None), now=0.03) is None  # no total: nothing is "the last"


def test_a_line_for_one_timed_step_is_the_record_unchanged():
    held = Held(written_at=0.0)
    assert hold(held, step(7, 0.5), now=1.0) == step(7, 0.5)  # no step_seconds_n: the agent counts it once


@given(st.lists(st.floats(min_value=0, max_value=10), min_size=1, max_size=40),
       st.floats(min_value=0.001, max_value=0.5))
def test_the_written_lines_keep_the_sum_and_count_of_every_step_time(times, gap):
    held, now, written = Held(), 0.0, []
    for i, seconds in enumerate(times, start=1):
        now += gap
        out = hold(held, step(i, seconds, total=None), now)
        if out is not None:
            written.append(out)
    if (rest := take(held, now + 1)) is not None:
        written.append(rest)
    assert written[-1]["step"] == len(times)
    assert sum(w.get("step_seconds_n", 1) for w in written) == len(times)
    assert sum(w["step_seconds"] * w.get("step_seconds_n", 1) for w in written) == pytest.approx(sum(times))


def test_the_agent_weighs_a_line_by_the_steps_it_stands_for():
    sent: list[dict] = []
    reports = Reports(lambda run, cls, **fields: sent.append(fields) if cls is StepReport else None, 0.0)
    grant = types.SimpleNamespace(rank=0, job_id="j1", world_size=1)
    run = types.SimpleNamespace(grant=grant, phase=Phase.TRAINING, step=None, pending_step=None,
                                last_step_sent_at=None, step_seconds_sum=0.0, step_seconds_n=0)
    reports.progress_interval_seconds = 3600  # hold both lines in the agent's throttle too
    run.last_step_sent_at = float("inf")
    reports.on_report(run, {**step(4, 0.1), "step_seconds_n": 3})  # three steps of 0.1 s
    reports.on_report(run, step(5, 0.5))  # one of 0.5 s
    for bad in (0, -2, True, "3", 2**60):  # a count the agent cannot trust counts once
        reports.on_report(run, {**step(6, 0.5), "step_seconds_n": bad})
    reports.flush_step(run)
    assert sent[-1]["step"] == 6 and sent[-1]["step_seconds"] == pytest.approx((0.3 + 0.5 + 5 * 0.5) / 9)


def test_a_forked_child_starts_afresh_with_a_free_lock_and_nothing_held():
    import os

    from agents.executor import sdk_link

    sdk_link.held_step.record, sdk_link.held_step.seconds_n = step(3), 1
    sdk_link.lock.acquire()  # as if the timer thread held it when the process forked
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if it can take the lock and holds nothing
            ok = sdk_link.lock.acquire(timeout=2) and sdk_link.held_step.record is None and sdk_link.state["timer"] is False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        sdk_link.lock.release()
        sdk_link.held_step.record, sdk_link.held_step.seconds_n = None, 0
