"""The live feed's rules: which bus message becomes which panel event, and who receives it."""

from __future__ import annotations

import pytest

from services.gateway.auth import Principal, Role
from services.gateway.panel import feed

pytestmark = pytest.mark.unit

OPERATOR = Principal("t1", "olga", Role.OPERATOR)
ANA = Principal("t2", "ana", Role.SUBMITTER)


@pytest.mark.parametrize(("stream", "subject", "body", "kind"), [
    ("JOB", "teto.job.j1.started", {"schema": "teto.job.event/1", "job_id": "j1", "state": "running"}, "job"),
    ("JOB", "teto.job.j1.signal", {"schema": "teto.job.signal/1", "job_id": "j1", "signal": "stuck"}, "signal"),
    ("PROGRESS", "teto.progress.j1.e1", {"kind": "step", "job_id": "j1", "step": 5, "loss": 1.5}, "step"),
    ("PROGRESS", "teto.progress.j1.e1", {"kind": "checkpoint", "job_id": "j1", "step": 50}, "checkpoint"),
    ("PROGRESS", "teto.progress.j1.e1", {"kind": "exited", "job_id": "j1"}, "progress"),
    ("HB", "teto.hb.e1", {"executor_id": "e1", "phase": "training"}, "executor"),
    ("BUDGET", "teto.budget.j1.exhausted", {"job_id": "j1", "event": "exhausted"}, "budget"),
    ("NODE", "teto.node.n1.ready", {"node_id": "n1", "state": "ready"}, "node"),
    ("NODE", "teto.check.r1.result.e1", {"run_id": "r1", "node_id": "n1"}, "check"),
    ("USAGE", "teto.usage.e1", {}, None)], ids=lambda v: v if isinstance(v, str) else None)
def test_each_stream_maps_to_its_event_type(stream, subject, body, kind):
    event = feed.to_event(stream, subject, body)
    assert (event or {}).get("type") == kind


def test_only_shown_fields_travel():
    body = {"kind": "step", "job_id": "j1", "step": 5, "loss": 1.5, "step_seconds": 0.2, "epoch": 3,
            "metrics": {"acc": 1.0}, "executor_id": "e1", "env": {"TOKEN": "x"}}
    event = feed.to_event("PROGRESS", "teto.progress.j1.e1", body)
    assert event == {"type": "step", "kind": "step", "job_id": "j1", "step": 5, "loss": 1.5, "step_seconds": 0.2,
                     "executor_id": "e1"}
    heartbeat = feed.to_event("HB", "teto.hb.e1", {"executor_id": "e1", "gpus": [{"index": 0}], "usage": {"x": 1},
                                                  "job_id": "j1", "step": 7, "phase": "training"})
    assert "gpus" not in heartbeat and "usage" not in heartbeat and heartbeat["step"] == 7


def test_who_reads_all_gets_every_event():
    event = {"type": "step", "job_id": "j1", "step": 5}
    assert feed.scoped(event, OPERATOR, "ana", sees_all=True) == event


def test_a_tenant_gets_its_own_jobs_events_and_nobody_elses():
    event = {"type": "signal", "job_id": "j1", "signal": "stuck"}
    assert feed.scoped(event, ANA, "ana", sees_all=False) == event
    assert feed.scoped(event, ANA, "bob", sees_all=False) is None
    assert feed.scoped(event, ANA, None, sees_all=False) is None  # an unknown owner is not the principal


def test_a_tenant_sees_a_busy_executor_without_whose_job():
    beat = {"type": "executor", "executor_id": "e1", "job_id": "j1", "step": 9, "phase": "training"}
    assert feed.scoped(beat, ANA, "bob", sees_all=False) == {"type": "executor", "executor_id": "e1",
                                                             "phase": "training"}
    assert feed.scoped(beat, ANA, "ana", sees_all=False) == beat


def test_fleet_events_reach_every_reader():
    node = {"type": "node", "node_id": "n1", "state": "ready"}
    assert feed.scoped(node, ANA, None, sees_all=False) == node


def test_a_tab_following_one_job_gets_only_that_jobs_events():
    assert feed.scoped({"type": "step", "job_id": "j2"}, OPERATOR, "x", sees_all=True, only_job="j1") is None
    assert feed.scoped({"type": "step", "job_id": "j1"}, OPERATOR, "x", sees_all=True, only_job="j1") is not None
    assert feed.scoped({"type": "executor", "executor_id": "e"}, OPERATOR, None, sees_all=True,
                       only_job="j1") is not None
