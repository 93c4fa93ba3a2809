"""How a run ended and what the job's error says, from the run and its exit status (agents/executor/run.py):
a lost lease outranks a requested stop, which outranks the exit status; the error is the lease's reason or
the exit status with the end of stderr, the last 8,000 characters kept."""

from __future__ import annotations

import itertools

import pytest

from agents.executor.lease import LeaseLost
from agents.executor.run import Run
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.telemetry import RunOutcome

pytestmark = pytest.mark.unit

GRANT = RunJob(job_id="j1", epoch=1, executor_id="ex-1", attempt=1, lease_seconds=180, heartbeat_seconds=30,
               spec=JobSpec(workload=CommandWorkload(command=["true"])))


class FakeChild:
    sandbox = None  # no limits in force: the error is the exit status and the stderr tail alone

    def __init__(self, tail: str) -> None:
        self.tail = tail

    def stderr_tail(self) -> str:
        return self.tail


def _run(lost: bool, stopped: bool, tail: str | None) -> Run:
    return Run(grant=GRANT, lost=LeaseLost("lease refused: expired", refused=True) if lost else None,
               stop_requested=stopped, child=None if tail is None else FakeChild(tail))  # type: ignore[arg-type]


@pytest.mark.parametrize(("lost", "stopped", "rc"), list(itertools.product([False, True], [False, True],
                                                                           [0, 1, 137, -9, -15])))
def test_every_combination_ends_as_the_rules_say(lost, stopped, rc):
    run = _run(lost, stopped, "boom")
    expected = (RunOutcome.ABANDONED if lost else RunOutcome.STOPPED if stopped
                else RunOutcome.SUCCEEDED if rc == 0 else RunOutcome.FAILED)
    assert run.outcome(rc) is expected
    if lost:
        assert run.error(rc) == "lease refused: expired"
    elif rc == 0:
        assert run.error(rc) is None
    else:
        status = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        assert run.error(rc) == f"{status}: boom"


def test_the_error_without_stderr_or_process_is_the_status_alone_and_a_long_tail_keeps_its_end():
    assert _run(False, False, "  \n").error(2) == "exit status 2"
    assert _run(False, False, None).error(-9) == "killed by signal 9"
    long = "x" * 9000 + "the cause"
    error = _run(False, False, long).error(1)
    assert len(error) == 8000 and error.endswith("the cause")
