"""The jobs list and the follow-up page on the API's reads, without servers: the list pages with the API's cursor
(Reads.jobs_page: the same filters and X-Next-Cursor positions as GET /v1/jobs), a queued job's waiting reason on
both pages, the failed job's log tail, and the follow-up page's script reading the API (steps, followed logs)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.domain import paging, views
from services.gateway.panel.pages.jobs import filters, position
from services.gateway.settings import GatewaySettings
from tests.unit.test_panel_web import HOSTILE, JOBS, FakeCommands, FakeReads, sign_in

pytestmark = pytest.mark.unit

STATIC = Path(__file__).parents[2] / "services/gateway/panel/static"
QUEUED = {"id": "q1", "name": "waits", "owner": "ana", "state": "queued", "spec": {"workload": {"kind": "finetune"}},
          "created_at": "2026-12-01T11:00:00+00:00",
          "waiting": {"code": "quota", "reason": HOSTILE, "numbers": {}, "group": None}}
FAILED = {"id": "f1", "name": "broke", "owner": "ana", "state": "failed", "attempt_number": 2,
          "spec": {"workload": {"kind": "finetune"}}, "created_at": "2026-12-01T07:00:00+00:00"}
TAIL = {"attempt": 2, "rank": 0, "exit_code": 3, "complete": True,
        "lines": [{"stream": "stdout", "text": "loading"}, {"stream": "stderr", "text": HOSTILE}]}


class ListReads(FakeReads):
    next_cursor: str | None = None

    async def jobs_page(self, **asked: Any) -> tuple[list[dict[str, Any]], str | None]:
        rows, _ = await super().jobs_page(**asked)
        return rows, self.next_cursor

    async def job_row(self, job_id: str) -> dict[str, Any] | None:
        extra = {j["id"]: j for j in (QUEUED, FAILED)}
        return dict(extra[job_id]) if job_id in extra else await super().job_row(job_id)

    async def _fetch(self, view: str, sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(j) for j in (*JOBS, QUEUED)]

    async def job_grants(self, job_id: str) -> dict:
        return {(2, 0): "ex-1"}


class Logs:
    def __init__(self) -> None:
        self.asked: list[tuple] = []

    async def tail(self, job_id: str, attempt: int, ranks: int, granted: dict) -> dict:
        self.asked.append((job_id, attempt, ranks, granted))
        return TAIL


@pytest.fixture
def jobs_panel(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    secret = auth.create_token(settings.effective_tokens_file, "olga", "operator")
    reads, logs = ListReads(), Logs()
    app = create_app(settings, reads=reads, commands=FakeCommands(), job_logs=logs)
    with TestClient(app, base_url="https://panel.test") as client:
        sign_in(client, secret)
        yield client, reads, logs


def test_the_list_asks_the_apis_page_with_its_filters(jobs_panel):
    client, reads, _ = jobs_panel
    reads.pages.clear()
    client.get("/jobs", params={"state": "queued", "signal": "stuck", "owner": " ana ", "name": " 50%_ "})
    assert reads.pages[-1] == {"state": "queued", "owner": "ana", "name": "50%_", "signal": "stuck", "cursor": None,
                               "limit": 50}
    client.get("/jobs", params={"state": "nope", "signal": "ok", "owner": "", "name": "  "})
    assert reads.pages[-1] == {"state": None, "owner": None, "name": None, "signal": None, "cursor": None, "limit": 50}


def test_a_cursor_of_the_api_moves_the_list_and_any_other_starts_again(jobs_panel):
    client, reads, _ = jobs_panel
    moment = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    cursor = paging.encode_cursor(paging.Position(moment, "j-1"))
    page = client.get("/jobs", params={"cursor": cursor}, headers={"Accept-Language": "en"}).text
    assert reads.pages[-1]["cursor"] == paging.Position(moment, "j-1")
    assert "« Newest" in page  # the link back to the first page
    page = client.get("/jobs", params={"cursor": "bm90IGEgY3Vyc29y"}, headers={"Accept-Language": "en"}).text
    assert reads.pages[-1]["cursor"] is None and "« Newest" not in page  # a cut or edited link: the first page
    reads.next_cursor = cursor
    page = client.get("/jobs").text
    assert f"cursor={cursor}" in page and 'rel="next"' in page


def test_filters_and_positions_are_pure():
    assert filters("failed", "no_signal", "ana", "x") == {"state": "failed", "signal": "no_signal", "owner": "ana",
                                                         "name": "x"}
    assert filters("x", "ok", " ", None) == {"state": None, "signal": None, "owner": None, "name": None}
    moment = datetime(2026, 12, 1, tzinfo=UTC)
    assert position(paging.encode_cursor(paging.Position(moment, "a"))) == paging.Position(moment, "a")
    for bad in (None, "", "!!!", "x" * 600):
        assert position(bad) is None


def test_a_queued_jobs_waiting_reason_is_on_the_list_and_its_page_escaped(jobs_panel):
    client, _, _ = jobs_panel
    listing = client.get("/jobs", headers={"Accept-Language": "en"}).text
    assert "Quota in use" in listing and HOSTILE not in listing and "&lt;script&gt;" in listing
    page = client.get("/jobs/q1", headers={"Accept-Language": "pt-BR"}).text
    assert 'id="job-waiting"' in page and "Cota em uso" in page and "Aguardando:" in page and HOSTILE not in page
    assert 'id="job-waiting"' not in client.get("/jobs/j2").text  # running: no reason shown
    assert views.job_view(QUEUED)["waiting"]["code"] == "quota"  # the field the page reads is the API's


def test_a_failed_job_shows_its_log_tail_escaped(jobs_panel):
    client, _, logs = jobs_panel
    page = client.get("/jobs/f1", headers={"Accept-Language": "en"}).text
    assert 'id="log-tail"' in page and "rank 0 · attempt 2 · exit code 3" in page
    assert "loading" in page and HOSTILE not in page and 'class="log-stderr"' in page
    assert logs.asked == [("f1", 2, 1, {(2, 0): "ex-1"})]
    fragment = client.get("/jobs/f1?fragment=1").text  # the live part carries it: it appears when the job fails
    assert 'id="log-tail"' in fragment
    assert 'id="log-tail"' not in client.get("/jobs/j2").text


def test_the_follow_up_page_reads_the_apis_steps_and_follows_its_logs_as_text():
    script = (STATIC / "job.js").read_text()
    assert '"/v1/jobs/" + encodeURIComponent(jobId) + "/steps' in script and '"/jobs/" + encodeURIComponent' not in script
    assert "follow=true&after_seq=" in script and "data-max-lines" in script
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script


def test_the_panels_own_step_route_is_gone(jobs_panel):
    client, _, _ = jobs_panel
    assert client.get("/jobs/j1/steps").status_code == 404


def test_the_first_checkpoint_warning_is_on_the_jobs_row_too(jobs_panel):
    """Issue 26: the warning that the first checkpoint cannot fit the ceiling was only on the job's own page."""
    client, _, _ = jobs_panel
    listing = client.get("/jobs", headers={"Accept-Language": "pt-BR"}).text
    row = listing[listing.index('data-job-id="j1"'):]
    row = row[:row.index("</tr>")]
    assert 'class="warning first-ckpt-warning" role="note"' in row
    assert "O primeiro checkpoint precisa de 40 GPU-s, acima do teto de 30 GPU-s" in row
    other = listing[listing.index('data-job-id="j2"'):]
    assert "first-ckpt-warning" not in other[:other.index("</tr>")]  # no warning: none shown
