"""The panel's status page (services/gateway/panel/pages/status.py): the control plane's own health as
``GET /v1/status`` gathers it, for fleet managers only, the verdict and every problem first, each part shown as
a person reads it, in both languages, server strings escaped, and the view answered alone for its refresh."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from libs.contracts.status import ConsumerLag, ReplicaStatus
from services.gateway.domain.status import BusView, DatabaseView, Peer, StreamView, summarize
from tests.unit.test_panel_ops_web import as_, ops, text_of  # noqa: F401 - ops is the fixture
from tests.unit.test_panel_web import HOSTILE

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def replica(service: str, instance: str, *, runs=(), leads=(), **more) -> ReplicaStatus:
    return ReplicaStatus(service=service, instance=instance, started_at=T0, singletons=list(runs),
                         leading=list(leads), nats_server="node-1", **more)


class Gatherer:
    def __init__(self, healthy: bool) -> None:
        self.healthy, self.asked = healthy, 0

    async def status(self):
        self.asked += 1
        lag = [ConsumerLag(durable="queue-heartbeats", stream="TETO_HB", pending=1234, ack_pending=7, sampled_at=T0)]
        if self.healthy:
            replies = [replica("queue", "queue-1", runs=["queue-placement"], leads=["queue-placement"],
                               metrics_port=21001, consumers=lag),
                       replica("queue", "queue-2", runs=["queue-placement"], metrics_port=21002),
                       replica("gateway", "gateway-1", metrics_port=21003)]
            bus = BusView("node-1", "teto", (StreamView("TETO_CMD", 3, 42, "node-1", (Peer("node-2"), Peer("node-3"))),))
            return summarize(replies, bus, DatabaseView(True, 0.8), [{"signal": "ok", "job_id": "j1"}],
                             expected=("gateway", "queue"))
        replies = [replica("queue", "queue-1", runs=["queue-placement"], metrics_error=f"port 21001: {HOSTILE}")]
        bus = BusView("node-1", "teto", (StreamView("TETO_CMD", 3, 42, "node-1",
                                                   (Peer("node-2", current=False, lag=5), Peer("node-3", offline=True))),))
        return summarize(replies, bus, DatabaseView(False, error="connection refused"),
                         [{"signal": "no_signal", "job_id": "j1"}], expected=("gateway", "queue"))


def test_a_healthy_control_plane_reads_ok_with_every_replica_its_singletons_members_and_lag(ops):
    client, secrets, _, _ = ops
    client.app.state.status = Gatherer(healthy=True)
    as_(client, secrets, "olga")
    page = client.get("/status", headers={"Accept-Language": "en"}).text
    text = text_of(page)
    assert 'data-ok="1"' in page[page.index('id="status-verdict"'):][:400] and "Control plane OK" in text
    assert 'id="status-problems"' not in page
    assert 'data-replica="queue-1"' in page and 'data-replica="queue-2"' in page and ":21002" in text
    holder = page[page.index('data-singleton="queue-placement"'):].split("</tr>")[0]
    assert "queue-1" in holder and "Nobody" not in holder
    assert "This gateway is connected to node-1" in text and "cluster teto" in text
    members = {m: page[page.index(f'data-member="{m}"'):].split("</tr>")[0] for m in ("node-1", "node-2", "node-3")}
    assert all("Online" in row for row in members.values())
    stream = page[page.index('data-stream="TETO_CMD"'):].split("</tr>")[0]
    assert "R3" in stream and stream.count("Current") == 2
    lag = page[page.index('data-durable="queue-heartbeats"'):].split("</tr>")[0]
    assert "1,234" in lag and ">7<" in lag
    assert "Reachable" in text and "answered in 0.8 ms" in text and "1 executor(s) · busy 1" in text
    # Refreshed alone every 10 s, on no event (its fragment is the same view without the layout).
    assert 'data-fragment="/status?fragment=1" data-refresh-on="" data-refresh-every="10"' in page
    fragment = client.get("/status?fragment=1").text
    assert "<html" not in fragment and 'id="status-verdict"' in fragment


def test_every_problem_is_listed_first_and_each_part_shows_what_is_wrong_in_portuguese(ops):
    client, secrets, _, _ = ops
    client.app.state.status = Gatherer(healthy=False)
    as_(client, secrets, "adm")
    page = client.get("/status", headers={"Accept-Language": "pt-BR"}).text
    text = text_of(page)
    assert 'data-ok="0"' in page[page.index('id="status-verdict"'):][:400]
    problems = re.findall(r"<li>(.*?)</li>", page[page.index('id="status-problems"'):].split("</ul>")[0], re.S)
    # In the page's words; ids, names and the errors quoted as the server has them (words.problem).
    assert len(problems) >= 6 and "gateway: nenhuma réplica respondeu" in problems
    assert any(p.startswith("queue: a réplica queue-1 não serve métricas: port 21001: ") for p in problems)
    assert f"{len(problems)} problema(s)" in text
    assert HOSTILE not in page and "&lt;" in page  # the server's text escaped
    assert "Nenhuma réplica respondeu" in page[page.index('data-service="gateway"'):].split("</tr>")[0]
    assert "Não servida" in page[page.index('data-replica="queue-1"'):].split("</tr>")[0]
    assert "Ninguém o detém" in page[page.index('data-singleton="queue-placement"'):].split("</tr>")[0]
    stream = page[page.index('data-stream="TETO_CMD"'):].split("</tr>")[0]
    assert "Atrasado (5 operações)" in stream and "Fora do ar" in stream
    assert "Fora do ar" in page[page.index('data-member="node-3"'):].split("</tr>")[0]
    assert "Inacessível" in text and "connection refused" in text and "sem sinal 1" in text
    keys = re.findall(r"\b(common|status)\.[a-z][a-z0-9_-]+\b", text)
    assert not keys


def test_the_page_is_for_fleet_managers_as_the_api_and_says_so_without_a_bus(ops):
    client, secrets, _, _ = ops
    gatherer = Gatherer(healthy=True)
    client.app.state.status = gatherer
    for actor in ("vera", "ana", "rui"):
        as_(client, secrets, actor)
        assert client.get("/status").status_code == 403, actor
        assert 'href="/status"' not in client.get("/jobs").text, actor
    assert gatherer.asked == 0
    as_(client, secrets, "olga")
    assert 'href="/status"' in client.get("/jobs").text
    client.app.state.status = None
    page = client.get("/status", headers={"Accept-Language": "en"}).text
    assert "Status unavailable: this gateway is not connected to the bus" in text_of(page)


def test_the_dead_letters_each_service_keeps_are_counted_with_links_and_a_failed_count_says_why(ops):
    client, secrets, _, _ = ops
    client.app.state.status = Gatherer(healthy=True)

    class Letters:
        def __init__(self, counts) -> None:
            self.answer = counts

        async def counts(self) -> dict[str, int]:
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    as_(client, secrets, "olga")
    client.app.state.dead_letters = Letters({"budget": 1, "queue": 2})
    page = client.get("/status", headers={"Accept-Language": "en"}).text
    dead = page[page.index('id="status-dead"'):].split("</p>")[0]
    assert "3 kept, to read and replay" in dead and 'href="/dead-letters"' in dead
    assert 'href="/dead-letters?service=queue"' in dead and 'data-ok="1"' in page  # kept letters are no problem
    client.app.state.dead_letters = Letters(TimeoutError("no answer"))
    page = client.get("/status?fragment=1", headers={"Accept-Language": "pt-BR"}).text
    dead = page[page.index('id="status-dead"'):].split("</p>")[0]
    assert "Ilegível" in dead and "TimeoutError: no answer" in dead
    client.app.state.dead_letters = None
    assert 'id="status-dead"' not in client.get("/status").text
