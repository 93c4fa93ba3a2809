"""The panel's dead letters page (services/gateway/panel/pages/dead_letters.py): what each service gave up on, with
why and what it carried (hostile text escaped, sealed secrets redacted, a cut payload not replayable), counts per
service as filters, pages by sequence, for fleet managers only, in both languages; Replay is the audited API."""

from __future__ import annotations

import re

import pytest

from libs.contracts.dead import DeadCause, dead_letter
from tests.unit.test_panel_ops_web import as_, ops, text_of  # noqa: F401 - ops is the fixture
from tests.unit.test_panel_web import HOSTILE

pytestmark = pytest.mark.unit

SEALED = b'{"schema": "teto.cmd.submit/1", "spec": {"env": {"S": {"sealed": "v1.CIPHERTEXT"}}}}'
LETTERS = {
    3: dead_letter(service="queue", consumer="queue-submit", cause=DeadCause.PERMANENT, reason=f"refused: {HOSTILE}",
                   subject="teto.cmd.submit", payload=SEALED, deliveries=1, stream_seq=41),
    7: dead_letter(service="health", consumer="health-heartbeats", cause=DeadCause.MALFORMED,
                   reason="not JSON: Expecting value", subject="teto.hb.ex-1", payload=HOSTILE.encode(),
                   deliveries=1, stream_seq=9),
    9: dead_letter(service="health", consumer="health-heartbeats", cause=DeadCause.EXHAUSTED, reason="timeout",
                   subject="teto.hb.ex-2", payload=b"x" * 300_000, deliveries=5),
}


class Letters:
    prefix = "teto"

    def __init__(self) -> None:
        self.asked: list[dict] = []

    async def list(self, *, service, after_seq, limit):
        self.asked.append({"service": service, "after_seq": after_seq, "limit": limit})
        found = [(seq, letter) for seq, letter in sorted(LETTERS.items())
                 if seq > after_seq and (service is None or letter.service == service)]
        return found[:limit]

    async def counts(self) -> dict[str, int]:
        return {"health": 2, "queue": 1}


@pytest.fixture
def letters(ops):  # noqa: F811 - the fixture above, extended
    client, secrets, _, _ = ops
    client.app.state.dead_letters = fake = Letters()
    return client, secrets, fake


def row(page: str, seq: int) -> str:
    return page[page.index(f'data-seq="{seq}"'):].split("</tr>")[0]


def test_each_letter_shows_why_where_from_and_what_it_carried_escaped_and_redacted(letters):
    client, secrets, fake = letters
    as_(client, secrets, "olga")
    page = client.get("/dead-letters", headers={"Accept-Language": "en"}).text
    assert fake.asked == [{"service": None, "after_seq": 0, "limit": 50}]
    assert [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', page)] == [3, 7, 9]
    assert "All (3)" in text_of(page) and 'href="/dead-letters?service=health"' in page
    first = row(page, 3)
    assert "Refused for good" in first and "queue-submit" in first and "teto.cmd.submit" in first
    assert "stream sequence 41" in first and 'data-action="replay"' in first
    assert "CIPHERTEXT" not in page and "redacted" in first  # a sealed secret never reaches the page
    assert HOSTILE not in page and "&lt;" in row(page, 7) and "Malformed" in row(page, 7)
    # A heartbeat is its executor's to publish: no Replay button, and why (the gateway publishes commands).
    assert 'data-action="replay"' not in row(page, 7) and "Only its sender may publish it again" in row(page, 7)
    assert "only the part that sent it may publish" in row(page, 7)
    cut = row(page, 9)
    assert "Out of deliveries" in cut and "300,000 bytes" in cut and "cut" in cut
    assert 'data-action="replay"' not in cut and "Cut: cannot be replayed" in cut
    assert '<script src="/static/dead_letters.js" defer></script>' in page


def test_a_service_filters_and_a_full_page_leads_to_the_next(letters, monkeypatch):
    from services.gateway.panel.pages import dead_letters

    client, secrets, fake = letters
    as_(client, secrets, "adm")
    page = client.get("/dead-letters?service=health", headers={"Accept-Language": "pt-BR"}).text
    assert fake.asked[-1] == {"service": "health", "after_seq": 0, "limit": 50}
    assert [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', page)] == [7, 9]
    assert "Mensagens mortas" in text_of(page) and "Malformada" in page and "Entregas esgotadas" in page
    assert not re.findall(r"\b(common|dead)\.[a-z][a-z0-9_-]+\b", text_of(page))
    monkeypatch.setattr(dead_letters, "PAGE_SIZE", 2)
    page = client.get("/dead-letters").text
    assert 'href="/dead-letters?after_seq=7"' in page
    page = client.get("/dead-letters?after_seq=7").text
    assert [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', page)] == [9] and "dead-next" not in page
    assert client.get("/dead-letters?service=Bad%20Name").status_code == 422


def test_only_fleet_managers_see_them_and_without_a_bus_the_page_says_so(letters):
    client, secrets, fake = letters
    for actor in ("vera", "ana", "rui"):
        as_(client, secrets, actor)
        assert client.get("/dead-letters").status_code == 403, actor
        assert 'href="/dead-letters"' not in client.get("/jobs").text
    assert fake.asked == []
    as_(client, secrets, "olga")
    assert 'href="/dead-letters"' in client.get("/jobs").text
    client.app.state.dead_letters = None
    page = client.get("/dead-letters", headers={"Accept-Language": "en"}).text
    assert "this gateway is not connected to the bus" in text_of(page)
