"""``GET /v1/status`` degrades instead of failing (services/gateway/domain/status.py): a NATS member whose client
port did not answer, a stream whose info did not come back, a replica that answered before and not now, the
bus itself unreachable, executors unreadable: each is a named problem, and every other part is still shown;
the route answers 200 with ``ok: false`` even when gathering itself fails."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from libs.contracts.status import ReplicaStatus
from services.gateway.api import create_app
from services.gateway.auth import Role, issue_token
from services.gateway.domain.status import (BusView, DatabaseView, MemberProbe, Peer, Seen, StreamFailure,
                                            StreamView, executors_view, missing_replicas, nats_view, remember,
                                            summarize, unanswered)
from services.gateway.settings import GatewaySettings
from teto.cli_status import render

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
URLS = ("nats://127.0.0.1:4222", "nats://127.0.0.1:4223", "nats://127.0.0.1:4224")
HEALTHY = (StreamView("TETO_CMD", 3, 5, "node-1", (Peer("node-2"), Peer("node-3"))),)


def replica(service: str, instance: str, started: datetime = T0) -> ReplicaStatus:
    return ReplicaStatus(service=service, instance=instance, started_at=started)


def probes(*down: str) -> tuple[MemberProbe, ...]:
    """The three members' probes; those named in ``down`` refused (their names known from earlier)."""
    return tuple(MemberProbe(url, f"node-{i}", "ConnectionRefusedError: refused" if f"node-{i}" in down else None)
                 for i, url in enumerate(URLS, 1))


# -- NATS members -------------------------------------------------------------------------------------------

def test_every_member_answering_is_healthy_and_shown_with_its_url():
    view, problems = nats_view(BusView("node-1", "teto", HEALTHY, probes=probes()))
    assert problems == []
    assert [(m["name"], m["online"], m["url"]) for m in view["members"]] == [
        ("node-1", True, URLS[0]), ("node-2", True, URLS[1]), ("node-3", True, URLS[2])]


def test_a_member_that_did_not_answer_is_named_and_offline_even_if_stream_infos_still_list_it_current():
    # Just after the kill the survivors' stream infos may not have noticed yet: the probe is the first to know.
    view, problems = nats_view(BusView("node-1", "teto", HEALTHY, probes=probes("node-3")))
    assert problems == [f"nats member node-3 ({URLS[2]}) did not answer: ConnectionRefusedError: refused"]
    assert {m["name"]: m["online"] for m in view["members"]} == {"node-1": True, "node-2": True, "node-3": False}


def test_a_member_never_seen_answering_is_named_by_its_url():
    bus = BusView("node-1", "teto", (), probes=(MemberProbe(URLS[0], "node-1"), MemberProbe(URLS[1], None, "x")))
    view, problems = nats_view(bus)
    assert problems == [f"nats member at {URLS[1]} did not answer: x"]
    assert [m["name"] for m in view["members"]] == ["node-1"]


def test_a_member_never_seen_answering_is_named_when_the_streams_leave_no_doubt():
    # The streams list node-1..3; node-1 and node-2 answered: the silent URL can only be node-3.
    unnamed = (MemberProbe(URLS[0], "node-1"), MemberProbe(URLS[1], "node-2"), MemberProbe(URLS[2], None, "x"))
    view, problems = nats_view(BusView("node-1", "teto", HEALTHY, probes=unnamed))
    assert problems == [f"nats member node-3 ({URLS[2]}) did not answer: x"]
    assert {m["name"]: m["online"] for m in view["members"]}["node-3"] is False
    # Two silent URLs, or two candidates: no guess.
    two = (MemberProbe(URLS[0], "node-1"), MemberProbe(URLS[1], None, "x"), MemberProbe(URLS[2], None, "x"))
    assert nats_view(BusView("node-1", "teto", HEALTHY, probes=two))[1] == [
        f"nats member at {URLS[1]} did not answer: x", f"nats member at {URLS[2]} did not answer: x"]


def test_a_dead_member_that_still_leads_a_stream_in_a_stale_info_is_offline():
    view, problems = nats_view(BusView("node-1", "teto", (StreamView("A", 3, 0, "node-2", (Peer("node-1"),
                                                                                             Peer("node-3"))),),
                                       probes=probes("node-2")))
    assert {m["name"]: m["online"] for m in view["members"]}["node-2"] is False
    assert problems == [f"nats member node-2 ({URLS[1]}) did not answer: ConnectionRefusedError: refused"]


def test_a_stream_whose_info_failed_is_named_and_the_others_still_shown():
    bus = BusView("node-1", "teto", HEALTHY, failed=(StreamFailure("TETO_JOB", "no answer in time"),),
                  probes=probes())
    view, problems = nats_view(bus)
    assert problems == ["stream TETO_JOB: info failed: no answer in time"]
    assert [s["name"] for s in view["streams"]] == ["TETO_CMD", "TETO_JOB"]
    assert view["streams"][1] == {"name": "TETO_JOB", "error": "no answer in time"}


def test_during_a_member_loss_every_symptom_is_named_at_once():
    """What the rehearsal sees a second after killing node-1: its probe refused, a stream it led without a
    leader, one whose info timed out, and another stream's replica on it offline and short of R3."""
    bus = BusView("node-2", "teto", (
        StreamView("TETO_CMD", 3, 5, None, (Peer("node-2"), Peer("node-3"))),
        StreamView("TETO_HB", 3, 9, "node-2", (Peer("node-1", current=False, offline=True),)),
    ), failed=(StreamFailure("TETO_JOB", "no answer in time"),), probes=probes("node-1"))
    _, problems = nats_view(bus)
    assert problems == [f"nats member node-1 ({URLS[0]}) did not answer: ConnectionRefusedError: refused",
                        "stream TETO_CMD: no leader", "stream TETO_CMD: 2 of 3 replicas",
                        "stream TETO_HB: replica on node-1 is offline", "stream TETO_HB: 2 of 3 replicas",
                        "stream TETO_JOB: info failed: no answer in time"]


# -- replicas that answered before --------------------------------------------------------------------------

def test_remember_keeps_who_answered_and_forgets_the_long_silent():
    seen = {("queue", "old"): Seen("queue", "old", T0, T0), ("queue", "q1"): Seen("queue", "q1", T0, T0)}
    now = T0 + timedelta(seconds=121)
    out = remember(seen, [replica("queue", "q1")], now, forget_after=120)
    assert out == {("queue", "q1"): Seen("queue", "q1", T0, now)}
    assert remember(seen, [], T0 + timedelta(seconds=120), forget_after=120) == seen  # not yet


def test_a_replica_that_answered_before_and_not_now_is_named():
    seen = remember({}, [replica("queue", "queue-1"), replica("queue", "queue-2")], T0, 120)
    now = T0 + timedelta(seconds=4)
    assert missing_replicas(seen, [replica("queue", "queue-1")], now) == [
        "queue: replica queue-2 did not answer (last seen 4 s ago)"]
    assert missing_replicas(seen, [replica("queue", "queue-1"), replica("queue", "queue-2")], now) == []


def test_a_replica_replaced_under_a_new_name_is_not_missing():
    # The default instance name is <host>:<pid>: a restarted replica answers under another name.
    seen = remember({}, [replica("queue", "vm:10"), replica("queue", "vm:11")], T0, 120)
    restarted = replica("queue", "vm:12", started=T0 + timedelta(seconds=1))
    assert missing_replicas(seen, [replica("queue", "vm:11"), restarted], T0 + timedelta(seconds=5)) == []
    # One started before the missing one was last seen replaces nothing.
    assert missing_replicas(seen, [replica("queue", "vm:11")], T0 + timedelta(seconds=5)) == [
        "queue: replica vm:10 did not answer (last seen 5 s ago)"]


def test_fewer_replicas_than_before_make_the_answer_not_ok_while_the_rest_is_shown():
    seen = remember({}, [replica("queue", "queue-1"), replica("queue", "queue-2"), replica("gateway", "g")], T0, 120)
    st = summarize([replica("queue", "queue-1"), replica("gateway", "g")],
                   BusView("node-1", "teto", HEALTHY, probes=probes()), DatabaseView(True, 1.0), [],
                   expected=("gateway", "queue"), seen=seen, now=T0 + timedelta(seconds=2)).as_dict()
    assert st["ok"] is False and st["problems"] == ["queue: replica queue-2 did not answer (last seen 2 s ago)"]
    assert [r["instance"] for r in st["services"]["queue"]["replicas"]] == ["queue-1"]
    assert st["nats"]["streams"][0]["leader"] == "node-1" and st["database"]["reachable"] is True


# -- the bus, the executors, the whole answer ---------------------------------------------------------------

def test_the_bus_unreachable_is_one_problem_not_every_service_missing():
    seen = remember({}, [replica("queue", "queue-1")], T0, 120)
    bus = BusView(None, None, error="the gateway is not connected to NATS (reconnecting)", probes=probes("node-1"))
    st = summarize(None, bus, DatabaseView(True, 1.0), [], expected=("gateway", "queue"), seen=seen,
                   now=T0 + timedelta(seconds=1)).as_dict()
    assert st["ok"] is False and st["services"] == {}
    assert st["problems"] == [f"nats member node-1 ({URLS[0]}) did not answer: ConnectionRefusedError: refused",
                              "NATS: the gateway is not connected to NATS (reconnecting)"]


def test_unreadable_executors_are_a_problem_and_shown_as_such():
    assert executors_view("no answer in time") == (
        {"total": None, "by_state": {}, "error": "no answer in time"}, ["executors: unreadable: no answer in time"])


def test_a_failed_gathering_is_an_answer_that_is_not_ok():
    assert unanswered("gathering failed: RuntimeError: x").as_dict()["problems"] == [
        "status: gathering failed: RuntimeError: x"]
    assert unanswered("x").as_dict()["ok"] is False


def test_the_cli_prints_a_degraded_answer_whole():
    bus = BusView("node-2", "teto", HEALTHY, failed=(StreamFailure("TETO_JOB", "no answer in time"),),
                  probes=probes("node-3"))
    st = summarize([replica("queue", "q1")], bus, DatabaseView(False, error="no answer in time"),
                   "no answer in time", expected=("queue",)).as_dict()
    lines = render(st).splitlines()
    assert lines[0] == "control plane: 4 problem(s)"
    assert f"  ! nats member node-3 ({URLS[2]}) did not answer: ConnectionRefusedError: refused" in lines
    assert f"  member node-3: OFFLINE, leads 0 stream(s) ({URLS[2]})" in lines
    assert "  stream TETO_JOB: NO INFO: no answer in time" in lines
    assert "database: UNREACHABLE: no answer in time" in lines
    assert lines[-1] == "executors: UNREADABLE: no answer in time"


def test_the_route_answers_200_not_ok_when_gathering_itself_fails(tmp_path):
    class Broken:
        async def status(self) -> Any:
            raise RuntimeError("boom")

    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    _, token = issue_token(settings.effective_tokens_file, "ops", Role.ADMIN)
    app = create_app(settings)
    app.state.status = Broken()
    with TestClient(app) as client:
        r = client.get("/v1/status", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": False, "problems": ["status: gathering failed: RuntimeError: boom"], "services": {},
                        "nats": {}, "consumers": [], "database": {}, "executors": {}}
