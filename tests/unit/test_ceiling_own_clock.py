"""Item 8, the ceiling to the second: the executor's own rule ("stop now?"), its watch, what the queue puts in a
grant (the GPU-seconds left) and what it makes of a run the executor stopped at the ceiling by itself."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from agents.executor.ceiling import CEILING_STOP, seconds_left, stop_now, watch
from libs.contracts.agents import RunJob
from libs.contracts.jobs import JobEventKind, JobState
from libs.contracts.telemetry import RunFinished, RunOutcome
from services.queue.domain import lifecycle as lc
from services.queue.effects import messages_for
from services.queue.remaining import needs_asking, remaining_seconds
from services.queue.runs import fact_of
from services.queue.settings import QueueSettings
from tests.support.builders import T0, job

pytestmark = pytest.mark.unit


# -- the rule -------------------------------------------------------------------------------------------------

def test_unknown_remaining_never_stops():
    assert seconds_left(1, 1e9, None) is None
    assert not stop_now(8, 1e9, None)


@pytest.mark.parametrize(("devices", "elapsed", "remaining", "world", "expected"), [
    (1, 39.9, 40.0, 1, False),
    (1, 40.0, 40.0, 1, True),
    (2, 19.9, 40.0, 1, False),  # two devices spend it twice as fast
    (2, 20.0, 40.0, 1, True),
    (1, 19.9, 40.0, 2, False),  # a gang worker's share of what is left
    (1, 20.0, 40.0, 2, True),
    (4, 0.0, 0.0, 1, True),  # nothing left: stop at once
    (0, 39.9, 40.0, 1, False),  # a CPU-only worker counts as one device
    (0, 40.0, 40.0, 1, True),
])
def test_stop_now_charges_devices_times_elapsed_against_the_share(devices, elapsed, remaining, world, expected):
    assert stop_now(devices, elapsed, remaining, world) is expected


def test_seconds_left_is_the_wall_time_to_the_share():
    assert seconds_left(2, 5.0, 40.0) == pytest.approx(15.0)
    assert seconds_left(2, 50.0, 40.0) == 0.0


async def test_the_watch_fires_once_when_the_share_is_spent_by_its_clock(monkeypatch):
    now = [100.0]
    fired: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds: float) -> None:
        now[0] += seconds / 2  # wakes early: the watch must read the clock again, never stop early
        await real_sleep(0)

    monkeypatch.setattr("agents.executor.ceiling.asyncio.sleep", fake_sleep)
    assert await watch(2, 100.0, 10.0, 1, lambda: now[0], lambda: fired.append(now[0])) is True
    assert len(fired) == 1 and fired[0] >= 105.0 - 1e-9


async def test_the_watch_does_nothing_when_remaining_is_unknown():
    fired: list[int] = []
    assert await watch(1, 0.0, None, 1, lambda: 1e9, lambda: fired.append(1)) is False
    assert fired == []


# -- the queue's side --------------------------------------------------------------------------------------------

def test_remaining_is_the_ceiling_less_consumed_never_negative_and_unknown_without_an_answer():
    assert remaining_seconds(600, 0.0) == 600
    assert remaining_seconds(600, 450.5) == pytest.approx(149.5)
    assert remaining_seconds(600, 700) == 0.0
    assert remaining_seconds(600, None) is None


def test_only_a_job_granted_before_needs_the_budget_asked():
    assert not needs_asking(job(JobState.QUEUED, epoch=0))
    assert needs_asking(job(JobState.QUEUED, epoch=2))


def test_a_grant_carries_the_remaining_gpu_seconds_and_none_by_default():
    t = lc.decide(job(JobState.QUEUED, epoch=0), lc.Granted(("ex-1",), 1, T0 + timedelta(60)), T0)
    settings = QueueSettings()
    (_, run), *_ = [m for m in messages_for(t.job, t, settings, 123.5) if isinstance(m[1], RunJob)]
    assert run.remaining_gpu_seconds == 123.5
    (_, old), *_ = [m for m in messages_for(t.job, t, settings) if isinstance(m[1], RunJob)]
    assert old.remaining_gpu_seconds is None
    assert RunJob.decode(run.encode()).remaining_gpu_seconds == 123.5


def test_a_run_the_executor_stopped_at_its_ceiling_interrupts_the_job_before_the_budget_says_so():
    running = job(JobState.RUNNING, epoch=3)
    report = RunFinished(job_id="j1", epoch=3, executor_id="ex-1", outcome=RunOutcome.STOPPED, exit_code=0,
                         stop_reason=CEILING_STOP)
    t = lc.decide(running, fact_of(RunFinished.decode(report.encode())), T0)
    assert t.job.state is JobState.INTERRUPTED and t.job.reason == CEILING_STOP
    assert [e.event for e in t.events] == [JobEventKind.INTERRUPTED]
    # The budget's exhaustion that follows finds it interrupted: nothing more to do.
    later = lc.decide(t.job, lc.StopForCeiling(600, 600.4), T0)
    assert not later.changed


def test_a_run_stopped_for_another_reason_is_not_taken_for_the_ceiling():
    running = job(JobState.RUNNING, epoch=3)
    t = lc.decide(running, lc.Finished(3, RunOutcome.STOPPED, stop_reason="test"), T0)
    assert t.job.state is not JobState.INTERRUPTED


async def test_placement_asks_the_budget_only_for_jobs_placed_again_and_gets_none_without_an_answer():
    from types import SimpleNamespace

    from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
    from libs.contracts.subjects import Subjects
    from services.queue.remaining import remaining_for

    asked: list[tuple[str, float]] = []

    async def request(subject: str, data: bytes, timeout: float):
        job_id = BudgetStatusRequest.decode(data).job_id
        asked.append((job_id, timeout))
        if job_id == "silent":
            raise TimeoutError
        reply = BudgetStatusReply(job_id=job_id, known=True, ceiling_seconds=600, consumed_seconds=450.0)
        return SimpleNamespace(data=reply.encode())

    runtime = SimpleNamespace(nc=SimpleNamespace(request=request), subjects=Subjects("teto"))
    fresh, again = replace(job(JobState.QUEUED, epoch=0), id="fresh"), job(JobState.QUEUED, epoch=2)
    silent = replace(again, id="silent")
    left = await remaining_for(runtime, [fresh, again, silent], timeout=5.0)
    # Never granted: the whole ceiling, unasked; placed again: ceiling - consumed; no answer: unknown.
    assert left == {"fresh": 600.0, "j1": 150.0, "silent": None}
    assert sorted(j for j, _ in asked) == ["j1", "silent"] and all(t <= 0.5 for _, t in asked)


def test_a_job_placed_again_that_was_not_asked_before_the_pass_carries_an_unknown_remainder():
    from services.queue.remaining import remaining_of

    fresh, again = replace(job(JobState.QUEUED, epoch=0), id="fresh"), job(JobState.QUEUED, epoch=2)
    late = replace(again, id="late")  # queued again between the budget's question and the placement pass
    assert remaining_of([fresh, again, late], {"j1": 450.0}) == {"fresh": 600.0, "j1": 150.0, "late": None}
    assert remaining_of([again], {"j1": None}) == {"j1": None}  # asked, no answer: unknown, never a guess
