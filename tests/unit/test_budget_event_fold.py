"""The fold of a batch of job events over the budget's job rows (services/budget/domain/events.py): the rules of
each event applied in (job, seq) order, in memory. Equivalence with the statements it replaced is proven against
PostgreSQL in tests/integration/test_budget_job_events_batch.py; these are the rules one by one."""

from __future__ import annotations

from datetime import timedelta

from libs.contracts.jobs import JobEvent, JobSpec, JobState
from services.budget.domain.events import Exhausted, JobRow, Warned, fold
from tests.support import builders
from tests.support.builders import T0


def spec(ceiling: float, every: int = 100, step: float = 0.01) -> JobSpec:
    return builders.spec(gpu_ceiling_seconds=ceiling, checkpoint_every_steps=every, estimated_step_seconds=step)


def spec_of(detail: dict) -> JobSpec | None:
    return JobSpec.model_validate(detail["spec"]) if "spec" in detail else None


def submitted(seq: int, ceiling: float, **kw) -> JobEvent:
    return builders.job_event(seq=seq, job_id="j",
                              detail={"spec": spec(ceiling, **kw).model_dump(mode="json"), "owner": "alice"})


def requeued(seq: int, ceiling: float | None) -> JobEvent:
    detail = {} if ceiling is None else {"gpu_ceiling_seconds": ceiling, "actor": "carol"}
    return builders.job_event("requeued", seq=seq, job_id="j", previous_state=JobState.INTERRUPTED, detail=detail)


def moved(seq: int, state: JobState, previous: JobState | None = None, epoch: int | None = None) -> JobEvent:
    kind = {JobState.RUNNING: "started", JobState.SUCCEEDED: "succeeded", JobState.FAILED: "failed",
            JobState.ADMITTING: "leased", JobState.INTERRUPTED: "interrupted"}[state]
    return builders.job_event(kind, state, seq=seq, job_id="j", previous_state=previous, epoch=epoch)


def test_the_ceiling_in_force_is_the_latest_events_whatever_order_they_arrive_in():
    out = fold({"j": JobRow("j")}, [requeued(5, 80.0), submitted(1, 40.0), requeued(3, 60.0)], spec_of)
    assert out.rows["j"].ceiling == 80.0 and out.rows["j"].ceiling_seq == 5
    assert [(c.event_seq, c.ceiling_seconds) for c in out.ceilings] == [(1, 40.0), (3, 60.0), (5, 80.0)]


def test_a_ceiling_older_than_the_stored_history_adds_a_row_but_does_not_take_over():
    row = JobRow("j", event_seq=7, ceiling=90.0, ceiling_seq=7, ceiling_latest=90.0)
    out = fold({"j": row}, [requeued(4, 20.0)], spec_of)
    assert out.rows["j"].ceiling == 90.0 and [c.event_seq for c in out.ceilings] == [4]


def test_a_redelivered_event_adds_its_ceiling_once_and_moves_nothing_twice():
    out = fold({"j": JobRow("j")}, [submitted(1, 40.0), submitted(1, 40.0)], spec_of)
    assert len(out.ceilings) == 1 and out.rows["j"].event_seq == 1


def test_exhaustion_is_announced_once_per_ceiling_and_never_for_a_terminal_job():
    row = JobRow("j", state="interrupted", event_seq=4, ceiling=40.0, consumed=50.0, exhausted_for=40.0,
                 overshoot=10.0, ceiling_seq=1, ceiling_latest=40.0)
    out = fold({"j": row}, [requeued(5, 45.0), requeued(6, 45.0)], spec_of)
    assert out.announced == [Exhausted("j", out.announced[0].account)]
    assert out.rows["j"].exhausted_for == 45.0 and out.rows["j"].overshoot == 10.0
    done = JobRow("j", state="succeeded", event_seq=4, ceiling=100.0, consumed=50.0, ceiling_seq=1,
                  ceiling_latest=100.0)
    assert fold({"j": done}, [requeued(3, 45.0)], spec_of).announced == []


def test_a_run_starts_when_the_job_moves_into_running_and_old_events_move_nothing():
    out = fold({"j": JobRow("j")}, [moved(2, JobState.ADMITTING, JobState.QUEUED, epoch=1),
                                    moved(3, JobState.RUNNING, JobState.ADMITTING, epoch=1)], spec_of)
    row = out.rows["j"]
    assert (row.state, row.event_seq, row.epoch, row.running_since) == ("running", 3, 1, T0 + timedelta(seconds=3))
    late = fold({"j": row}, [moved(2, JobState.SUCCEEDED, JobState.RUNNING, epoch=5)], spec_of).rows["j"]
    assert (late.state, late.event_seq, late.epoch) == ("running", 3, 1)


def test_the_epoch_never_goes_back():
    row = fold({"j": JobRow("j", epoch=4)}, [moved(2, JobState.RUNNING, JobState.ADMITTING, epoch=2)], spec_of)
    assert row.rows["j"].epoch == 4


def test_the_first_checkpoint_warning_is_given_once_per_job():
    # 100 steps x 1 s x 1 device = 100 GPU-seconds before the first checkpoint, more than the ceiling of 40.
    out = fold({"j": JobRow("j")}, [submitted(1, 40.0, step=1.0), submitted(2, 40.0, step=1.0)], spec_of)
    assert [type(a) for a in out.announced] == [Warned] and out.rows["j"].warned
    assert fold({"j": JobRow("j", warned=True)}, [submitted(1, 40.0, step=1.0)], spec_of).announced == []


def test_the_owner_is_kept_once_known_and_the_org_only_replaced_when_given():
    row = JobRow("j", owner="bob", org="org-a")
    out = fold({"j": row}, [submitted(1, 40.0)], spec_of).rows["j"]
    assert (out.owner, out.org, out.devices, out.checkpoint_every_steps) == ("bob", "org-a", 1, 100)


def test_a_spec_alone_changes_the_row_without_moving_its_update_time():
    row = JobRow("j", state="running", event_seq=9, ceiling=40.0, ceiling_seq=1, ceiling_latest=40.0)
    out = fold({"j": row}, [submitted(1, 40.0)], spec_of)
    assert out.rows["j"].changed and not out.rows["j"].touched
    untouched = fold({"j": JobRow("j", event_seq=9)}, [moved(3, JobState.RUNNING)], spec_of)
    assert untouched.changed() == []
