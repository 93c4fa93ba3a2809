"""The panel in the gateway, without servers: sign-in, the session cookie and its CSRF token, security
headers, escaping, the language switch, and that pages and the API refuse the same people."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from libs.contracts.commands import CommandOutcome
from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.commands import Sent
from services.gateway.domain import views
from services.gateway.panel.web import signed_in
from services.gateway.settings import GatewaySettings

pytestmark = pytest.mark.unit

HOSTILE = '<script>alert(1)</script>'
JOBS = [
    {"id": "j1", "name": HOSTILE, "owner": "ana", "state": "interrupted", "last_step": 40, "total_steps": 100,
     "spec": {"workload": {"kind": "finetune"}, "checkpoint_every_steps": 20, "gpu_ceiling_seconds": 30},
     "created_at": "2026-12-01T10:00:00+00:00", "reason": "gpu_ceiling", "error": '<img src=x onerror="alert(2)">'},
    {"id": "j3", "name": "vera's", "owner": "vera", "state": "interrupted", "last_step": 4, "total_steps": 10,
     "spec": {"workload": {"kind": "finetune"}, "checkpoint_every_steps": 5, "gpu_ceiling_seconds": 30,
              "checkpoints_kept": 1200},
     "created_at": "2026-12-01T08:00:00+00:00"},
    {"id": "j2", "name": "bob's", "owner": "bob", "state": "running", "last_step": 3, "total_steps": 10,
     "spec": {"workload": {"kind": "finetune"}, "checkpoint_every_steps": 5, "gpu_ceiling_seconds": 300,
              "checkpoints_kept": 0},
     "created_at": "2026-12-01T09:00:00+00:00"},
]


# What j1's runs reported (issue 27): its latest step report and its accepted checkpoints' events, newest first.
REPORTS = {"j1": ({"epoch": 2, "step": 40, "loss": 0.693147, "step_seconds": 0.5, "metrics": {"learning_rate": 2e-4},
                   "time": "2026-12-01T10:05:00+00:00"},
                  [{"event": "checkpointed", "epoch": 2, "time": "2026-12-01T10:04:00+00:00",
                    "detail": {"step": 40, "kind": "directory", "bytes": 3 * 2**19, "files": 7,
                               "path": "/c/j1/checkpoint-40"}},
                   {"event": "checkpointed", "epoch": 1, "time": "2026-12-01T10:01:00+00:00",
                    "detail": {"step": 20, "bytes": 512, "path": "/c/j1/step-00000020.pt"}}])}
BUDGETS = {"j1": {"ceiling_seconds": 30, "consumed_seconds": 31.5, "remaining_seconds": 0, "overshoot_seconds": 1.5,
                  "warning": {"expected_seconds": 40, "ceiling_seconds": 30, "source": "estimate"},
                  "ceiling_history": [{"ceiling_seconds": 30, "actor": "ana", "at": "2026-12-01T10:00:00+00:00"}]}}


class FakeReads:
    """The public views as rows; ``jobs_page`` applies the owner filter and records what it was asked."""

    async def _fetch(self, view: str, sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(j) for j in JOBS]

    async def jobs_page(self, **asked: Any) -> tuple[list[dict[str, Any]], str | None]:
        self.__dict__.setdefault("pages", []).append(asked)
        rows = [dict(j) for j in JOBS if asked.get("owner") is None or j["owner"] == asked["owner"]]
        return await self._decorate(rows), None

    async def _decorate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [views.job_view(r, budget=BUDGETS.get(r["id"])) for r in rows]

    async def job_row(self, job_id: str) -> dict[str, Any] | None:
        return next((dict(j) for j in JOBS if j["id"] == job_id), None)

    async def get_job(self, job_id: str, *, events: int = 20) -> dict[str, Any] | None:
        self.__dict__.setdefault("events_asked", []).append(events)
        row = await self.job_row(job_id)
        return None if row is None else {**views.job_view(row, budget=BUDGETS.get(job_id)), "events": []}

    async def job_owners(self, ids: list[str]) -> dict[str, str]:
        return {j["id"]: j["owner"] for j in JOBS if j["id"] in ids}

    async def job_reports(self, job_id: str, checkpoints: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        latest, events = REPORTS.get(job_id, (None, []))
        return latest, events[:checkpoints]

    async def job_names(self, ids: list[str]) -> dict[str, str]:
        return {j["id"]: j["name"] for j in JOBS if j["id"] in ids and j.get("name")}


class FakeCommands:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, cmd: Any) -> Sent:
        self.sent.append(cmd)
        return Sent(cmd.command_id, CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=True,
                                                   by="queue", job_id=getattr(cmd, "job_id", None)))

    async def refuse(self, *a: Any, **kw: Any) -> str:
        return "x"


@pytest.fixture
def panel(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    secrets = {actor: auth.create_token(settings.effective_tokens_file, actor, role)
               for actor, role in (("olga", "operator"), ("ana", "submitter"), ("vera", "viewer"))}
    commands = FakeCommands()
    app = create_app(settings, reads=FakeReads(), commands=commands)
    with TestClient(app, base_url="https://panel.test") as client:
        yield app, client, secrets, commands


def sign_in(client: TestClient, secret: str) -> str:
    """Signs in through the form; returns the session's CSRF token as the page shows it."""
    form = client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    answer = client.post("/signin", data={"token": secret, "csrf": csrf, "next": "/jobs"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/jobs"
    page = client.get("/jobs")
    return re.search(r'<meta name="csrf-token" content="([^"]+)"', page.text).group(1)


def test_pages_without_a_session_redirect_to_sign_in(panel):
    _, client, _, _ = panel
    answer = client.get("/jobs/j1?x=1", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/signin?next=/jobs/j1%3Fx%3D1"


def test_sign_in_sets_an_http_only_strict_cookie_that_holds_no_token(panel):
    _, client, secrets, _ = panel
    form = client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    answer = client.post("/signin", data={"token": secrets["olga"], "csrf": csrf}, follow_redirects=False)
    cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and v.startswith("teto_session="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" in cookie
    assert secrets["olga"] not in cookie
    assert "olga" in client.get("/jobs").text


def test_a_wrong_token_or_a_forged_sign_in_form_is_refused(panel):
    _, client, secrets, _ = panel
    form = client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    wrong = client.post("/signin", data={"token": "teto_nope", "csrf": csrf})
    assert wrong.status_code == 401 and 'role="alert"' in wrong.text
    client.cookies.clear()
    forged = client.post("/signin", data={"token": secrets["olga"], "csrf": "guess"})
    assert forged.status_code == 403 and "teto_session" not in forged.headers.get("set-cookie", "")


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example", "/\\evil", "jobs"])
def test_sign_in_never_redirects_off_site(panel, target):
    _, client, secrets, _ = panel
    form = client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    answer = client.post("/signin", data={"token": secrets["olga"], "csrf": csrf, "next": target},
                         follow_redirects=False)
    assert answer.headers["location"] == "/jobs"


def test_every_page_has_a_csp_without_inline_scripts_and_no_inline_script(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["olga"])
    for path in ("/signin", "/jobs", "/jobs/j1"):
        answer = client.get(path)
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "style-src 'self'" in csp
        scripts = re.findall(r"<script([^>]*)>(.*?)</script>", answer.text, re.S)
        assert all('src="' in attrs or 'type="application/json"' in attrs for attrs, _ in scripts), path
        assert ' style="' not in answer.text
        assert not re.search(r"<[^>]+\son[a-z]+\s*=", answer.text), path  # no inline event handlers


def test_every_page_links_a_favicon_that_is_served_without_a_session(panel):
    _, client, _, _ = panel
    page = client.get("/signin").text
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
    for path in ("/static/favicon.svg", "/favicon.ico"):  # browsers ask for /favicon.ico whatever the page says
        answer = client.get(path)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("image/svg+xml")
        assert answer.text.startswith("<svg")


def test_user_strings_are_escaped(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["olga"])
    for path in ("/jobs", "/jobs/j1", "/jobs?name=%3Cb%3E"):
        text = client.get(path).text
        assert HOSTILE not in text and "<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/jobs").text


def test_the_api_takes_the_session_cookie_only_with_its_csrf_token(panel):
    _, client, secrets, commands = panel
    csrf = sign_in(client, secrets["olga"])
    assert client.get("/v1/whoami").json()["actor"] == "olga"
    refused = client.post("/v1/jobs/j1/requeue", json={"gpu_ceiling_seconds": 500})
    assert refused.status_code == 403 and "CSRF" in refused.json()["reason"]
    wrong = client.post("/v1/jobs/j1/requeue", json={"gpu_ceiling_seconds": 500}, headers={"X-CSRF-Token": "x"})
    assert wrong.status_code == 403 and not commands.sent
    accepted = client.post("/v1/jobs/j1/requeue", json={"gpu_ceiling_seconds": 500}, headers={"X-CSRF-Token": csrf})
    assert accepted.status_code == 200 and commands.sent[0].actor == "olga"


def test_a_submitters_forged_requeue_is_refused_by_the_server(panel):
    _, client, secrets, commands = panel
    csrf = sign_in(client, secrets["ana"])
    answer = client.post("/v1/jobs/j1/requeue", json={"gpu_ceiling_seconds": 500}, headers={"X-CSRF-Token": csrf})
    assert answer.status_code == 403 and answer.json()["permission"] == "finetune:manage"
    assert not commands.sent


def test_a_tenant_lists_only_its_own_jobs_and_cannot_open_anothers(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["ana"])
    listing = client.get("/jobs").text
    assert "/jobs/j1" in listing and "/jobs/j2" not in listing
    assert client.get("/jobs/j2").status_code == 404


def test_sign_out_needs_the_csrf_token_and_ends_the_session(panel):
    _, client, secrets, _ = panel
    csrf = sign_in(client, secrets["olga"])
    assert client.post("/signout", data={"csrf": "wrong"}).status_code == 403
    answer = client.post("/signout", data={"csrf": csrf}, follow_redirects=False)
    assert answer.status_code == 303
    client.cookies.delete("teto_session")
    assert client.get("/jobs", follow_redirects=False).status_code == 303


def test_a_revoked_token_ends_its_sessions(panel):
    app, client, secrets, _ = panel
    sign_in(client, secrets["vera"])
    path = app.state.tokens.path
    token_id = next(t["id"] for t in auth.list_tokens(path) if t["actor"] == "vera")
    auth.revoke_token(path, token_id)
    assert client.get("/jobs", follow_redirects=False).status_code == 303


def test_the_language_follows_accept_language_and_the_switch(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["olga"])
    assert 'lang="pt-BR"' in client.get("/jobs", headers={"Accept-Language": "pt-BR"}).text.split(">")[1]
    assert "Interrompido" in client.get("/jobs", headers={"Accept-Language": "pt-BR"}).text
    client.get("/lang/en?next=/jobs")
    page = client.get("/jobs", headers={"Accept-Language": "pt-BR"}).text
    assert "Interrupted" in page and "Interrompido" not in page


def test_every_panel_route_is_public_by_design_or_needs_a_session(panel):
    app = panel[0]
    public = {"/", "/signin", "/signout", "/lang/{locale}", "/favicon.ico"}
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.path.startswith("/v1/") or route.path in public:
            continue
        if route.path in {"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/asyncapi.json",
                          "/asyncapi"}:
            continue
        calls = [d.call for d in route.dependant.dependencies]
        assert any(isinstance(c, (signed_in, auth.require)) for c in calls), route.path


def test_a_page_shows_only_the_actions_the_role_may_take(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["olga"])  # operator: requeue an interrupted job, cancel any
    page = client.get("/jobs/j1").text
    assert 'id="requeue"' in page and 'id="cancel"' in page
    client.cookies.clear()
    sign_in(client, secrets["ana"])  # submitter, owner of j1: cancel, no requeue
    page = client.get("/jobs/j1").text
    assert 'id="requeue"' not in page and 'id="cancel"' in page
    client.cookies.clear()
    sign_in(client, secrets["vera"])  # viewer, owner of j3: no button at all
    page = client.get("/jobs/j3").text
    assert 'id="requeue"' not in page and 'id="cancel"' not in page and "<button" not in page.split("</header>")[1]


def test_the_follow_up_page_shows_the_budget_numbers_per_locale(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["olga"])
    page = client.get("/jobs/j1", headers={"Accept-Language": "pt-BR"}).text
    assert "Excedente além do teto" in page and "1,5 GPU-s" in page and "teto de GPU atingido" in page
    assert "Consumido: 31,5 GPU-s" in page and "pelo menos 91,5 GPU-s (consumido + 60 s)" in page
    assert "precisar de 40 GPU-s, mais que o teto de 30 GPU-s" in page  # the first-checkpoint warning
    assert "Perdido na interrupção" in page and "40 passos desde o checkpoint do passo 0 (tempo de GPU desconhecido" in page
    english = client.get("/jobs/j1", headers={"Accept-Language": "en"}).text
    assert "Overshoot past the ceiling" in english and "at least 91.5 GPU-s" in english


def test_the_follow_up_page_shows_what_the_runs_reported_per_locale(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["olga"])

    def shown(language: str) -> tuple[str, str, list[str]]:
        page = client.get("/jobs/j1", headers={"Accept-Language": language}).text
        loss = re.sub(r"<[^>]+>", "", re.search(r'id="job-loss">(.*?)</dd>', page).group(1)).strip()
        lr = re.search(r'id="job-lr">([^<]*)<', page).group(1)
        table = re.search(r'id="ckpt-table".*?</table>', page, re.S).group(0)
        rows = [" | ".join(re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>.*?</td>", row)[:5])
                for row in re.findall(r"<tr data-kind.*?</tr>", table, re.S)]
        return loss, lr, rows

    assert shown("en") == ("0.6931 at step 40", "0.0002", ["40 | directory | 1.5 MiB | 7 | 2", "20 | file | 512 B | 1 | 1"])
    assert shown("pt-BR") == ("0,6931 no passo 40", "0,0002",
                              ["40 | diretório | 1,5 MiB | 7 | 2", "20 | arquivo | 512 B | 1 | 1"])
    page = client.get("/jobs/j3", headers={"Accept-Language": "en"}).text  # nothing reported: nothing shown
    assert 'id="job-loss"' not in page and 'id="ckpt-table"' not in page


def test_the_follow_up_page_says_how_many_checkpoints_are_kept(panel):
    _, client, secrets, _ = panel
    sign_in(client, secrets["olga"])

    def kept(job_id: str, language: str) -> str:
        page = client.get(f"/jobs/{job_id}", headers={"Accept-Language": language}).text
        return re.search(r'id="ckpt-kept">([^<]*)<', page).group(1)

    assert kept("j1", "en") == "the executor&#39;s default (3 unless configured)"  # the spec does not say
    assert kept("j3", "en") == "the newest 1,200" and kept("j3", "pt-BR") == "os 1.200 mais recentes"
    assert kept("j2", "en") == "every one" and kept("j2", "pt-BR") == "todos"


def test_the_api_gives_as_many_of_a_jobs_latest_events_as_asked_within_its_bound(panel):
    app, client, secrets, _ = panel
    reads, bearer = app.state.reads, {"Authorization": f"Bearer {secrets['olga']}"}
    assert client.get("/v1/jobs/j1", headers=bearer).status_code == 200
    assert client.get("/v1/jobs/j1?events=200", headers=bearer).status_code == 200
    assert client.get("/v1/jobs/j1?events=0", headers=bearer).status_code == 200
    assert reads.events_asked == [20, 200, 0]
    for bad in ("501", "-1", "many"):
        answer = client.get(f"/v1/jobs/j1?events={bad}", headers=bearer)
        assert answer.status_code == 422 and "events" in answer.text
    assert reads.events_asked == [20, 200, 0]
