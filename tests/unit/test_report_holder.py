"""A run report counts only from an executor of that run (services/queue/domain/lifecycle.from_holder).

The epoch is public in the job view, so without this rule any executor could finish, fail or checkpoint
another tenant's job under its own honest id (the bus only binds the id it may use, not the jobs it holds).
"""

from __future__ import annotations

import pytest

from libs.contracts.jobs import JobState
from services.queue.domain.lifecycle import ForeignReport, from_holder
from tests.support import builders
from tests.support.builders import EPOCH, EX

pytestmark = pytest.mark.unit


def test_a_report_from_the_runs_executor_is_decided_as_before():
    assert from_holder(builders.job(JobState.RUNNING), EX, EPOCH) is None


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.ADMITTING], ids=str)
def test_a_report_on_the_current_run_from_another_executor_is_refused(state):
    refusal = from_holder(builders.job(state), "intruder", EPOCH)
    assert isinstance(refusal, ForeignReport) and refusal.detail["executor_id"] == "intruder"


def test_a_gang_worker_other_than_rank_zero_may_report():
    assert from_holder(builders.job(JobState.ADMITTING), "ex-2", EPOCH) is None


@pytest.mark.parametrize("epoch", [EPOCH - 1, EPOCH + 1])
def test_another_epoch_or_an_unknown_job_is_left_to_the_lifecycle(epoch):
    assert from_holder(builders.job(JobState.RUNNING), "intruder", epoch) is None
    assert from_holder(None, "intruder", EPOCH) is None
