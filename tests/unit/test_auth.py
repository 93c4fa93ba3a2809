"""Tokens, roles and permissions: the tokens file holds only hashes, revocation and file edits take effect, and
every endpoint x every role gets exactly the answer the role table says (a new endpoint without a declared
permission, or without a sample request here, fails this module)."""

from __future__ import annotations

from types import SimpleNamespace

import json
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from libs.contracts.commands import CommandOutcome
from libs.contracts.dead import DeadCause, dead_letter
from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.auth import route_permission
from services.gateway.scoping import job_id_for_key
from services.gateway.auth import Permission, Role, TokenStore
from services.gateway.commands import Sent
from services.gateway.dead_letters import Replayed
from services.gateway.logs import Page
from services.gateway.settings import GatewaySettings

pytestmark = pytest.mark.unit

JOB = {"id": "j1", "name": "demo", "owner": "submitter", "state": "interrupted",
       "spec": {"workload": {"kind": "finetune"}, "checkpoint_every_steps": 50}}


class FakeReads:
    async def job_row(self, job_id: str) -> dict[str, Any] | None:
        return dict(JOB) if job_id == "j1" else None

    async def get_job(self, job_id: str, *, events: int = 20) -> dict[str, Any] | None:
        return {**JOB, "events": []} if job_id == "j1" else None

    async def list_jobs(self, **_: Any) -> list[dict[str, Any]]:
        return [dict(JOB)]

    async def job_reports(self, job_id: str, checkpoints: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return None, []

    async def jobs_page(self, **kw: Any) -> tuple[list[dict[str, Any]], str | None]:
        return await self.list_jobs(**kw), None

    async def job_events(self, job_id: str, **_: Any) -> list[dict[str, Any]]:
        return []

    async def job_steps(self, job_id: str) -> list[dict[str, Any]]:
        return []

    async def executors(self) -> list[dict[str, Any]]:
        return []

    async def audit(self, f: Any) -> list[dict[str, Any]]:
        return []

    async def command(self, command_id: str) -> list[dict[str, Any]]:  # the caller's own command
        return [{"seq": 1, "command_id": command_id, "actor": JOB["owner"], "kind": "submit", "job_id": "j1",
                 "outcome": "received", "payload": {}, "reason": None, "time": None}] if command_id == "c1" else []

    async def nodes(self) -> list[dict[str, Any]]:
        return []

    async def node_groups(self) -> list[dict[str, Any]]:
        return []

    async def check_run(self, run_id: str) -> dict[str, Any] | None:
        return {"run_id": run_id, "nodes": []}

    async def audit_verify(self) -> dict[str, Any]:
        return {"ok": True, "first_bad_seq": None}

    async def job_grants(self, job_id: str) -> dict[tuple[int, int], str]:
        return {(1, 0): "e1"}

    async def public(self, view: str, sql: str, *args: Any) -> list[dict[str, Any]]:
        return []

    async def gang_policy(self) -> dict[str, Any]:
        return {"ready_timeout_seconds": 120.0}


class FakeJobLogs:
    async def page(self, q: Any, granted: Any, *, after_seq: int, limit: int) -> Page:
        return Page([], after_seq, False)


class FakeCommands:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.recorded: list[CommandOutcome] = []

    async def send(self, cmd: Any) -> Sent:
        self.sent.append(cmd)
        return Sent(cmd.command_id, CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=True,
                                                   by="queue", job_id=getattr(cmd, "job_id", None)))

    async def refuse(self, kind: str, actor: str | None, reason: str, **kw: Any) -> str:
        self.recorded.append(CommandOutcome(command_id="x", kind=kind, accepted=False, reason=reason, by="gateway",
                                            detail={"actor": actor}))
        return "x"

    async def record(self, outcome: CommandOutcome) -> None:
        self.recorded.append(outcome)


class FakeDeadLetters:
    """A command the queue gave up on at sequence 1, an executor's step report at 3; replay records what it would
    publish."""

    prefix = "teto"
    letters = {1: dead_letter(service="queue", consumer="queue-submit", cause=DeadCause.PERMANENT, reason="bigint",
                              subject="teto.cmd.submit", payload=b'{"kind": "submit"}'),
               3: dead_letter(service="queue", consumer="queue-progress", cause=DeadCause.PERMANENT, reason="bigint",
                              subject="teto.progress.j1", payload=b'{"kind": "step"}')}

    def __init__(self) -> None:
        self.replayed: list[int] = []

    async def list(self, *, service: str | None, after_seq: int, limit: int) -> list[tuple[int, Any]]:
        found = [(seq, letter) for seq, letter in self.letters.items() if seq > after_seq]
        return found[:limit] if service in (None, "queue") else []

    async def get(self, seq: int) -> Any:
        return self.letters.get(seq)

    async def counts(self) -> dict[str, int]:
        return {"queue": 2}

    async def replay(self, seq: int, letter: Any) -> Replayed:
        self.replayed.append(seq)
        return Replayed(seq, letter.subject, "replay-1")


class FakeStatus:
    """``GET /v1/status``'s gatherer (services/gateway/status.py) without a bus to ask."""

    async def status(self) -> Any:
        return SimpleNamespace(as_dict=lambda: {"ok": True, "problems": []})


# One request per (method, route path); a new endpoint must add its sample here.
SAMPLES: dict[tuple[str, str], tuple[str, Any]] = {
    ("GET", "/v1/whoami"): ("/v1/whoami", None),
    ("POST", "/v1/jobs"): ("/v1/jobs", {"workload": {"kind": "finetune"}}),
    ("GET", "/v1/jobs"): ("/v1/jobs?state=queued", None),
    ("GET", "/v1/jobs/{job_id}"): ("/v1/jobs/j1", None),
    ("GET", "/v1/jobs/{job_id}/events"): ("/v1/jobs/j1/events", None),
    ("GET", "/v1/jobs/{job_id}/steps"): ("/v1/jobs/j1/steps", None),
    ("GET", "/v1/jobs/{job_id}/logs"): ("/v1/jobs/j1/logs?stream=stderr", None),
    ("POST", "/v1/jobs/{job_id}/cancel"): ("/v1/jobs/j1/cancel", None),
    ("POST", "/v1/jobs/{job_id}/requeue"): ("/v1/jobs/j1/requeue", {"gpu_ceiling_seconds": 500}),
    ("GET", "/v1/executors"): ("/v1/executors", None),
    ("GET", "/v1/policies/gang"): ("/v1/policies/gang", None),
    ("PUT", "/v1/policies/gang"): ("/v1/policies/gang", {"ready_timeout_seconds": 60, "backoff_limit": None}),
    ("GET", "/v1/orgs"): ("/v1/orgs", None),
    ("PUT", "/v1/orgs/{name}"): ("/v1/orgs/north", {"cohort": "h", "quotas": {"default": {"nominal": 2}}}),
    ("PUT", "/v1/orgs/{org}/projects/{name}"): ("/v1/orgs/north/projects/radiology", {}),
    ("PUT", "/v1/cohorts/{name}"): ("/v1/cohorts/h", {"preemption": "never"}),
    ("GET", "/v1/usage"): ("/v1/usage?period=2026-12", None),
    ("POST", "/v1/tokens"): ("/v1/tokens", {"actor": "bob", "role": "viewer"}),
    ("GET", "/v1/tokens"): ("/v1/tokens", None),
    ("DELETE", "/v1/sessions/current"): ("/v1/sessions/current", None),
    ("DELETE", "/v1/sessions"): ("/v1/sessions?actor=olga", None),
    ("GET", "/v1/sessions"): ("/v1/sessions", None),
    ("GET", "/v1/role-bindings"): ("/v1/role-bindings", None),
    ("POST", "/v1/role-bindings"): ("/v1/role-bindings", {"subject": "u-1", "role": "operator"}),
    ("DELETE", "/v1/role-bindings/{binding_id}"): ("/v1/role-bindings/b-none", None),
    ("DELETE", "/v1/tokens/{token_id}"): ("/v1/tokens/{viewer_token_id}", None),
    ("POST", "/v1/me/tokens"): ("/v1/me/tokens", {"role": "viewer", "description": "a script"}),
    ("GET", "/v1/me/tokens"): ("/v1/me/tokens", None),
    ("DELETE", "/v1/me/tokens/{token_id}"): ("/v1/me/tokens/{own_token_id}", None),
    ("GET", "/v1/audit"): ("/v1/audit?actor=x", None),
    ("GET", "/v1/commands/{command_id}"): ("/v1/commands/c1", None),
    ("GET", "/v1/audit/verify"): ("/v1/audit/verify", None),
    ("POST", "/v1/health-checks"): ("/v1/health-checks", {"group": "g"}),
    ("GET", "/v1/health-checks/{run_id}"): ("/v1/health-checks/r1", None),
    ("GET", "/v1/nodes"): ("/v1/nodes", None),
    ("GET", "/v1/node-groups"): ("/v1/node-groups", None),
    ("POST", "/v1/nodes/{node_id}/drain"): ("/v1/nodes/n1/drain", None),
    ("POST", "/v1/nodes/{node_id}/undrain"): ("/v1/nodes/n1/undrain", None),
    ("POST", "/v1/node-groups/{group}/clear-alert"): ("/v1/node-groups/g1/clear-alert", None),
    ("GET", "/v1/dead-letters"): ("/v1/dead-letters?service=queue", None),
    ("GET", "/v1/dead-letters/{seq}"): ("/v1/dead-letters/1", None),
    ("POST", "/v1/dead-letters/{seq}/replay"): ("/v1/dead-letters/1/replay", None),
    ("GET", "/v1/status"): ("/v1/status", None),
}
# No authentication by design: load balancer probes; what a sign-in needs before it has credentials, and the
# exchange of a provider's ID token (itself the credential, checked in domain/oidc.py) for a session.
PUBLIC = {("GET", "/healthz"), ("GET", "/v1/identity/providers"), ("POST", "/v1/sessions/oidc")}
# Allowed requests whose answer is not 2xx: signing out is for sessions (an API token is revoked instead), and a
# binding that does not exist is not found (after the permission check).
ALLOWED_STATUS = {("DELETE", "/v1/sessions/current"): 409, ("DELETE", "/v1/role-bindings/{binding_id}"): 404}


@pytest.fixture
def gateway(tmp_path):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    tokens = {role: auth.issue_token(settings.effective_tokens_file, role.value, role) for role in Role}
    commands = FakeCommands()
    app = create_app(settings, reads=FakeReads(), commands=commands, dead_letters=FakeDeadLetters(),
                     job_logs=FakeJobLogs())
    app.state.status = FakeStatus()
    with TestClient(app) as client:
        yield app, client, tokens, commands


def routes(app) -> list[tuple[str, str]]:
    docs = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    # The API only: the panel's pages (outside /v1) are held to their permissions in tests/unit/test_panel_web.py.
    return sorted((m, r.path) for r in app.routes if isinstance(r, APIRoute) and r.path not in docs
                  and (r.path.startswith("/v1/") or r.path == "/healthz") for m in r.methods)


def test_every_endpoint_declares_a_permission_and_has_a_sample(gateway):
    app = gateway[0]
    for method, path in routes(app):
        if (method, path) in PUBLIC:
            continue
        route = next(r for r in app.routes if isinstance(r, APIRoute) and r.path == path and method in r.methods)
        assert route_permission(route) is not None, f"{method} {path} declares no permission"
        assert (method, path) in SAMPLES, f"{method} {path} has no sample request in this test"


def _matrix():
    app = create_app(GatewaySettings.from_env(env={}))
    for method, path in routes(app):
        if (method, path) in PUBLIC:
            continue
        route = next(r for r in app.routes if isinstance(r, APIRoute) and r.path == path and method in r.methods)
        for role in Role:
            yield pytest.param(method, path, role, auth.allows(role, route_permission(route)),
                               id=f"{role.value} {method} {path}")


@pytest.mark.parametrize(("method", "path", "role", "allowed"), list(_matrix()))
def test_every_endpoint_with_every_role(gateway, method, path, role, allowed):
    _, client, tokens, _ = gateway
    url, body = SAMPLES[(method, path)]
    url = url.replace("{viewer_token_id}", tokens[Role.VIEWER][0]).replace("{own_token_id}", tokens[role][0])
    JOB["owner"] = role.value  # the caller's own job: tenant scoping is tested apart (test_scoping_routes)
    try:
        resp = client.request(method, url, json=body, headers={"Authorization": f"Bearer {tokens[role][1]}"})
    finally:
        JOB["owner"] = "submitter"
    if allowed and (method, path) in ALLOWED_STATUS:
        assert resp.status_code == ALLOWED_STATUS[(method, path)], resp.text
    elif allowed:
        assert 200 <= resp.status_code < 300, resp.text
    else:
        assert resp.status_code == 403, resp.text
        assert resp.json()["permission"] in {p.value for p in Permission}


@pytest.mark.parametrize(("method", "path"), [k for k in SAMPLES], ids=lambda v: str(v))
@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "], ids=["none", "unknown", "basic",
                                                                                    "empty"])
def test_missing_or_bad_token_is_401(gateway, method, path, header):
    _, client, tokens, _ = gateway
    url, body = SAMPLES[(method, path)]
    resp = client.request(method, url.replace("{viewer_token_id}", "x"), json=body,
                          headers={"Authorization": header} if header else {})
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == "Bearer"
    assert resp.json()["error"] == "unauthorized"


def test_healthz_needs_no_token(gateway):
    assert gateway[1].get("/healthz").json()["status"] == "ok"


def test_permission_comes_before_validation(gateway):
    _, client, tokens, commands = gateway
    viewer = {"Authorization": f"Bearer {tokens[Role.VIEWER][1]}"}
    resp = client.post("/v1/jobs", content=b"{not json", headers={**viewer, "content-type": "application/json"})
    assert resp.status_code == 403 and resp.json()["permission"] == "finetune:submit"
    assert client.post("/v1/jobs", json={"workers": "x"}).status_code == 401
    # the refusal of a command by the gateway is recorded for the audit log
    assert [(o.kind, o.accepted, o.by) for o in commands.recorded] == [("submit", False, "gateway")]


def test_submitter_cannot_cancel_someone_elses_job_but_an_operator_can(gateway):
    _, client, tokens, commands = gateway
    JOB["owner"] = "someone"
    try:
        resp = client.post("/v1/jobs/j1/cancel", headers={"Authorization": f"Bearer {tokens[Role.SUBMITTER][1]}"})
        # Not theirs and they may not see it: not found (the id is not confirmed), recorded as refused.
        assert resp.status_code == 404 and resp.json()["error"] == "not_found"
        assert [(o.kind, o.accepted) for o in commands.recorded] == [("cancel", False)]
        assert commands.sent == []
        resp = client.post("/v1/jobs/j1/cancel", headers={"Authorization": f"Bearer {tokens[Role.OPERATOR][1]}"})
        assert resp.status_code == 200
        assert [c.actor for c in commands.sent] == ["operator"]
    finally:
        JOB["owner"] = "submitter"


@pytest.mark.parametrize("role", list(Role), ids=str)
def test_role_table_is_design_section_10(role):
    expected = {
        Role.VIEWER: {"read"},
        Role.SUBMITTER: {"read", "finetune:submit"},
        Role.OPERATOR: {"read", "read:all", "finetune:submit", "finetune:command", "finetune:manage", "fleet:manage"},
        Role.AUDITOR: {"read", "read:all", "audit:read"},
        Role.ADMIN: {p.value for p in Permission},
    }[role]
    assert {p.value for p in auth.ROLE_PERMISSIONS[role]} == expected
    assert "tokens:admin" in expected or role is not Role.ADMIN


def test_tokens_file_holds_only_hashes(tmp_path):
    path = tmp_path / "tokens.json"
    secret = auth.create_token(path, "alice", "operator")
    text = path.read_text()
    assert secret not in text
    (record,) = json.loads(text)["tokens"]
    assert record["sha256"] == auth.hash_secret(secret)
    assert record["actor"] == "alice" and record["role"] == "operator" and record["revoked"] is False
    assert {"id", "created_at"} <= record.keys()
    assert "sha256" not in auth.list_tokens(path)[0]


def test_authenticate_revoke_and_reload_on_change(tmp_path):
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    assert store.authenticate("anything") is None  # no file yet: nobody
    token_id, secret = auth.issue_token(path, "alice", "viewer")
    principal = store.authenticate(secret)
    assert principal is not None and principal.actor == "alice" and principal.role is Role.VIEWER
    assert store.authenticate(secret + "x") is None
    _, second = auth.issue_token(path, "bob", "admin")  # written after the store loaded the file
    assert store.authenticate(second).role is Role.ADMIN
    assert auth.revoke_token(path, token_id) is True
    assert store.authenticate(secret) is None
    assert store.authenticate(second) is not None
    assert auth.revoke_token(path, "no-such-id") is False


def test_a_broken_tokens_file_keeps_the_last_good_set(tmp_path):
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    secret = auth.create_token(path, "alice", "viewer")
    assert store.authenticate(secret) is not None
    path.write_text("{ half written")
    assert store.authenticate(secret) is not None


@pytest.mark.parametrize(("actor", "role"), [("", "viewer"), ("alice", "root"), ("x" * 201, "viewer")])
def test_create_token_refuses_bad_input(tmp_path, actor, role):
    with pytest.raises(ValueError):
        auth.create_token(tmp_path / "t.json", actor, role)


def test_token_endpoints_create_list_revoke(gateway):
    app, client, tokens, commands = gateway
    admin = {"Authorization": f"Bearer {tokens[Role.ADMIN][1]}"}
    made = client.post("/v1/tokens", json={"actor": "carol", "role": "auditor"}, headers=admin).json()
    assert made["secret"].startswith("teto_") and "audit:read" in made["permissions"]
    carol = {"Authorization": f"Bearer {made['secret']}"}
    assert client.get("/v1/audit", headers=carol).status_code == 200
    listed = client.get("/v1/tokens", headers=admin).json()
    assert any(t["id"] == made["id"] for t in listed) and all("sha256" not in t for t in listed)
    assert client.delete(f"/v1/tokens/{made['id']}", headers=admin).status_code == 204
    assert client.get("/v1/audit", headers=carol).status_code == 401
    assert client.delete("/v1/tokens/nope", headers=admin).status_code == 404
    bad = client.post("/v1/tokens", json={"actor": "dave", "role": "root"}, headers=admin)
    assert bad.status_code == 422 and "role" in bad.json()["reason"]
    assert [o.kind for o in commands.recorded if o.accepted] == ["token_create", "token_revoke"]


def test_submit_owner_is_the_tokens_actor_and_idempotency_key_names_command_and_job_per_actor(gateway):
    _, client, tokens, commands = gateway
    h = {"Authorization": f"Bearer {tokens[Role.SUBMITTER][1]}"}
    assert client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers=h).status_code == 201
    resp = client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers={**h, "Idempotency-Key": "k-1"})
    assert resp.status_code == 201
    first, second = commands.sent
    assert first.actor == second.actor == "submitter" and first.command_id != "k-1"
    derived = job_id_for_key("submitter", "k-1")
    assert (second.command_id, second.job_id) == (derived, derived)
    bad = client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers={**h, "Idempotency-Key": "a b"})
    assert bad.status_code == 422 and "idempotency-key" in bad.json()["reason"].lower()


def test_dead_letters_are_listed_for_operators_and_a_replay_is_recorded_with_the_actor(gateway):
    app, client, tokens, commands = gateway
    headers = {"Authorization": f"Bearer {tokens[Role.OPERATOR][1]}"}
    body = client.get("/v1/dead-letters", headers=headers).json()
    listed, step = body["dead_letters"]
    assert body["counts"] == {"queue": 2}
    assert listed["seq"] == 1 and listed["cause"] == "permanent" and listed["payload"] == '{"kind": "submit"}'
    assert listed["subject"] == "teto.cmd.submit" and listed["replayable"] and listed["not_replayable"] is None
    # A step report is the executor's to publish: the bus would refuse the gateway's copy, so it says why at once.
    assert step["seq"] == 3 and not step["replayable"] and "only the part that sent it" in step["not_replayable"]
    assert client.get("/v1/dead-letters/2", headers=headers).status_code == 404
    refused = client.post("/v1/dead-letters/3/replay", headers=headers)
    assert refused.status_code == 409 and refused.json()["error"] == "not_replayable"
    assert "teto.progress.j1" in refused.json()["reason"]
    resp = client.post("/v1/dead-letters/1/replay", headers=headers)
    assert resp.status_code == 200 and resp.json()["subject"] == "teto.cmd.submit"
    assert app.state.dead_letters.replayed == [1]
    (rec,) = [o for o in commands.recorded if o.kind == "dead_letter_replay"]
    assert rec.detail["actor"] == Role.OPERATOR.value and rec.detail["seq"] == 1


def test_the_token_check_runs_on_the_event_loop_not_in_a_thread_pool(gateway, monkeypatch):
    """A plain ``def`` dependency is run by FastAPI in its thread pool: a thread hop on every request for a
    dictionary lookup and a hash (a twentieth of the gateway's busy time in a submit profile)."""
    import asyncio

    _, client, tokens, _ = gateway
    on_loop: list[bool] = []
    real = auth.authenticate

    def watched(request):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # a worker thread has no running loop
            on_loop.append(False)
        return real(request)

    monkeypatch.setattr(auth, "authenticate", watched)
    headers = {"Authorization": f"Bearer {tokens[Role.ADMIN][1]}"}
    assert client.get("/v1/jobs/j1", headers=headers).status_code == 200
    assert client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers=headers).status_code < 300
    assert client.get("/jobs", headers=headers).status_code == 200  # a panel page (signed_in)
    assert on_loop and all(on_loop), on_loop


def test_a_bus_timeout_reads_as_the_bus_not_answering_never_as_the_database(gateway):
    """nats-py's TimeoutError is also an OSError, which the gateway answers as the database being unavailable."""
    import nats.errors

    app, client, tokens, _ = gateway

    async def silent(seq: int, letter: Any) -> Replayed:
        raise nats.errors.TimeoutError

    app.state.dead_letters.replay = silent
    resp = client.post("/v1/dead-letters/1/replay", headers={"Authorization": f"Bearer {tokens[Role.OPERATOR][1]}"})
    assert resp.status_code == 503 and resp.json()["reason"] == "the bus did not answer: TimeoutError"
