"""An executor's row when its job has left it, when it is a zombie, and when the row ends
(services/gateway/domain/departures.py, views.executor_view): issue 26, a frozen executor's row kept showing the
job as `training` while it ran elsewhere, and its "Zombie" row stayed for good."""

from __future__ import annotations

import pytest

from services.gateway.domain.departures import is_zombie, job_left, row_ended
from services.gateway.domain.views import executor_view

pytestmark = pytest.mark.unit

FROZEN = {"executor_id": "ex-1", "node_id": "n1", "phase": "training", "step": 95, "job_id": "j1", "epoch": 3,
          "signal": "no_signal"}
QUEUE_RUN = {"job_id": "j1", "epoch": 3}  # no end report from a frozen agent: the queue's row still names its run


def test_a_job_granted_again_elsewhere_has_left_the_frozen_executor():
    job = {"id": "j1", "state": "running", "lease_epoch": 4, "executor_id": "ex-2"}
    assert job_left(FROZEN, job) == {"job_id": "j1", "epoch": 3, "job_state": "running", "job_epoch": 4,
                                     "job_executor_id": "ex-2"}
    assert job_left({**FROZEN, "signal": "ok"}, job) is not None  # a newer epoch is enough, heard from or not


def test_a_job_taken_back_from_a_silent_executor_has_left_it():
    queued = {"id": "j1", "state": "queued", "lease_epoch": 3, "executor_id": None}
    assert job_left(FROZEN, queued)["job_executor_id"] is None


@pytest.mark.parametrize("state", ["cancelled", "queued", "interrupted"])
def test_a_run_still_stopping_on_an_executor_heard_from_is_still_its_own(state):
    # cancel, preemption, ceiling: the job leaves the granted states while its process ends with a checkpoint
    assert job_left({**FROZEN, "signal": "ok"}, {"state": state, "lease_epoch": 3}) is None


def test_the_executors_own_current_run_or_an_unknown_job_has_not_left():
    assert job_left(FROZEN, {"state": "running", "lease_epoch": 3, "executor_id": "ex-1"}) is None
    assert job_left(FROZEN, None) is None
    assert job_left({**FROZEN, "job_id": None}, {"state": "running", "lease_epoch": 9}) is None


def test_the_view_says_the_job_left_and_no_longer_shows_it_training():
    job = {"id": "j1", "state": "running", "lease_epoch": 4, "executor_id": "ex-2"}
    view = executor_view(FROZEN, stale_reports={}, stale_heartbeats={}, queue_run=QUEUE_RUN, job=job)
    assert (view["job_id"], view["phase"], view["step"], view["job_source"]) == (None, None, None, "left")
    assert view["left_job"]["job_executor_id"] == "ex-2" and view["zombie"] is False
    # The agent wakes and sends under its lost lease: a zombie while it still names that run.
    woke = executor_view({**FROZEN, "signal": "ok"}, stale_reports={"ex-1": 2}, stale_heartbeats={"ex-1": 1},
                         queue_run=QUEUE_RUN, job=job)
    assert woke["zombie"] is True and woke["stale_reports"] == 2
    # It stopped that run: idle, the counts stay as history, no zombie any more.
    idle = executor_view({**FROZEN, "signal": "ok", "phase": "idle", "job_id": None, "epoch": None, "step": None},
                         stale_reports={"ex-1": 2}, stale_heartbeats={"ex-1": 1}, queue_run=None, job=None)
    assert (idle["zombie"], idle["left_job"], idle["stale_reports"]) == (False, None, 2)


def test_a_granted_executor_is_never_shown_as_left():
    job = {"id": "j1", "state": "running", "lease_epoch": 4, "executor_id": "ex-1"}
    view = executor_view(FROZEN, stale_reports={}, stale_heartbeats={}, grant={"job_id": "j1", "epoch": 4},
                         queue_run=QUEUE_RUN, job=job)
    assert (view["job_id"], view["job_source"], view["left_job"]) == ("j1", "grant", None)


@pytest.mark.parametrize(("stale", "left", "zombie"), [(0, None, False), (3, None, False), (0, {"job_id": "j"}, False),
                                                       (3, {"job_id": "j"}, True), (1, {"job_id": None}, True)])
def test_a_zombie_sent_under_a_lost_lease_and_still_names_that_run(stale, left, zombie):
    assert is_zombie({"stale_reports": stale, "stale_heartbeats": 0, "left_job": left}) is zombie


@pytest.mark.parametrize(("state", "ended"), [("gone", True), ("replaced", True), ("ready", False),
                                              ("failed", False), ("drained", False), (None, False)])
def test_the_row_ends_when_the_health_service_gave_the_node_up(state, ended):
    assert row_ended(state) is ended
