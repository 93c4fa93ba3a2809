"""The control plane's status view (services/gateway/domain/status.py, teto/cli_status.py): replicas and
singleton holders per service, NATS members and stream replicas, lag per durable, the database, executors by
state, and each problem named."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.status import ConsumerLag, ReplicaStatus
from services.gateway.domain.status import (BusView, DatabaseView, Peer, StreamView, consumers_view,
                                            executor_state, nats_view, services_view, summarize)
from teto.cli_status import render

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SERVICES = ("gateway", "queue")


def replica(service: str, instance: str, *, runs=(), leads=(), lag=()) -> ReplicaStatus:
    return ReplicaStatus(service=service, instance=instance, started_at=T0, singletons=list(runs),
                         leading=list(leads), consumers=list(lag), nats_server="n1")


def lag(durable: str, pending: int, at: datetime) -> ConsumerLag:
    return ConsumerLag(durable=durable, stream="HB", pending=pending, ack_pending=1, sampled_at=at)


def test_each_singleton_names_the_replica_holding_it():
    view, problems = services_view([replica("queue", "a", runs=["queue-outbox", "queue-placement"],
                                            leads=["queue-outbox", "queue-placement"]),
                                    replica("queue", "b", runs=["queue-outbox", "queue-placement"]),
                                    replica("gateway", "g")], SERVICES)
    assert problems == []
    assert [r["instance"] for r in view["queue"]["replicas"]] == ["a", "b"]
    assert view["queue"]["singletons"] == {"queue-outbox": "a", "queue-placement": "a"}
    assert view["gateway"]["singletons"] == {}


def test_a_service_without_replicas_a_singleton_nobody_holds_and_a_double_holder_are_problems():
    view, problems = services_view([replica("queue", "a", runs=["queue-outbox", "queue-scanner"],
                                            leads=["queue-scanner"]),
                                    replica("queue", "b", runs=["queue-outbox", "queue-scanner"],
                                            leads=["queue-scanner"])], SERVICES)
    assert view["gateway"]["replicas"] == []
    assert view["queue"]["singletons"] == {"queue-outbox": None, "queue-scanner": ["a", "b"]}
    assert problems == ["gateway: no replica answered", "queue: nobody holds singleton queue-outbox",
                        "queue: singleton queue-scanner held by 2 replicas: a, b"]


def test_a_replica_serving_no_metrics_is_a_problem_naming_it_and_why():
    held = replica("queue", "b").model_copy(update={"metrics_error": "port 40569 on 127.0.0.1: Address in use"})
    view, problems = services_view([replica("queue", "a").model_copy(update={"metrics_port": 40570}), held,
                                    replica("gateway", "g")], SERVICES)
    assert problems == ["queue: replica b serves no metrics: port 40569 on 127.0.0.1: Address in use"]
    assert [(r["metrics_port"], r["metrics_error"]) for r in view["queue"]["replicas"]] == \
        [(40570, None), (None, "port 40569 on 127.0.0.1: Address in use")]


def test_lag_per_durable_is_the_freshest_sample_of_any_replica():
    out = consumers_view([replica("queue", "a", lag=[lag("queue-heartbeats", 5, T0)]),
                          replica("queue", "b", lag=[lag("queue-heartbeats", 2, T0 + timedelta(seconds=3))])])
    assert out == [{"service": "queue", "durable": "queue-heartbeats", "stream": "HB", "pending": 2,
                    "ack_pending": 1, "sampled_at": (T0 + timedelta(seconds=3)).isoformat(), "sampled_by": "b"}]


def test_a_single_server_stream_is_healthy_with_its_leader_alone():
    view, problems = nats_view(BusView("n1", None, (StreamView("TETO_CMD", 1, 7, "n1"),)))
    assert problems == [] and view["members"] == [{"name": "n1", "online": True, "leads": ["TETO_CMD"]}]


def test_an_offline_replica_a_lagging_one_and_a_leaderless_stream_are_named():
    bus = BusView("n1", "teto", (
        StreamView("TETO_CMD", 3, 7, "n1", (Peer("n2"), Peer("n3", current=False, offline=True))),
        StreamView("TETO_JOB", 3, 2, "n2", (Peer("n1", current=False, lag=4), Peer("n3", offline=True))),
        StreamView("TETO_HB", 3, 0, None, (Peer("n1"), Peer("n2"))),
    ))
    view, problems = nats_view(bus)
    members = {m["name"]: m for m in view["members"]}
    assert members["n3"]["online"] is False and members["n2"]["online"] is True
    assert members["n1"]["leads"] == ["TETO_CMD"] and members["n2"]["leads"] == ["TETO_JOB"]
    assert problems == ["stream TETO_CMD: replica on n3 is offline", "stream TETO_JOB: replica on n1 is behind "
                        "(4 operations)", "stream TETO_JOB: replica on n3 is offline", "stream TETO_HB: no leader",
                        "stream TETO_HB: 2 of 3 replicas"]


def test_a_server_leading_a_stream_is_online_even_if_another_stream_lists_it_offline():
    bus = BusView("n1", "teto", (StreamView("A", 2, 0, "n1", (Peer("n2", offline=True),)),
                                 StreamView("B", 2, 0, "n2", (Peer("n1"),))))
    view, _ = nats_view(bus)
    assert {m["name"]: m["online"] for m in view["members"]} == {"n1": True, "n2": True}


@pytest.mark.parametrize("row, state", [
    ({"signal": "no_signal", "job_id": "j1", "accepting": False}, "no_signal"),
    ({"signal": "ok", "job_id": "j1", "accepting": False}, "busy"),
    ({"signal": "ok", "job_id": None, "accepting": True}, "idle"),
    ({"signal": None, "job_id": None, "accepting": False}, "not_accepting"),
], ids=["silent", "busy", "idle", "not-accepting"])
def test_executor_state(row, state):
    assert executor_state(row) == state


def test_a_healthy_control_plane_is_ok_and_an_unreachable_database_is_not():
    replies = [replica("queue", "a", runs=["queue-outbox"], leads=["queue-outbox"]), replica("gateway", "g")]
    bus = BusView("n1", None, (StreamView("TETO_CMD", 1, 0, "n1"),))
    execs = [{"signal": "ok", "job_id": None, "accepting": True}, {"signal": "no_signal"}]
    ok = summarize(replies, bus, DatabaseView(True, 0.4), execs[:1], expected=SERVICES).as_dict()
    assert ok["ok"] is True and ok["executors"] == {"total": 1, "by_state": {"idle": 1}}
    bad = summarize(replies, BusView("n1", None, error="TimeoutError: "), DatabaseView(False, error="refused"),
                    execs, expected=SERVICES).as_dict()
    assert bad["ok"] is False
    assert bad["problems"] == ["NATS: TimeoutError: ", "database unreachable: refused", "1 executor(s) without signal"]


def test_the_cli_shows_the_verdict_first_then_every_part():
    replies = [replica("queue", "a", runs=["queue-outbox"], leads=[], lag=[lag("queue-heartbeats", 3, T0)])]
    bus = BusView("n1", "teto", (StreamView("TETO_CMD", 3, 9, "n1", (Peer("n2"), Peer("n3", offline=True))),))
    text = render(summarize(replies, bus, DatabaseView(True, 1.5), [], expected=("queue",)).as_dict())
    lines = text.splitlines()
    assert lines[0] == "control plane: 2 problem(s)"
    assert "  ! queue: nobody holds singleton queue-outbox" in lines
    assert "           singleton queue-outbox: NOBODY" in lines
    assert "  member n3: OFFLINE, leads 0 stream(s)" in lines
    assert "  stream TETO_CMD: R3, leader n1, followers n2, n3 OFFLINE, 9 message(s)" in lines
    assert any(line.split() == ["queue", "queue-heartbeats", "3", "/", "1"] for line in lines)
    assert "database: reachable (1.5 ms)" in lines and lines[-1] == "executors: 0"
