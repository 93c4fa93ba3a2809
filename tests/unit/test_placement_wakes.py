"""When placement runs at once (services/queue/domain/wakes.py) and the loop that waits for it
(libs/runtime/wake.py): a wake starts the next pass at once, one that came during a pass is not lost."""

from __future__ import annotations

import asyncio

import pytest

from libs.contracts.jobs import JobEventKind, JobState
from libs.runtime.wake import Waker, channel, wakeable
from services.queue.domain.wakes import FEWEST, PER_FREE, offers_an_executor, pass_size, queues_a_job, widen
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.unit


def test_a_queued_job_wakes_placement_and_other_events_do_not():
    assert queues_a_job([builders.job_event(JobEventKind.SUBMITTED, JobState.QUEUED)])
    assert queues_a_job([builders.job_event(JobEventKind.STARTED, JobState.RUNNING),
                         builders.job_event(JobEventKind.REQUEUED, JobState.QUEUED)])
    assert not queues_a_job([builders.job_event(JobEventKind.STARTED, JobState.RUNNING)])
    assert not queues_a_job([builders.job_event(JobEventKind.SUCCEEDED, JobState.SUCCEEDED)])
    assert not queues_a_job([])


def test_only_an_idle_accepting_executor_wakes_placement():
    assert offers_an_executor([builders.heartbeat(accepting=True)])
    assert not offers_an_executor([builders.heartbeat(accepting=True, job_id="j1", epoch=1)])
    assert not offers_an_executor([builders.heartbeat(accepting=False)])  # draining or checking
    assert not offers_an_executor([])


def test_the_channel_is_a_short_identifier_per_prefix():
    a, b = channel("teto", "placement"), channel("t-7f3a.x", "placement")
    assert a != b and len(a) < 63 and a.replace("_", "").isalnum()


async def test_a_wake_starts_the_next_pass_at_once_and_one_during_a_pass_is_not_lost():
    waker = Waker("postgresql://nowhere.invalid/x", "teto_placement_test")
    passes: list[float] = []
    loop = asyncio.get_running_loop()

    async def place() -> None:
        passes.append(loop.time())
        if len(passes) == 2:
            waker.set()  # a job queued while this pass runs: it needs another pass

    task = asyncio.create_task(wakeable(place, 60.0, "placement", waker)())
    try:
        await eventually(lambda: passes, what="the first placement pass", every=0.01)
        waker.set()  # long before the 60 s tick
        await eventually(lambda: len(passes) >= 3, timeout=3.0, what="two passes after the wake", every=0.01)
        assert len(passes) == 3 and passes[2] - passes[0] < 30
        assert waker.woken == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_back_to_back_passes_rest_as_long_as_they_worked_up_to_the_tick():
    from libs.runtime.wake import rest_before_next

    assert rest_before_next(0.04, 0.5, 5.0) == pytest.approx(0.04)  # half the time at most
    assert rest_before_next(0.03, 0.75, 5.0) == pytest.approx(0.01)
    assert rest_before_next(0.04, 1.0, 5.0) == 0.0  # duty 1: no rest, passes back to back
    assert rest_before_next(9.0, 0.5, 0.5) == 0.5  # never longer than the tick
    assert rest_before_next(-1.0, 0.5, 0.5) == 0.0  # a clock that stepped back: no rest
    for duty in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError):
            rest_before_next(0.1, duty, 1.0)


async def test_a_wake_during_a_pass_rests_first_and_a_wake_after_an_idle_spell_does_not():
    now = [100.0]
    waker = Waker("postgresql://nowhere.invalid/x", "teto_placement_test", clock=lambda: now[0])
    await asyncio.wait_for(waker.sleep(0.01), 5)  # the timer ends the first wait: a pass begins at 100.0
    now[0] += 0.02  # the pass took 20 ms, and a job was queued meanwhile
    waker.set()
    await asyncio.wait_for(waker.sleep(60.0), 5)
    assert waker.woken == 1 and waker.rested == pytest.approx(0.02)
    # This pass ends with nothing new; the next wake comes while the loop waits: no rest.
    asyncio.get_running_loop().call_later(0.01, waker.set)
    now[0] += 0.02
    await asyncio.wait_for(waker.sleep(60.0), 5)
    assert waker.woken == 2 and waker.rested == pytest.approx(0.02)


def test_a_pass_is_whole_on_the_first_wake_and_once_a_tick_and_sized_to_the_free_executors_in_between():
    assert pass_size(False, 5, None, 0.5, 200) == 0  # nothing queued: nothing to do
    assert pass_size(False, 5, 3.0, 0.5, 200) == 0
    assert pass_size(True, 0, None, 0.5, 200) == 200  # the first pass is whole
    assert pass_size(True, 3, None, 0.5, 200) == 200
    assert pass_size(True, 0, 0.2, 0.5, 200) == 0  # busy fleet, a whole pass a moment ago: skipped
    assert pass_size(True, 0, 0.5, 0.5, 200) == 200 and pass_size(True, 2, 3.0, 0.5, 200) == 200  # once a tick
    # In between, an executor free: a pass sized to the free ones (FEWEST at least, PER_FREE each), never more
    # than a whole one.
    assert pass_size(True, 1, 0.0, 0.5, 200) == FEWEST
    assert pass_size(True, FEWEST // PER_FREE + 1, 0.1, 0.5, 200) == PER_FREE * (FEWEST // PER_FREE + 1)
    assert pass_size(True, 49, 0.1, 0.5, 200) == 196 and pass_size(True, 50, 0.1, 0.5, 200) == 200
    assert pass_size(True, 10_000, 0.1, 0.5, 200) == 200
    assert pass_size(True, 1, 0.1, 0.5, 5) == 5  # a small max_jobs_per_pass: every pass is whole
    assert FEWEST >= PER_FREE >= 1


@pytest.mark.parametrize(("size", "considered", "workers", "free", "want"), [
    (16, 16, 1, 1, False),  # the free executor was given a job
    (16, 16, 0, 1, True),  # it was not, and jobs beyond the 16 may fit it
    (16, 16, 3, 4, True),  # one of four left free
    (16, 9, 0, 1, False),  # fewer than asked for: the pass saw every queued job
    (200, 200, 0, 1, False),  # a whole pass is never widened
    (16, 16, 4, 4, False),
    (16, 0, 0, 1, False),  # nothing queued any more
])
def test_a_sized_pass_that_leaves_an_executor_free_is_widened_when_jobs_beyond_it_may_fit(size, considered, workers,
                                                                                           free, want):
    assert widen(size, 200, considered, workers, free) is want
