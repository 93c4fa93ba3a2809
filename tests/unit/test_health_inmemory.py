"""Health's heartbeat handler on FastStream's in-memory ``TestNatsBroker`` (no server): its own declarations
(services/health/handlers.py) and the edge's rules, with a database-less heartbeat log (the store's own row
builders, ``executor_rows``/``job_rows``) and a clock the test moves in the broker's context. What the handler
stores is what the signal rule (domain/signals.py) judges: a heartbeat is heard at the injected clock's time at the
latest (a fast executor clock cannot keep a job looking alive), goes silent after the timeout, and a heartbeat of
an old lease epoch never counts as the job's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from libs.contracts.jobs import JobState
from libs.contracts.nodes import Signal
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime.fencing import StaleEpoch
from services.health import store
from services.health.domain.signals import Thresholds, job_signal
from services.health.handlers import consumers
from services.health.settings import HealthSettings
from tests.support.inmemory import T0, FakeClock, in_memory

pytestmark = pytest.mark.unit

S = Subjects()
TH = Thresholds(signal_timeout_seconds=60.0, stuck_after_seconds=300.0)


@dataclass
class MemoryUnit:
    log: MemoryHeartbeats
    ignored: list[StaleEpoch] = field(default_factory=list)

    async def job_epochs(self, job_ids: list[str]) -> dict[str, int]:
        return {j: self.log.epochs[j] for j in job_ids if j in self.log.epochs}

    def stale(self, fact: StaleEpoch) -> None:
        self.ignored.append(fact)

    async def record(self, beats: list[Heartbeat], job_beats: list[Heartbeat], now: datetime) -> None:
        for row in store.executor_rows(beats, now):
            self.log.executors[row[0]] = row
        for row in store.job_rows(job_beats, now):
            self.log.jobs[row[0]] = row

    async def note_stale(self, stale: list[StaleEpoch], now: datetime) -> None:
        self.log.noted += [(fact, now) for fact in stale]

    async def wake_evaluator(self) -> None:
        self.log.wakes += 1


@dataclass
class MemoryHeartbeats:
    """Health's heartbeat tables without PostgreSQL: the jobs' lease epochs, the latest contact rows."""

    epochs: dict[str, int]
    executors: dict[str, tuple] = field(default_factory=dict)
    jobs: dict[str, tuple] = field(default_factory=dict)
    noted: list[tuple[StaleEpoch, datetime]] = field(default_factory=list)
    stale: list[StaleEpoch] = field(default_factory=list)  # counted once committed
    wakes: int = 0

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[MemoryUnit]:
        unit = MemoryUnit(self)
        yield unit
        self.stale += unit.ignored

    def signal(self, job_id: str, now: datetime) -> Signal | None:
        """The job's signal as the evaluator judges it from the stored contact (running, training)."""
        row = self.jobs.get(job_id)
        return job_signal(JobState.RUNNING, row[3] if row else None, None, Phase.TRAINING, now, TH).signal


def beat(sent_at: datetime, epoch: int = 2, executor: str = "ex1") -> Heartbeat:
    return Heartbeat(executor_id=executor, node_id="n1", group="g", job_id="job-1", epoch=epoch,
                     phase=Phase.TRAINING, step=10, sent_at=sent_at, interval_seconds=5, progress_interval_seconds=5)


def health(clock: FakeClock, log: MemoryHeartbeats):
    return in_memory("health", S, consumers(S, HealthSettings.from_env(env={})), heartbeats=log, clock=clock)


async def test_a_heartbeat_keeps_its_job_signalling_until_the_timeout_from_the_injected_clock():
    clock, log = FakeClock(), MemoryHeartbeats(epochs={"job-1": 2})
    async with health(clock, log) as (bus, reporter):
        # The executor's clock runs an hour ahead: its send time would keep the job "heard" for an hour.
        await bus.publish(beat(T0 + timedelta(hours=1)).encode(), S.heartbeat("ex1"))
    assert log.jobs["job-1"][3] == T0 and log.executors["ex1"][9] == T0 and log.wakes == 1
    assert log.signal("job-1", T0 + timedelta(seconds=59)) is Signal.OK
    assert log.signal("job-1", T0 + timedelta(seconds=61)) is Signal.NO_SIGNAL
    assert not reporter.rejected


async def test_a_heartbeat_of_an_old_epoch_is_noted_stale_and_never_counts_for_the_job():
    clock, log = FakeClock(), MemoryHeartbeats(epochs={"job-1": 3})
    async with health(clock, log) as (bus, _):
        clock.advance(10)
        await bus.publish(beat(T0, epoch=2).encode(), S.heartbeat("ex1"))
    assert "job-1" not in log.jobs and log.signal("job-1", clock.now()) is Signal.NO_SIGNAL
    assert "ex1" in log.executors  # the executor itself was heard
    ((fact, when),) = log.noted
    assert when == T0 + timedelta(seconds=10) and log.stale == [fact]


async def test_a_heartbeat_sent_as_another_executor_is_refused_and_stores_nothing():
    clock, log = FakeClock(), MemoryHeartbeats(epochs={"job-1": 2})
    async with health(clock, log) as (bus, reporter):
        await bus.publish(beat(T0, executor="ex1").encode(), S.heartbeat("ex9"))
    assert log.executors == {} and log.jobs == {} and log.wakes == 0
    assert [subject for subject, _, _ in reporter.rejected] == [S.heartbeat("ex9")]
