"""Health's job-event handler on FastStream's in-memory ``TestNatsBroker`` (no server): its own declaration
(services/health/handlers.py) and the edge's rules, with a pool-less double of ``health.jobs`` (the upsert's rules:
a later event of the job replaces its state, a new lease epoch resets its contact) in the broker's context. A job
that finished has no signal any more (the signal rule, domain/signals.py, judges running jobs only); a batch of one
round is one statement sent without a transaction; health's own signal events on the job stream are acknowledged
unread; a malformed event is refused visibly and writes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from libs.contracts.jobs import JobEvent, JobEventKind, JobState
from libs.contracts.nodes import Signal, SignalChanged
from libs.contracts.subjects import Subjects
from services.health import store
from services.health.domain.signals import Thresholds, job_signal
from services.health.handlers import consumers
from services.health.settings import HealthSettings
from tests.support.inmemory import T0, FakeClock, in_memory
from tests.support.memory_pool import MemoryPool

pytestmark = pytest.mark.unit

S = Subjects()
TH = Thresholds(signal_timeout_seconds=60.0, stuck_after_seconds=300.0)


@dataclass
class MemoryJobs:
    """``health.jobs`` without PostgreSQL: each job's state, last event, epoch and contact, written by the
    handler's upsert with its rules (``store._UPSERT_JOB_EVENTS``)."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def answer(self, method: str, query: str, args: tuple) -> Any:
        if method == "execute" and query == store._UPSERT_JOB_EVENTS:
            for job_id, state, seq, epoch, executor_id, at in zip(*args):
                row = self.rows.get(job_id)
                if row is None:
                    self.rows[job_id] = {"state": state, "seq": seq, "epoch": epoch or 0, "executor": executor_id,
                                         "contact": at}
                elif seq > row["seq"]:
                    new_epoch = (epoch or 0) > row["epoch"]
                    row.update(state=state, seq=seq, epoch=max(row["epoch"], epoch or 0),
                               executor=executor_id or row["executor"], contact=at if new_epoch else row["contact"])
            return "INSERT 0 1"
        raise AssertionError(f"a query the handler does not make: {method} {query}")

    def signal(self, job_id: str, now: datetime) -> Signal | None:
        """The job's signal as the evaluator judges it from the stored row (None: no signal row)."""
        row = self.rows[job_id]
        return job_signal(JobState(row["state"]), row["contact"], None, None, now, TH).signal


def event(seq: int, state: JobState, kind: JobEventKind, epoch: int | None = 1) -> JobEvent:
    return JobEvent(job_id="job-1", seq=seq, event=kind, state=state, epoch=epoch, executor_id="ex1", time=T0)


def health(jobs: MemoryJobs, pool: MemoryPool):
    return in_memory("health", S, consumers(S, HealthSettings.from_env(env={})), pool=pool, clock=FakeClock())


async def test_a_job_event_for_a_finished_job_leaves_it_no_signal_each_event_one_statement_without_a_transaction():
    jobs = MemoryJobs()
    pool = MemoryPool(jobs.answer)
    async with health(jobs, pool) as (bus, reporter):
        await bus.publish(event(1, JobState.RUNNING, JobEventKind.STARTED).encode(),
                          S.job_event("job-1", "started"))
        assert jobs.signal("job-1", T0 + timedelta(seconds=10)) is Signal.OK
        await bus.publish(event(2, JobState.SUCCEEDED, JobEventKind.SUCCEEDED).encode(),
                          S.job_event("job-1", "succeeded"))
    assert jobs.rows["job-1"]["state"] == "succeeded" and jobs.signal("job-1", T0 + timedelta(seconds=10)) is None
    assert [(c.method, c.in_transaction) for c in pool.conn.calls] == [("execute", False)] * 2
    assert pool.conn.transactions == 0 and not reporter.rejected


async def test_healths_own_signal_events_on_the_job_stream_are_acknowledged_unread():
    jobs = MemoryJobs()
    pool = MemoryPool(jobs.answer)
    changed = SignalChanged(job_id="job-1", executor_id="ex1", signal=Signal.NO_SIGNAL, previous=Signal.OK, since=T0,
                            no_signal_after_seconds=60.0, stuck_after_seconds=300.0)
    async with health(jobs, pool) as (bus, reporter):
        await bus.publish(changed.encode(), S.job_event("job-1", "signal"))
    assert pool.conn.calls == [] and jobs.rows == {} and not reporter.rejected and not reporter.dead


async def test_a_malformed_job_event_is_refused_visibly_and_writes_nothing():
    jobs = MemoryJobs()
    pool = MemoryPool(jobs.answer)
    body = event(1, JobState.RUNNING, JobEventKind.STARTED).encode().replace(b'"seq":1', b'"seq":"first"')
    async with health(jobs, pool) as (bus, reporter):
        await bus.publish(body, S.job_event("job-1", "started"))
    assert [c for c in pool.conn.calls if c.method == "execute"] == [] and jobs.rows == {}
    assert [subject for subject, _, _ in reporter.rejected] == [S.job_event("job-1", "started")]
