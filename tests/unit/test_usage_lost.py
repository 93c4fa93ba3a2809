"""GPU-seconds lost to interruptions in the usage report (services/gateway/domain/usage.py): for each run ended
without the job's consent, its charges after the last checkpoint before its end, by the job view's own
computation (``live.work_after_checkpoint``)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.domain import usage as usages
from services.gateway.domain.live import NONE, interruption_cost

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sample(epoch: int, start: float, end: float, gpu: float) -> dict:
    return {"epoch": epoch, "started_at": at(start), "ended_at": at(end), "recorded_at": at(end), "gpu_seconds": gpu}


def ckpt(seconds: float, step: int = 100) -> dict:
    return {"event": "checkpointed", "state": "running", "epoch": None, "reason": None, "time": at(seconds),
            "detail": {"step": step, "at": at(seconds).isoformat()}}


def ended(epoch: int, reason: str, state: str = "queued", event: str = "requeued") -> dict:
    return {"event": event, "state": state, "epoch": epoch, "reason": reason, "detail": None, "time": T0}


RUN_1 = [sample(1, 0, 30, 60.0), sample(1, 30, 60, 60.0), sample(1, 60, 90, 60.0)]


def test_a_preempted_run_loses_what_ran_after_its_checkpoint_the_straddling_sample_for_its_part():
    events = [ckpt(45), ended(1, "preempted")]
    # after t=45: half of the 30..60 sample (30) and all of 60..90 (60)
    assert usages.lost_gpu_seconds(events, RUN_1) == 90.0


def test_a_run_without_a_checkpoint_loses_all_of_it():
    assert usages.lost_gpu_seconds([ended(1, "transport_lost")], RUN_1) == 180.0


@pytest.mark.parametrize("cause, state, event", [
    ("transport_lost", "queued", "requeued"), ("node_failure", "queued", "requeued"),
    ("node_failure", "failed", "failed"), ("preempted", "queued", "requeued"),
    ("gang_timeout", "backoff", "backoff"), ("gang_timeout", "failed", "failed")], ids=str)
def test_every_interruption_cause_counts(cause, state, event):
    assert usages.lost_gpu_seconds([ckpt(60), ended(1, cause, state, event)], RUN_1) == 60.0


@pytest.mark.parametrize("reason, state, event", [
    ("training_error", "queued", "requeued"), ("gpu_ceiling", "interrupted", "interrupted"),
    ("handed_back", "queued", "requeued"), (None, "succeeded", "succeeded"), ("requested", "cancelled", "cancelled"),
    ("preempted", "running", "stop_requested")], ids=str)
def test_runs_ended_by_the_job_or_still_running_lose_nothing(reason, state, event):
    assert usages.lost_gpu_seconds([ended(1, reason, state, event)], RUN_1) == 0.0


def test_a_gangs_requeue_after_its_back_off_is_not_a_second_interruption():
    events = [ended(1, "gang_timeout", "backoff", "backoff"),
              {"event": "requeued", "state": "queued", "epoch": None, "reason": "gang_timeout", "detail": None}]
    assert usages.interrupted_runs(events) == {1: None}


def test_a_run_that_resumed_from_an_earlier_checkpoint_and_made_none_loses_all_of_its_own_time():
    run_2 = [sample(2, 200, 230, 50.0)]
    events = [ckpt(45), ended(1, "preempted"), ended(2, "transport_lost")]
    assert usages.interrupted_runs(events)[2]["at"] == at(45).isoformat()
    assert usages.lost_gpu_seconds(events, RUN_1 + run_2) == 90.0 + 50.0


def test_a_checkpoint_made_after_a_run_ended_does_not_save_it():
    run_2 = [sample(2, 200, 230, 50.0)]
    events = [ended(1, "node_failure"), ckpt(220), {"event": "succeeded", "state": "succeeded", "epoch": 2}]
    assert usages.lost_gpu_seconds(events, RUN_1 + run_2) == 180.0


def test_only_the_periods_charges_count():
    events = [ended(1, "preempted")]
    assert usages.lost_gpu_seconds(events, RUN_1, start=at(31), end=at(61)) == 60.0  # the sample ended at 60
    assert usages.lost_gpu_seconds(events, RUN_1, start=at(90)) == 60.0  # 60..90 ended at 90: counted from there
    assert usages.lost_gpu_seconds(events, RUN_1, start=at(91)) == 0.0


def test_a_sample_without_its_stretch_counts_by_when_it_was_recorded():
    old = {"epoch": 1, "gpu_seconds": 7.0, "recorded_at": at(100), "started_at": None, "ended_at": None}
    assert usages.lost_gpu_seconds([ckpt(50), ended(1, "preempted")], [old]) == 7.0
    assert usages.lost_gpu_seconds([ckpt(150), ended(1, "preempted")], [old]) == 0.0


def test_the_report_and_the_job_view_agree_on_what_an_interruption_threw_away():
    checkpoint = {"step": 100, "at": at(45).isoformat()}
    view = interruption_cost({"state": "interrupted", "last_step": 130, "last_checkpoint": checkpoint}, RUN_1, NONE)
    assert usages.lost_gpu_seconds([{"event": "checkpointed", "detail": checkpoint}, ended(1, "preempted")],
                                   RUN_1) == view["gpu_seconds"]


def test_job_facts_and_the_report_sum_the_lost_time_per_row():
    job = {"id": "a", "org": "north", "project": "rad", "owner": "ann", "state": "running",
           "attempts": {"preempted": 1}}
    events = [ckpt(45), ended(1, "preempted")]
    facts = usages.job_facts(job, events, RUN_1, at(0), at(3600))
    assert facts.lost_gpu_seconds == 90.0 and facts.interruptions == 1
    other = usages.JobFacts("b", "north", "gen", "bob", lost_gpu_seconds=5.0)
    charges = [usages.Charge("a", s["gpu_seconds"], s["ended_at"]) for s in RUN_1]
    result = usages.report(charges, [facts, other], usages.GroupBy.ORG, at(0), at(3600))
    assert [(r.key, r.lost_gpu_seconds) for r in result.rows] == [("north", 95.0)]
    assert usages.as_json(result)["rows"][0]["lost_gpu_seconds"] == 95.0
    assert usages.to_csv_rows(result)[1][usages.to_csv_rows(result)[0].index("lost_gpu_seconds")] == "95.000"


stretches = st.lists(st.tuples(st.integers(1, 3), st.floats(0, 500), st.floats(0, 120), st.floats(0, 1e4)),
                     max_size=20)
histories = st.lists(st.one_of(
    st.floats(-50, 700).map(ckpt),
    st.tuples(st.integers(1, 3), st.sampled_from([*usages.INTERRUPTION_CAUSES, "training_error"]))
    .map(lambda t: ended(*t))), max_size=8)


@settings(max_examples=200, deadline=None)
@given(stretches, histories, st.floats(0, 600), st.floats(0, 600))
def test_lost_time_is_never_more_than_the_periods_charges_of_the_interrupted_runs(rows, events, a, b):
    samples = [sample(e, s, s + d, g) for e, s, d, g in rows]
    start, end = at(min(a, b)), at(max(a, b))
    runs = usages.interrupted_runs(events)
    charged = math.fsum(s["gpu_seconds"] for s in samples if s["epoch"] in runs and start <= s["ended_at"] < end)
    lost = usages.lost_gpu_seconds(events, samples, start, end)
    assert 0.0 <= lost <= charged * (1 + 1e-9) + 1e-9
    if not any("step" in (e.get("detail") or {}) for e in events):
        assert math.isclose(lost, charged, rel_tol=1e-9, abs_tol=1e-9)


def test_teto_usage_shows_the_gpu_hours_lost_per_row(monkeypatch, capsys):
    from argparse import Namespace

    from teto import cli_orgs
    body = {"start": "2026-12-01T00:00:00+00:00", "end": "2027-01-01T00:00:00+00:00", "total_gpu_hours": 2.0,
            "total_gpu_seconds": 7200.0,
            "rows": [{"key": "north", "gpu_hours": 2.0, "jobs": {"succeeded": 1}, "interruptions": 1,
                      "lost_gpu_seconds": 1800.0, "mean_queue_wait_seconds": 3.0, "checkpoint_cadence_met": 1.0}]}
    monkeypatch.setattr(cli_orgs, "call", lambda *a, **kw: (200, body))
    args = Namespace(org=None, period=None, group_by=None, csv=False, json=False)
    assert cli_orgs.cmd_usage(args) == 0
    header, row = capsys.readouterr().out.splitlines()[1:3]
    assert header.split().index("LOST") == 4 and row.split()[4] == "0.5"  # 1800 GPU-s
