"""The operations pages inside the gateway, without servers: executors, nodes and checks, gang policy, audit.
Each shows only the actions the role may take, the server refuses forged ones, user strings are escaped, and
every visible string is translated in both languages."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.domain import views
from services.gateway.settings import GatewaySettings
from tests.unit.test_panel_web import HOSTILE, FakeCommands, FakeReads, sign_in

pytestmark = pytest.mark.unit

EXECUTORS = [
    {"executor_id": "ex-1", "node_id": "n1", "group_name": "g", "phase": "training", "step": 10, "job_id": "j2",
     "last_heartbeat": None, "signal": "stuck", "signal_since": None,
     "detail": {"stuck_after_seconds": 3.0, "seconds_since_step_change": 9.4, "seconds_since_heartbeat": 0.6}},
    {"executor_id": "ex-2", "node_id": "n2", "group_name": "g", "phase": "idle", "step": None, "job_id": None,
     "last_heartbeat": None, "signal": "no_signal", "signal_since": None,
     "detail": {"no_signal_after_seconds": 5.0, "seconds_since_heartbeat": 42.0}},
    # A frozen agent woken up: its last heartbeat still names j9 at epoch 1, which runs on ex-1 at epoch 2 now.
    {"executor_id": "ex-3", "node_id": "n3", "group_name": "g", "phase": "training", "step": 95, "job_id": "j9",
     "epoch": 1, "last_heartbeat": None, "signal": "ok", "signal_since": None, "detail": {}},
]
STALE = {"ex-2": 3, "ex-3": 2}
QUEUE_JOBS = {"j9": {"id": "j9", "state": "running", "lease_epoch": 2, "executor_id": "ex-1"}}
NODES = [{"node_id": "n3", "group_name": "g", "executor_id": None, "state": "checking", "schedulable": False,
          "reason": None, "job_id": None},
         {"node_id": "n1", "group_name": "g", "executor_id": "ex-1", "state": "ready", "schedulable": True,
          "reason": None, "job_id": "j2", "last_check_run_id": "r1", "last_check_outcome": "passed",
          "last_check_at": "2026-12-01T10:00:00+00:00"},
         {"node_id": "n2", "group_name": "g", "executor_id": "ex-2", "state": "drained", "schedulable": False,
          "reason": HOSTILE, "job_id": None}]
GROUPS = [{"group_name": "g", "nodes": 2, "schedulable": 1, "states": {"ready": 1, "drained": 1},
           "last_check_at": None, "alert": None}]
RUN = {"run_id": "r1", "kind": "on_demand", "group_name": "g", "requested_by": "olga", "state": "done",
       "created_at": "2026-12-01T10:00:00+00:00", "nodes": [
           {"node_id": "n1", "status": "passed", "tests": [
               {"test": "matmul", "status": "passed", "attempt": 1, "figures": {"tflops_float32": 0.004},
                "verdict": {"comparisons": [{"metric": "tflops_float32", "value": 0.004, "reference": 0.005,
                                             "source": "group median of 1", "ratio": 0.8, "ok": True}]}},
               {"test": "allreduce", "status": "passed", "attempt": 1, "figures": {"busbw_gbps": 0.68},
                "verdict": {}},
               {"test": "nvml", "status": "not_applicable", "attempt": 1, "figures": {},
                "error": "no NVML on this node (CPU only)"}]}]}
AUDIT = [{"seq": 1, "command_id": "c1", "actor": HOSTILE, "time": "2026-12-01T10:00:00+00:00", "kind": "submit",
          "job_id": "j1", "outcome": "refused", "reason": "<b>no</b>", "hash": "ab" * 32}]


class OpsReads(FakeReads):
    runtime = None
    policy_row: dict | None = {"ready_timeout_seconds": 90.0, "backoff_base_seconds": 15.0,
                               "backoff_max_seconds": 600.0, "backoff_limit": None, "sequential_admission": True,
                               "node_failure_strategy": "fail_job", "updated_by": "root <x>",
                               "updated_at": "2026-12-01T09:00:00+00:00"}

    def __init__(self) -> None:
        self.audit_asked: list[dict] = []

    async def executors(self) -> list[dict[str, Any]]:
        return [views.executor_view(r, stale_reports=STALE, stale_heartbeats={}, job=QUEUE_JOBS.get(r["job_id"]))
                for r in EXECUTORS]

    async def nodes(self) -> list[dict[str, Any]]:
        return [dict(n) for n in NODES]

    async def node_groups(self) -> list[dict[str, Any]]:
        return [dict(g) for g in GROUPS]

    async def check_run(self, run_id: str) -> dict[str, Any] | None:
        return RUN if run_id == "r1" else None

    async def gang_policy(self) -> dict[str, Any]:
        return views.gang_policy_view(self.policy_row)

    async def audit(self, f: dict) -> list[dict[str, Any]]:
        self.audit_asked.append(dict(f))
        return [dict(a) for a in AUDIT]


ROLES = (("olga", "operator"), ("ana", "submitter"), ("vera", "viewer"), ("rui", "auditor"), ("adm", "admin"))


@pytest.fixture
def ops(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    secrets = {actor: auth.create_token(settings.effective_tokens_file, actor, role) for actor, role in ROLES}
    reads, commands = OpsReads(), FakeCommands()
    app = create_app(settings, reads=reads, commands=commands)
    with TestClient(app, base_url="https://panel.test") as client:
        yield client, secrets, reads, commands


def as_(client: TestClient, secrets: dict, actor: str) -> str:
    client.cookies.clear()
    return sign_in(client, secrets[actor])


def text_of(html: str) -> str:
    body = re.sub(r"<script.*?</script>", "", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def test_executors_show_the_job_badge_the_job_link_and_a_zombie(ops):
    client, secrets, _, _ = ops
    as_(client, secrets, "olga")
    page = client.get("/executors", headers={"Accept-Language": "pt-BR"}).text
    row1 = page[page.index('data-executor-id="ex-1"'):page.index('data-executor-id="ex-2"')]
    assert "Travado" in row1 and "Passo parado há 9 s (limite 3 s)" in row1 and 'href="/jobs/j2"' in row1
    assert "Treinando" in row1 and "zombie" not in row1
    assert '<a href="/jobs/j2">bob&#39;s</a><br><small class="muted">j2</small>' in row1  # its name beside its id
    row2 = page[page.index('data-executor-id="ex-2"'):page.index('data-executor-id="ex-3"')]
    assert "Sem sinal" in row2 and "Sem heartbeat há 42 s (limite 5 s)" in row2 and "há 42 s" in row2
    # Idle: its agent stopped the run it lost, so the stale counts are history, not a zombie (issue 26).
    assert "Zumbi" not in row2 and "3 relatórios · 0 heartbeats" in row2 and 'class="zombie"' not in row2
    row3 = page[page.index('data-executor-id="ex-3"'):]
    assert "Treinando" not in row3 and 'href="/jobs/j9"' in row3 and "saiu dele: agora roda em ex-1" in row3
    assert "Zumbi" in row3 and "Enviou 2 relatório(s) e 0 heartbeat(s)" in row3 and 'class="zombie"' in row3
    fragment = client.get("/executors?fragment=1").text
    assert "<html" not in fragment and 'data-executor-id="ex-1"' in fragment


def test_a_tenant_does_not_see_another_owners_job_on_an_executor(ops):
    client, secrets, _, _ = ops
    as_(client, secrets, "vera")  # j2 is bob's
    page = client.get("/executors").text
    assert 'href="/jobs/j2"' not in page and " j2 " not in text_of(page)


def test_nodes_page_shows_actions_to_fleet_managers_only(ops):
    client, secrets, _, _ = ops
    as_(client, secrets, "olga")
    page = client.get("/nodes").text
    assert 'data-action="check-group"' in page and 'data-action="drain"' in page
    assert 'data-action="undrain"' in page and 'class="node-pick"' in page and 'id="check-selected-button"' in page
    for actor in ("vera", "ana", "rui"):
        as_(client, secrets, actor)
        page = client.get("/nodes").text
        assert "data-action" not in page and "node-pick" not in page, actor
        assert "n1" in page and "Drained" in page


def test_a_forged_check_or_drain_without_fleet_manage_is_refused(ops):
    client, secrets, _, commands = ops
    csrf = as_(client, secrets, "vera")
    h = {"X-CSRF-Token": csrf}
    assert client.post("/v1/health-checks", json={"group": "g"}, headers=h).status_code == 403
    assert client.post("/v1/nodes/n1/drain", json={}, headers=h).status_code == 403
    assert client.post("/v1/nodes/n2/undrain", headers=h).status_code == 403
    assert client.put("/v1/policies/gang", json={}, headers=h).status_code == 403
    assert commands.sent == []
    csrf = as_(client, secrets, "olga")
    assert client.post("/v1/nodes/n1/drain", json={}).status_code == 403  # no CSRF token: refused
    answer = client.post("/v1/health-checks", json={"group": "g"}, headers={"X-CSRF-Token": csrf})
    assert answer.status_code < 300 and commands.sent[-1].group == "g" and commands.sent[-1].actor == "olga"


def test_a_check_run_shows_per_node_per_test_progress_and_figures_against_the_median(ops):
    client, secrets, _, _ = ops
    as_(client, secrets, "vera")
    page = client.get("/nodes?run=r1", headers={"Accept-Language": "en"}).text
    text = text_of(page)
    assert "Done" in text and "nodes 1 of 1 finished, tests 3 of 3 finished" in text and "1 passed, 0 failed" in text
    # NVML on a CPU-only node: "Not applicable" and its note in a neutral colour, not an error's (issue 26).
    nvml = page[page.index('data-test="nvml"'):]
    nvml = nvml[:nvml.index("</tr>")]
    assert "no NVML on this node" in nvml and "error-text" not in nvml and 'class="muted test-note"' in nvml
    assert "Throughput (float32)" in text and "0.00400 TFLOP/s" in text
    assert "0.00500 (group median of 1 node(s))" in text and "80 %" in text
    assert "All-reduce bus bandwidth" in text and "0.680 GB/s" in text and "no reference yet" not in text
    assert "0.680 (median of this run)" in text
    # The language switch comes back to this very run.
    assert 'href="/lang/pt-BR?next=/nodes%3Frun%3Dr1"' in page
    switched = client.get("/lang/pt-BR?next=/nodes%3Frun%3Dr1", follow_redirects=False)
    assert switched.headers["location"] == "/nodes?run=r1"
    run = client.get("/nodes?run=r1&fragment=run").text
    assert "<html" not in run and 'data-run-node="n1"' in run
    assert "Nenhuma execução de verificação nope (ainda)" in text_of(client.get("/nodes?run=nope").text)  # switched
    tables = client.get("/nodes?fragment=tables").text
    assert "<html" not in tables and 'data-node-id="n2"' in tables
    n3 = text_of(tables[tables.index('data-node-id="n3"'):tables.index('data-node-id="n1"')])
    assert "Não : estado em verificação" in n3  # not schedulable, and why even when the view gives no reason


def test_node_reasons_and_audit_strings_are_escaped(ops):
    client, secrets, _, _ = ops
    as_(client, secrets, "adm")
    for url in ("/nodes", "/audit", "/policy"):
        page = client.get(url).text
        assert HOSTILE not in page and "<b>no</b>" not in page and "root <x>" not in page, url
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/nodes").text
    assert "root &lt;x&gt;" in client.get("/policy").text


def test_gang_policy_is_for_admins_and_says_who_changed_it(ops):
    client, secrets, reads, _ = ops
    for actor in ("olga", "vera", "rui"):
        as_(client, secrets, actor)
        assert client.get("/policy").status_code == 403, actor
        assert 'href="/policy"' not in client.get("/jobs").text
    as_(client, secrets, "adm")
    page = client.get("/policy", headers={"Accept-Language": "en"}).text
    assert "Last changed by root &lt;x&gt; on 2026-12-01 09:00:00 UTC." in page
    assert 'id="p-ready_timeout_seconds"' in page and 'value="90"' in page
    assert 'id="p-backoff_limit" name="backoff_limit" inputmode="decimal" value=""' in page
    assert '<option value="fail_job" selected>' in page and 'id="policy-bounds"' in page
    assert "More than 0, at most 86,400." in page and "Empty: unlimited." in page
    reads.policy_row = None
    assert "The defaults are in force" in client.get("/policy").text


def test_audit_is_for_auditors_filters_reach_the_query_and_verification_says_why_it_cannot_run(ops):
    client, secrets, reads, _ = ops
    as_(client, secrets, "olga")
    assert client.get("/audit").status_code == 403
    as_(client, secrets, "rui")
    page = client.get("/audit?actor=ana&kind=submit&since=2026-12-01T10:00&until=junk", headers={"Accept-Language": "pt-BR"})
    assert page.status_code == 200
    asked = reads.audit_asked[-1]
    assert asked["actor"] == "ana" and asked["kind"] == "submit" and asked["until"] is None
    assert asked["since"].isoformat() == "2026-12-01T10:00:00+00:00" and asked["after_seq"] == 0
    text = text_of(page.text)
    assert "A verificação não pôde ser feita" in text and "Um filtro de horário não pôde ser lido" in text
    assert "Recusado" in text and 'href="/jobs/j1"' in page.text
    # The job's name beside its id (issue 26), escaped like every user string.
    row = page.text[page.text.index('href="/jobs/j1"'):]
    row = row[:row.index("</td>")]
    assert "&lt;script&gt;" in row and "<script>alert" not in row and '<small class="muted">j1</small>' in row
    assert 'href="/audit"' in client.get("/jobs").text


@pytest.mark.parametrize("locale", ["pt-BR", "en"])
def test_every_operations_page_is_fully_translated(ops, locale):
    client, secrets, _, _ = ops
    as_(client, secrets, "adm")
    other = {"pt-BR": ("Executors", "Nodes and health checks", "Gang policy", "Chain verification", "Sign out"),
             "en": ("Executores", "Nós e verificações", "Política de gangues", "Verificação da cadeia", "Sair")}
    for url in ("/executors", "/nodes?run=r1", "/policy", "/audit"):
        text = text_of(client.get(url, headers={"Accept-Language": locale}).text)
        keys = re.findall(r"\b(common|executors|nodes|audit|policy)\.[a-z][a-z0-9_-]+\b", text)
        assert not keys, (url, keys)
        assert not [w for w in other[locale] if w in text], url
