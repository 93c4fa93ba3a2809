"""The usage page (issue 14) inside the gateway, without servers: the report GET /v1/usage answers, shown to the
same people (an organisation's token sees its own organisation only), with period and grouping selectors, locale
formatting, escaped keys and the link to the same report as CSV; and its form's rules, pure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.panel.pages.usage import csv_link, usage_form
from services.gateway.settings import GatewaySettings
from tests.unit.test_panel_web import HOSTILE, FakeCommands, FakeReads, sign_in

pytestmark = pytest.mark.unit


def at(day: int, hour: int = 10) -> datetime:
    return datetime(2026, 12, day, hour, tzinfo=UTC)


UJOBS = [
    {"id": "u1", "org": "acme", "project": "nlp", "owner": HOSTILE, "state": "succeeded",
     "attempts": {"preempted": 2}, "spec": {"checkpoint_every_steps": 10}, "last_step": 40},
    {"id": "u2", "org": "acme", "project": "nlp", "owner": "ana", "state": "failed", "attempts": {},
     "spec": {}, "last_step": 3},
    {"id": "u3", "org": "zeta", "project": "cv", "owner": "zed", "state": "running", "attempts": {},
     "spec": {}, "last_step": 1},
]
LEDGER = [{"job_id": "u1", "gpu_seconds": 5400.0, "at": at(2)}, {"job_id": "u2", "gpu_seconds": 1800.0, "at": at(3)},
          {"job_id": "u3", "gpu_seconds": 36000.0, "at": at(4)}]
EVENTS = [{"job_id": "u1", "event": "submitted", "time": at(1, 10)}, {"job_id": "u1", "event": "leased",
                                                                     "time": at(1, 11)}]


class UsageReads(FakeReads):
    """The three public views the report reads; ``org`` and ``owner`` (arguments 4 and 5 of the jobs query)
    filter as the SQL does."""

    async def public(self, view: str, sql: str, *args: Any) -> list[dict[str, Any]]:
        self.__dict__.setdefault("asked", []).append((view, args))
        if view == "budget.ledger_public":
            return [dict(c) for c in LEDGER if args[0] <= c["at"] < args[1]]
        if view == "queue.jobs_public":
            return [dict(j) for j in UJOBS if (args[3] is None or j["org"] == args[3])
                    and (args[4] is None or j["owner"] == args[4])]
        return [dict(e) for e in EVENTS if e["job_id"] in args[0]]


@pytest.fixture
def usage_panel(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    path = settings.effective_tokens_file
    secrets = {"olga": auth.create_token(path, "olga", "operator"),
               "vic": auth.create_token(path, "vic", "viewer", org="acme"),
               "ana": auth.create_token(path, "ana", "viewer", org="acme")}
    reads = UsageReads()
    app = create_app(settings, reads=reads, commands=FakeCommands())
    with TestClient(app, base_url="https://panel.test") as client:
        yield client, secrets, reads


def test_the_usage_page_needs_a_session_and_is_in_the_navigation(usage_panel):
    client, secrets, _ = usage_panel
    answer = client.get("/usage?period=2026-12", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/signin?next=/usage%3Fperiod%3D2026-12"
    sign_in(client, secrets["vic"])
    assert 'href="/usage"' in client.get("/jobs").text


def test_a_fleet_wide_operator_sees_every_organisation_with_locale_formatting(usage_panel):
    client, secrets, _ = usage_panel
    sign_in(client, secrets["olga"])
    page = client.get("/usage?period=2026-12&group_by=org", headers={"Accept-Language": "en"}).text
    assert 'data-key="zeta"' in page and 'data-key="acme"' in page
    assert page.index('data-key="zeta"') < page.index('data-key="acme"')  # largest GPU time first
    assert ">10.00<" in page and ">2.00<" in page and 'id="usage-total">12.00<' in page  # GPU-hours
    assert "Download CSV" in page and 'href="/v1/usage?group_by=org&amp;format=csv&amp;period=2026-12"' in page
    pt = client.get("/usage?period=2026-12&group_by=org", headers={"Accept-Language": "pt-BR"}).text
    assert ">10,00<" in pt and "GPU-horas" in pt and "Baixar CSV" in pt and "Agrupar por" in pt
    assert "interrompidos" in pt and "Espera na fila (total)" in pt
    assert ">1 h<" in page  # acme's queue wait: u1 submitted at 10:00, leased at 11:00


def test_an_organisations_token_sees_its_organisation_only_and_may_not_name_another(usage_panel):
    client, secrets, reads = usage_panel
    sign_in(client, secrets["ana"])
    page = client.get("/usage?period=2026-12&group_by=project").text
    assert 'data-key="acme/nlp"' in page and "zeta" not in page and "cv" not in page.split("<main")[1]
    assert "org=acme" in page  # the CSV link asks for the same organisation
    assert reads.asked[1][1][3:5] == ("acme", "ana")
    # a viewer sees its own jobs' usage only (0.50 GPU-hours of u2), not the 1.50 of u1 by another owner
    assert 'id="usage-total">0.50<' in page and ">1.50<" not in page and ">2.00<" not in page
    refused = client.get("/usage?org=zeta")
    assert refused.status_code == 403 and "zeta" not in refused.text.split("<main")[1].split("</main>")[0]
    # the API refuses the same people the page does
    assert client.get("/v1/usage?org=zeta").status_code == 403


def test_user_keys_are_escaped(usage_panel):
    client, secrets, _ = usage_panel
    sign_in(client, secrets["olga"])
    page = client.get("/usage?period=2026-12&group_by=user").text
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_bad_period_is_shown_as_an_error_and_reads_nothing(usage_panel):
    client, secrets, reads = usage_panel
    sign_in(client, secrets["olga"])
    for bad in ("2026-13", "<b>x</b>", "2026-02-30"):
        page = client.get("/usage", params={"period": bad})
        assert page.status_code == 200 and 'id="usage-error"' in page.text and 'id="usage-table"' not in page.text
        assert "<b>x</b>" not in page.text
    assert not getattr(reads, "asked", [])


def test_the_form_takes_what_the_api_takes_and_nothing_else():
    assert usage_form(None, None, None) == {"period": None, "group_by": "org", "org": None, "error": None}
    assert usage_form(" 2026-12 ", "user", " acme ") == {"period": "2026-12", "group_by": "user", "org": "acme",
                                                          "error": None}
    assert usage_form("2026-12-01", "nope", "")["group_by"] == "org"
    assert usage_form("12/2026", "org", None)["error"] and usage_form("12/2026", "org", None)["period"] is None
    bad_org = usage_form(None, "org", "a b")
    assert bad_org["error"] and bad_org["org"] is None


def test_the_csv_link_is_the_apis_report_on_show():
    form = usage_form("2026-12", "project", None)
    assert csv_link(form, None) == "/v1/usage?group_by=project&format=csv&period=2026-12"
    assert csv_link(usage_form(None, "user", None), "acme") == "/v1/usage?group_by=user&format=csv&org=acme"


def test_the_page_shows_what_each_organisations_checkpoints_hold_in_the_store(usage_panel, monkeypatch):
    stored = [{"job_id": "u1", "event": "checkpointed", "time": at(1, 12), "detail": {"stored_bytes": 3 << 30}},
              {"job_id": "u3", "event": "checkpointed", "time": at(1, 12), "detail": {"stored_bytes": 1536}}]
    monkeypatch.setitem(globals(), "EVENTS", EVENTS + stored)  # what UsageReads answers
    client, secrets, _ = usage_panel
    sign_in(client, secrets["olga"])
    page = client.get("/usage?period=2026-12&group_by=org", headers={"Accept-Language": "en"}).text
    rows = {key: page.split(f'data-key="{key}"')[1].split("</tr>")[0] for key in ("acme", "zeta")}
    assert "Stored checkpoints" in page
    assert 'data-bytes="3221225472">3 GiB<' in rows["acme"] and 'data-bytes="1536">1.5 KiB<' in rows["zeta"], rows
    pt = client.get("/usage?period=2026-12&group_by=org", headers={"Accept-Language": "pt-BR"}).text
    assert "Checkpoints armazenados" in pt and ">1,5 KiB<" in pt.split('data-key="zeta"')[1].split("</tr>")[0]
