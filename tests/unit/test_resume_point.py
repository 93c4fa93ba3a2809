"""The queue accepts a checkpoint only from the lease holder of the job's current epoch, keeps it with that epoch,
and the next grant carries it (services/queue/domain/resume.py, effects.messages_for): a report from a fenced-out
run (an older epoch) or from an executor that does not hold the lease never becomes a resume point."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from libs.contracts.agents import AcceptedCheckpoint, RunJob
from libs.contracts.jobs import JobState
from services.queue.domain.lifecycle import Granted, decide, from_holder
from services.queue.domain.resume import resume_point
from services.queue.effects import messages_for
from services.queue.settings import QueueSettings
from tests.support import builders
from tests.support.builders import EPOCH, EX, T0

SHA = "c" * 64
LATER = T0 + timedelta(seconds=10)


def test_an_accepted_checkpoint_is_the_next_grants_resume_point_with_its_epoch():
    job = decide(builders.job(JobState.RUNNING), builders.checkpointed(95, at=LATER, sha256=SHA, bytes=9), LATER).job
    assert resume_point(job.last_checkpoint) == AcceptedCheckpoint(step=95, sha256=SHA, epoch=EPOCH)
    requeued = replace(job, state=JobState.QUEUED, executor_id=None, workers=())
    granted = decide(requeued, Granted(("ex-2",), EPOCH + 1, LATER + timedelta(seconds=6)), LATER)
    (run,) = [m for _, m in messages_for(granted.job, granted, QueueSettings()) if isinstance(m, RunJob)]
    assert run.epoch == EPOCH + 1 and run.resume_from == AcceptedCheckpoint(step=95, sha256=SHA, epoch=EPOCH)


def test_a_checkpoint_reported_under_an_older_epoch_is_not_accepted():
    job = decide(builders.job(JobState.RUNNING), builders.checkpointed(95, at=LATER, sha256=SHA, bytes=9), LATER).job
    fenced_out = builders.checkpointed(100, epoch=EPOCH - 1, at=LATER, sha256=SHA, bytes=9)  # the old run's step 100
    late = decide(job, fenced_out, LATER)
    assert not late.changed and late.job.last_checkpoint["step"] == 95
    assert resume_point(late.job.last_checkpoint).step == 95


def test_a_checkpoint_from_an_executor_that_does_not_hold_the_lease_is_refused():
    assert from_holder(builders.job(JobState.RUNNING), "intruder", EPOCH) is not None
    assert from_holder(builders.job(JobState.RUNNING), EX, EPOCH) is None


def test_a_job_with_no_accepted_checkpoint_is_granted_none():
    granted = decide(builders.job(JobState.QUEUED), Granted((EX,), EPOCH + 1, LATER + timedelta(seconds=6)), LATER)
    (run,) = [m for _, m in messages_for(granted.job, granted, QueueSettings()) if isinstance(m, RunJob)]
    assert run.resume_from is None
