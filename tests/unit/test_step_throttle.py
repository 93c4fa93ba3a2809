"""The executor's step throttle: at most one step report per progress interval, and the latest step always goes
out when the interval ends, even when the script reports nothing more (agents/executor/reports.py)."""

from __future__ import annotations

import types

from agents.executor.reports import Reports
from libs.contracts.telemetry import Phase, StepReport
from tests.support.services import eventually


def _run() -> types.SimpleNamespace:
    grant = types.SimpleNamespace(rank=0, job_id="j1", world_size=1)
    return types.SimpleNamespace(grant=grant, phase=Phase.TRAINING, step=None, pending_step=None,
                                 last_step_sent_at=None, step_seconds_sum=0.0, step_seconds_n=0)


def _reports(interval: float) -> tuple[Reports, list[int]]:
    sent: list[int] = []

    def send(run, cls, **fields):
        assert cls is StepReport
        sent.append(fields["step"])

    return Reports(send, interval), sent


async def test_steps_reported_at_once_then_a_hang_send_the_latest_step_when_the_interval_ends():
    reports, sent = _reports(0.3)
    run = _run()
    for step in range(1, 11):  # steps 1-10 within one interval, then nothing (the script hangs)
        reports.on_report(run, {"type": "step", "step": step, "total_steps": 100, "step_seconds": 0.01})
    assert sent == [1]  # the throttle holds 2-10 back...
    await eventually(lambda: sent == [1, 10], timeout=10, what="step 10 sent when its interval ended")
    assert run.pending_step is None  # ...and sends only the latest, once


async def test_a_step_sent_by_a_later_report_disarms_the_timer():
    reports, sent = _reports(0.2)
    run = _run()
    reports.on_report(run, {"type": "step", "step": 1})
    reports.on_report(run, {"type": "step", "step": 2})  # held back, timer armed
    reports.flush_step(run)  # a checkpoint or the run's end sends it first
    assert sent == [1, 2] and not reports._due
    reports.on_report(run, {"type": "step", "step": 3})  # held back by the interval flush_step restarted
    await eventually(lambda: sent == [1, 2, 3], timeout=10, what="step 3 sent by its own timer")
    assert not reports._due


async def test_many_held_steps_arm_one_timer_per_run():
    reports, sent = _reports(0.2)
    first, second = _run(), _run()
    for step in range(1, 6):
        reports.on_report(first, {"type": "step", "step": step})
        reports.on_report(second, {"type": "step", "step": step * 10})
    assert len(reports._due) == 2
    await eventually(lambda: sorted(sent) == [1, 5, 10, 50], timeout=10, what="each run's latest step")
