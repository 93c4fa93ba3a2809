"""Pure rules of the gateway: the checkpoint cadence block, signal/budget blocks, and outcome -> HTTP status."""

from __future__ import annotations

import pytest

from services.gateway.domain.outcomes import status_for
from services.gateway.domain.views import checkpoint_block, job_view, next_checkpoint_step, signal_block

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("every", "last", "total", "expected"), [
    (50, None, None, 50),  # nothing done yet: the first checkpoint
    (50, 0, 300, 50),
    (50, 49, 300, 50),
    (50, 50, 300, 100),  # exactly on a checkpoint: the next one
    (50, 280, 300, 300),  # the final step comes before the next multiple
    (50, 300, 300, None),  # finished: nothing due
    (1, 7, None, 8),
], ids=lambda v: str(v))
def test_next_checkpoint_step(every, last, total, expected):
    assert next_checkpoint_step(every, last, total) == expected


def test_eta_is_null_until_a_step_time_is_measured_and_only_while_running():
    spec = {"checkpoint_every_steps": 50}
    job = {"state": "running", "last_step": 60, "total_steps": 300, "step_seconds": None,
           "last_checkpoint": {"step": 50}}
    assert checkpoint_block(spec, job) == {"every_steps": 50, "last_step": 50, "next_step": 100,
                                           "next_eta_seconds": None, "next_eta_status": "not_measured",
                                           "last_kind": "file", "last_bytes": None}
    directory = {**job, "last_checkpoint": {"step": 50, "kind": "directory", "bytes": 4096}}
    assert {k: checkpoint_block(spec, directory)[k] for k in ("last_kind", "last_bytes")} == {
        "last_kind": "directory", "last_bytes": 4096}
    assert checkpoint_block(spec, {**job, "last_checkpoint": None})["last_kind"] is None
    assert checkpoint_block(spec, {**job, "step_seconds": 0.25})["next_eta_seconds"] == 10.0
    assert checkpoint_block(spec, {**job, "step_seconds": 0.25, "state": "interrupted"})["next_eta_seconds"] is None


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_terminal_jobs_carry_no_signal(state):
    assert signal_block(state, {"signal": "stuck", "signal_since": "t", "executor_id": "e"}) is None


def test_signal_block_carries_the_numbers_behind_it():
    block = signal_block("running", {"signal": "no_signal", "signal_since": "t", "executor_id": "e",
                                     "detail": {"seconds_since_heartbeat": 7.5, "signal": "ignored"}})
    assert block == {"signal": "no_signal", "signal_since": "t", "executor_id": "e", "seconds_since_heartbeat": 7.5}
    assert signal_block("running", None) is None


def test_job_view_has_the_documented_shape():
    view = job_view({"id": "j", "state": "queued", "spec": {"checkpoint_every_steps": 10}, "extra": 1},
                    budget={"job_id": "j", "ceiling_seconds": 100, "consumed_seconds": 5}, events=[{"seq": 1}])
    assert "extra" not in view
    assert view["budget"]["ceiling_seconds"] == 100 and view["budget"]["remaining_seconds"] is None
    assert view["signal"] is None and view["events"][0]["seq"] == 1 and view["checkpoint"]["next_step"] == 10
    for key in ("id", "name", "owner", "state", "spec", "attempts", "attempt_number", "executor_id", "lease_epoch",
                "last_step", "total_steps", "last_checkpoint", "reason", "error", "created_at", "updated_at"):
        assert key in view


@pytest.mark.parametrize(("kind", "accepted", "reason", "detail", "status"), [
    ("submit", True, None, {}, 201),
    ("cancel", True, None, {}, 200),
    ("requeue", True, None, {}, 200),
    ("submit", None, None, {}, 202),
    ("cancel", False, "no such job", {}, 404),
    ("cancel", False, "job is already succeeded", {}, 409),
    ("requeue", False, "job is queued, not interrupted", {}, 409),
    ("requeue", False, "below the minimum", {"consumed_seconds": 100, "minimum_seconds": 160, "given_seconds": 1}, 422),
    ("requeue", False, "ceiling 90 is below the minimum 160", {}, 422),
    ("requeue", False, "budget service unavailable", {}, 503),
], ids=lambda v: str(v))
def test_outcome_to_status(kind, accepted, reason, detail, status):
    assert status_for(kind, accepted, reason, detail) == status


def test_eta_falls_back_to_the_budget_services_measurement_while_running():
    job = {"id": "j", "state": "running", "spec": {"checkpoint_every_steps": 10}, "last_step": 5}
    budget = {"checkpoint": {"next_eta_seconds": 4.5}}
    assert job_view(job, budget=budget)["checkpoint"]["next_eta_seconds"] == 4.5
    assert job_view({**job, "state": "queued"}, budget=budget)["checkpoint"]["next_eta_seconds"] is None
    assert job_view({**job, "step_seconds": 1.0}, budget=budget)["checkpoint"]["next_eta_seconds"] == 5.0


def test_an_accepted_requeue_shows_its_ceiling_before_the_budget_service_has_heard_of_it():
    history = [{"ceiling_seconds": 12.0, "actor": "alice", "at": "t0"}, {"ceiling_seconds": 140.0, "actor": "ops",
                                                                         "at": "t1"}]
    job = {"id": "j", "state": "queued", "spec": {"gpu_ceiling_seconds": 140.0}, "ceiling_history": history}
    lagging = {"ceiling_seconds": 12.0, "consumed_seconds": 13.5, "remaining_seconds": 0, "overshoot_seconds": 1.5,
               "ceiling_history": [{"ceiling_seconds": 12.0, "actor": "alice", "consumed_seconds": 0.0, "at": "t0"}]}
    block = job_view(job, budget=lagging)["budget"]
    assert block["ceiling_seconds"] == 140.0 and block["remaining_seconds"] == 126.5
    assert block["consumed_seconds"] == 13.5 and block["overshoot_seconds"] == 1.5  # the ledger's, untouched
    assert [h["ceiling_seconds"] for h in block["ceiling_history"]] == [12.0, 140.0]
    assert block["ceiling_history"][0]["consumed_seconds"] == 0.0  # the budget service's entry where it has one
    caught_up = {**lagging, "ceiling_seconds": 140.0, "remaining_seconds": 126.5,
                 "ceiling_history": [*lagging["ceiling_history"], {"ceiling_seconds": 140.0, "actor": "ops",
                                                                   "consumed_seconds": 13.5, "at": "t1"}]}
    got = job_view(job, budget=caught_up)["budget"]
    assert {k: got[k] for k in caught_up if k != "ceiling_history"} == {
        k: v for k, v in caught_up.items() if k != "ceiling_history"} and got["warning"] is None
    assert [{k: v for k, v in h.items() if k != "previous_ceiling_seconds"} for h in got["ceiling_history"]
            ] == caught_up["ceiling_history"]
    assert [h["previous_ceiling_seconds"] for h in got["ceiling_history"]] == [None, 12.0]  # from what to what
    assert got["provisional_seconds"] == 0 and got["consumed_live_seconds"] == 13.5  # queued: nothing running


def test_the_job_view_shows_every_attempt_cause_even_for_a_job_stored_before_hand_backs_were_counted():
    old = {"training_error": 1, "transport_lost": 2, "node_failure": 0, "gang_timeout": 0}
    view = job_view({"id": "j", "state": "queued", "spec": {}, "attempts": old})
    assert view["attempts"] == {**old, "handed_back": 0, "preempted": 0, "health_check": 0}
    assert job_view({"id": "j", "state": "queued", "spec": {}, "attempts": {**old, "handed_back": 3}}
                    )["attempts"]["handed_back"] == 3
