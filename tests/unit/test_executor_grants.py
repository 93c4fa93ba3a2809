"""The executor list shows the job the queue granted at once (not one heartbeat later), so a job naming its
executor and that executor naming the job agree at every moment (services/gateway/domain/views.py)."""

from __future__ import annotations

import pytest

from services.gateway.domain.views import executor_view, grants_by_executor

pytestmark = pytest.mark.unit

IDLE = {"executor_id": "e1", "node_id": "n1", "phase": "idle", "job_id": None, "epoch": None, "step": None,
        "signal": "ok"}


def _view(row, grant=None):
    return executor_view(row, stale_reports={}, stale_heartbeats={}, grant=grant)


@pytest.mark.parametrize("state", ["running", "admitting"])
def test_a_granted_job_is_held_by_its_executor(state):
    jobs = [{"id": "j1", "state": state, "executor_id": "e1", "lease_epoch": 3, "gang": []}]
    assert grants_by_executor(jobs) == {"e1": {"job_id": "j1", "epoch": 3}}


@pytest.mark.parametrize("state", ["queued", "backoff", "interrupted", "succeeded", "failed", "cancelled"])
def test_a_job_not_running_holds_no_executor(state):
    # executor_id stays on a finished job as history (its last run's rank 0): it is not a grant.
    assert grants_by_executor([{"id": "j1", "state": state, "executor_id": "e1", "lease_epoch": 3}]) == {}


def test_every_rank_of_a_gang_holds_the_job_until_its_process_ended():
    gang = [{"rank": 0, "executor_id": "e1", "ended": None}, {"rank": 1, "executor_id": "e2", "ended": None},
            {"rank": 2, "executor_id": "e3", "ended": "failed"}]
    jobs = [{"id": "g1", "state": "admitting", "executor_id": "e1", "lease_epoch": 2, "gang": gang}]
    assert grants_by_executor(jobs) == {"e1": {"job_id": "g1", "epoch": 2}, "e2": {"job_id": "g1", "epoch": 2}}


def test_an_idle_executor_with_a_grant_shows_the_job_starting_from_the_grant():
    out = _view(IDLE, {"job_id": "j1", "epoch": 3})
    assert (out["job_id"], out["epoch"], out["phase"], out["step"], out["job_source"]) == ("j1", 3, "starting",
                                                                                          None, "grant")
    assert out["signal"] == "ok" and out["stale_reports"] == 0


def test_once_a_heartbeat_names_the_granted_job_and_epoch_the_heartbeat_stands():
    row = {**IDLE, "phase": "training", "job_id": "j1", "epoch": 3, "step": 40}
    out = _view(row, {"job_id": "j1", "epoch": 3})
    assert (out["job_id"], out["phase"], out["step"], out["job_source"]) == ("j1", "training", 40, "heartbeat")


def test_a_heartbeat_of_an_older_epoch_of_the_same_job_gives_way_to_the_grant():
    row = {**IDLE, "phase": "training", "job_id": "j1", "epoch": 2, "step": 90}
    out = _view(row, {"job_id": "j1", "epoch": 3})
    assert (out["epoch"], out["phase"], out["step"], out["job_source"]) == (3, "starting", None, "grant")


def test_without_a_grant_the_heartbeat_is_shown_as_it_is():
    assert _view(IDLE)["job_source"] is None and _view(IDLE)["job_id"] is None
    row = {**IDLE, "phase": "stopping", "job_id": "j9", "epoch": 1, "step": 5}
    out = _view(row)
    assert (out["job_id"], out["phase"], out["step"], out["job_source"]) == ("j9", "stopping", 5, "heartbeat")


def test_a_node_names_the_job_granted_to_its_executor_and_otherwise_what_its_heartbeat_said():
    from services.gateway.domain.views import node_view

    row = {"node_id": "n1", "executor_id": "e1", "state": "ready", "job_id": None}
    assert node_view(row, {"job_id": "j1", "epoch": 3})["job_id"] == "j1"
    assert node_view({**row, "job_id": "j0"}, None)["job_id"] == "j0"
    assert node_view(row, None) == row


TRAINING = {**IDLE, "phase": "training", "job_id": "j1", "epoch": 3, "step": 40}


def test_a_run_the_executor_reported_ended_is_shown_over_before_its_next_heartbeat():
    # The queue's row was cleared by the end report (executors.free_ended): no job; health's still says training.
    out = executor_view(TRAINING, stale_reports={}, stale_heartbeats={}, grant=None,
                        queue_run={"job_id": None, "epoch": None})
    assert (out["job_id"], out["epoch"], out["phase"], out["step"], out["job_source"]) == (None, None, "idle", None,
                                                                                          "report")
    assert out["signal"] == "ok"  # the executor's own signal is its heartbeats', kept


@pytest.mark.parametrize("queue_run", [{"job_id": "j0", "epoch": 1}, {"job_id": "j1", "epoch": 2}])
def test_a_queue_row_that_moved_on_to_another_run_also_ends_the_one_the_heartbeat_names(queue_run):
    from services.gateway.domain.views import run_ended

    assert run_ended(TRAINING, None, queue_run)


def test_a_run_still_named_by_the_queue_or_granted_or_unknown_to_it_is_shown_as_the_heartbeat_says():
    from services.gateway.domain.views import run_ended

    stopping = {**TRAINING, "phase": "stopping"}  # cancelled: no grant, the process still stopping
    assert not run_ended(stopping, None, {"job_id": "j1", "epoch": 3})
    out = executor_view(stopping, stale_reports={}, stale_heartbeats={}, queue_run={"job_id": "j1", "epoch": 3})
    assert (out["job_id"], out["phase"], out["job_source"]) == ("j1", "stopping", "heartbeat")
    assert not run_ended(TRAINING, {"job_id": "j1", "epoch": 3}, {"job_id": None, "epoch": None})  # granted
    assert not run_ended(TRAINING, None, None)  # the queue has no row for it (yet): as the heartbeat says
    assert not run_ended(IDLE, None, {"job_id": None, "epoch": None})  # nothing named, nothing ended


def test_a_node_names_no_job_once_its_executors_run_ended():
    from services.gateway.domain.views import node_view

    row = {"node_id": "n1", "executor_id": "e1", "state": "ready", "job_id": "j1"}
    assert node_view(row, None, {"job_id": None, "epoch": None})["job_id"] is None
    assert node_view(row, None, {"job_id": "j1", "epoch": 3})["job_id"] == "j1"
    assert node_view(row, None, None)["job_id"] == "j1"
    assert node_view(row, {"job_id": "j2", "epoch": 1}, {"job_id": None, "epoch": None})["job_id"] == "j2"
