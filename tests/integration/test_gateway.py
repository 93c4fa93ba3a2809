"""The gateway against real NATS and PostgreSQL, with a stand-in queue in the test that answers commands.

The stand-in consumes ``teto.cmd.>`` from JetStream, writes a row into a stand-in ``queue.jobs_public`` table
(the real queue owns that view; it is not run here), and answers with a CommandOutcome: accepted, refused, or
nothing at all, depending on the job's name. So every HTTP answer (201/409/422/202/401/403/404/413) is checked
end to end through the bus and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from libs.contracts.commands import COMMANDS, CommandOutcome
from libs.runtime import bus
from libs.runtime.service import Runtime
from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration

STAND_IN_DDL = """
CREATE SCHEMA IF NOT EXISTS queue;
CREATE TABLE queue.jobs_public (
    id text PRIMARY KEY, name text, owner text, state text, spec jsonb, attempts jsonb, attempt_number int,
    executor_id text, lease_epoch int, lease_expires_at timestamptz, last_step int, total_steps int,
    step_seconds double precision, last_checkpoint jsonb, reason text, error text, ceiling_history jsonb,
    created_at timestamptz DEFAULT now(), updated_at timestamptz DEFAULT now(),
    org text DEFAULT 'default', project text DEFAULT 'default');
CREATE TABLE queue.job_events_public (
    job_id text, seq int, event text, state text, previous_state text, reason text, epoch int,
    executor_id text, detail jsonb, time timestamptz DEFAULT now());
"""
HEALTH_BUDGET_DDL = """
CREATE SCHEMA IF NOT EXISTS health;
CREATE TABLE health.job_signals_public (job_id text, executor_id text, signal text, signal_since timestamptz,
    detail jsonb);
CREATE TABLE health.executors_public (executor_id text, node_id text, group_name text, gpus jsonb,
    accepting boolean, phase text, step int, job_id text, epoch int, last_heartbeat timestamptz, signal text,
    signal_since timestamptz, detail jsonb);
CREATE SCHEMA IF NOT EXISTS budget;
CREATE TABLE budget.jobs_public (job_id text, ceiling_seconds double precision, consumed_seconds double precision,
    remaining_seconds double precision, overshoot_seconds double precision, warning jsonb, ceiling_history jsonb);
CREATE TABLE budget.ledger_public (job_id text, gpu_seconds double precision, at timestamptz);
CREATE TABLE budget.usage_public (job_id text, epoch int, executor_id text, seq int, devices int,
    wall_seconds double precision, gpu_seconds double precision, started_at timestamptz, ended_at timestamptz,
    recorded_at timestamptz DEFAULT now(), last boolean DEFAULT false);
"""




async def stand_in_queue(rt: Runtime) -> None:
    """Answer commands like the queue would; the job name picks the answer."""
    sub = await rt.js.pull_subscribe(rt.subjects.cmd_all, durable=None, stream=rt.subjects.stream_name("CMD"))
    try:
        await _serve_commands(rt, sub)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _serve_commands(rt: Runtime, sub: Any) -> None:
    while True:
        try:
            msgs = await sub.fetch(10, timeout=0.2)
        except Exception:  # noqa: BLE001 - nothing yet
            continue
        for m in msgs:
            await m.ack()
            kind = m.subject.rsplit(".", 1)[-1]
            cmd = COMMANDS[kind].decode(m.data)
            outcome = await _decide(rt, kind, cmd)
            if outcome is not None:
                await bus.publish(rt.js, rt.subjects.outcome(kind, cmd.command_id), outcome)


async def _decide(rt: Runtime, kind: str, cmd: Any) -> CommandOutcome | None:
    def answer(accepted: bool, reason: str | None = None, **detail: Any) -> CommandOutcome:
        return CommandOutcome(command_id=cmd.command_id, kind=kind, accepted=accepted, reason=reason,
                              detail=detail, job_id=cmd.job_id, by="queue")

    if kind == "submit":
        if cmd.spec.name == "silent":
            return None
        if cmd.spec.name == "refuse-me":
            return answer(False, "duplicate job name")
        async with rt.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO queue.jobs_public (id, name, owner, state, spec, attempts, attempt_number, lease_epoch,"
                " last_step, total_steps, step_seconds) VALUES ($1, $2, $3, 'queued', $4::jsonb, '{}'::jsonb, 0, 0,"
                " 60, 300, 0.5)",
                cmd.job_id, cmd.spec.name, cmd.actor, cmd.spec.model_dump_json())
            await conn.execute("INSERT INTO queue.job_events_public (job_id, seq, event, state, detail)"
                               " VALUES ($1, 1, 'submitted', 'queued', '{}'::jsonb)", cmd.job_id)
        return answer(True)  # committed before answering: read-your-writes
    if kind == "cancel":
        await rt.pool.execute("UPDATE queue.jobs_public SET state = 'cancelled' WHERE id = $1", cmd.job_id)
        return answer(True)
    if kind == "requeue":
        return answer(False, f"new ceiling {cmd.gpu_ceiling_seconds:g}s is below consumed 100s + 60s",
                      consumed_seconds=100.0, minimum_seconds=160.0, given_seconds=cmd.gpu_ceiling_seconds)
    return None


class Gw:
    def __init__(self, rt: Runtime, client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        self.rt, self.client, self.tokens = rt, client, tokens

    def as_(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


@contextlib.asynccontextmanager
async def gateway(env, *, stand_in: bool = True, **overrides: Any) -> AsyncIterator[Gw]:
    settings = env.settings(GatewaySettings, command_timeout_seconds=overrides.pop("timeout", 3.0), **overrides)
    rt = await Runtime.open("gateway", settings, schema="gateway", package="services.gateway")
    task = None
    try:
        if stand_in:
            await rt.pool.execute(STAND_IN_DDL)
            task = asyncio.create_task(stand_in_queue(rt))
        tokens = {r.value: auth.create_token(settings.effective_tokens_file, f"{r.value}-actor", r) for r in auth.Role}
        app = create_app(settings, rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield Gw(rt, client, tokens)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await rt.close()


async def test_submit_is_accepted_and_visible_at_once_with_signal_budget_and_checkpoint(env):
    async with gateway(env) as gw:
        resp = await gw.client.post("/v1/jobs", json={"name": "demo", "workload": {"kind": "finetune"}},
                                    headers=gw.as_("submitter"))
        assert resp.status_code == 201, resp.text
        job = resp.json()
        assert job["owner"] == "submitter-actor" and job["state"] == "queued" and job["name"] == "demo"
        assert job["signal"] is None and job["budget"] is None
        # 60 of 300 steps done, a checkpoint every 50, 0.5 s a step: next at 100 -> 40 steps -> 20 s (once running)
        assert job["checkpoint"] == {"every_steps": 50, "last_step": None, "next_step": 100, "next_eta_seconds": None,
                                     "next_eta_status": "not_running", "last_kind": None, "last_bytes": None}
        assert [e["event"] for e in job["events"]] == ["submitted"]

        await gw.rt.pool.execute(HEALTH_BUDGET_DDL)
        await gw.rt.pool.execute("UPDATE queue.jobs_public SET state = 'running' WHERE id = $1", job["id"])
        await gw.rt.pool.execute(
            "INSERT INTO health.job_signals_public VALUES ($1, 'e1', 'stuck', now(), '{\"stuck_after_seconds\": 5}')",
            job["id"])
        await gw.rt.pool.execute(
            "INSERT INTO budget.jobs_public VALUES ($1, 3600, 100, 3500, 0, null, '[]')", job["id"])
        # auditor: read:all (a viewer sees only its own jobs, tests/security/test_tenant_scoping.py)
        got = (await gw.client.get(f"/v1/jobs/{job['id']}", headers=gw.as_("auditor"))).json()
        assert got["signal"]["signal"] == "stuck" and got["signal"]["stuck_after_seconds"] == 5
        assert got["budget"]["consumed_seconds"] == 100 and got["budget"]["remaining_seconds"] == 3500
        # stuck: the step stands still, so no ETA (issue 26: "in 5 s" for minutes), and the reason is given
        assert (got["checkpoint"]["next_eta_seconds"], got["checkpoint"]["next_eta_status"]) == (None, "standing")
        await gw.rt.pool.execute("UPDATE health.job_signals_public SET signal = 'ok' WHERE job_id = $1", job["id"])
        got = (await gw.client.get(f"/v1/jobs/{job['id']}", headers=gw.as_("auditor"))).json()
        assert (got["checkpoint"]["next_eta_seconds"], got["checkpoint"]["next_eta_status"]) == (20.0, "estimated")
        await gw.rt.pool.execute("UPDATE health.job_signals_public SET signal = 'stuck' WHERE job_id = $1", job["id"])

        listed = (await gw.client.get("/v1/jobs?state=running", headers=gw.as_("auditor"))).json()
        assert [j["id"] for j in listed] == [job["id"]] and listed[0]["signal"]["signal"] == "stuck"
        assert (await gw.client.get("/v1/jobs?state=queued", headers=gw.as_("auditor"))).json() == []
        events = (await gw.client.get(f"/v1/jobs/{job['id']}/events", headers=gw.as_("auditor"))).json()
        assert [(e["seq"], e["event"]) for e in events] == [(1, "submitted")]


async def test_refused_command_is_409_and_ceiling_refusal_is_422_with_the_numbers(env):
    async with gateway(env) as gw:
        resp = await gw.client.post("/v1/jobs", json={"name": "refuse-me", "workload": {"kind": "finetune"}},
                                    headers=gw.as_("submitter"))
        assert resp.status_code == 409 and resp.json()["reason"] == "duplicate job name"
        ok = await gw.client.post("/v1/jobs", json={"name": "a", "workload": {"kind": "finetune"}},
                                  headers=gw.as_("submitter"))
        job_id = ok.json()["id"]
        resp = await gw.client.post(f"/v1/jobs/{job_id}/requeue", json={"gpu_ceiling_seconds": 120},
                                    headers=gw.as_("operator"))
        assert resp.status_code == 422, resp.text
        assert resp.json()["detail"] == {"consumed_seconds": 100.0, "minimum_seconds": 160.0, "given_seconds": 120.0}
        resp = await gw.client.post(f"/v1/jobs/{job_id}/requeue", json={"gpu_ceiling_seconds": 500},
                                    headers=gw.as_("submitter"))
        assert resp.status_code == 403 and resp.json()["permission"] == "finetune:manage"


async def test_owner_cancels_own_job_and_the_view_shows_it(env):
    async with gateway(env) as gw:
        ok = await gw.client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers=gw.as_("submitter"))
        job_id = ok.json()["id"]
        resp = await gw.client.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "wrong data"},
                                    headers=gw.as_("submitter"))
        assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
        assert (await gw.client.post("/v1/jobs/nope/cancel", headers=gw.as_("admin"))).status_code == 404


async def test_no_outcome_in_time_is_202_and_the_command_is_durable(env):
    async with gateway(env, timeout=0.5) as gw:
        resp = await gw.client.post("/v1/jobs", json={"name": "silent", "workload": {"kind": "finetune"}},
                                    headers=gw.as_("submitter"))
        assert resp.status_code == 202
        body = resp.json()
        assert body["status"] == "pending" and body["command_id"] and body["job_id"]
        info = await gw.rt.js.stream_info(gw.rt.subjects.stream_name("CMD"))
        assert info.state.messages == 1


async def test_auth_and_not_found_and_gateway_refusals_are_recorded(env):
    async with gateway(env, stand_in=False) as gw:
        outcomes: list[CommandOutcome] = []

        async def collect(m: Any) -> None:
            outcomes.append(CommandOutcome.decode(m.data))

        sub = await gw.rt.nc.subscribe(gw.rt.subjects.outcome_all, cb=collect)
        assert (await gw.client.get("/v1/jobs")).status_code == 401
        assert (await gw.client.get("/v1/jobs", headers={"Authorization": "Bearer x"})).status_code == 401
        resp = await gw.client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers=gw.as_("viewer"))
        assert resp.status_code == 403 and resp.json()["permission"] == "finetune:submit"
        assert (await gw.client.get("/v1/jobs/unknown", headers=gw.as_("viewer"))).status_code == 404
        assert (await gw.client.get("/v1/jobs/../../etc", headers=gw.as_("viewer"))).status_code == 404
        assert (await gw.client.get("/v1/jobs/unknown/events", headers=gw.as_("viewer"))).status_code == 404
        # views that do not exist yet read as empty, not as errors
        assert (await gw.client.get("/v1/jobs", headers=gw.as_("viewer"))).json() == []
        assert (await gw.client.get("/v1/executors", headers=gw.as_("viewer"))).json() == []
        audit = await gw.client.get("/v1/audit", headers=gw.as_("auditor"))
        assert audit.status_code == 200 and audit.json()["entries"] == []
        resp = await gw.client.post("/v1/jobs", json={"workers": 0, "workload": {"kind": "finetune"}},
                                    headers=gw.as_("submitter"))
        assert resp.status_code == 422 and "body.workers" in resp.json()["reason"]
        await eventually(lambda: _true(len(outcomes) >= 3))
        # The unknown bearer token is a failed authentication, audited as the gateway's refusal (throttle.py);
        # the request without any token is a plain 401, not counted and not recorded.
        assert [(o.kind, o.accepted, o.by, o.detail["actor"]) for o in outcomes] == [
            ("authenticate", False, "gateway", None), ("submit", False, "gateway", "viewer-actor"),
            ("submit", False, "gateway", "submitter-actor")]
        failed = outcomes[0].detail
        assert (failed["failure"], failed["method"], failed["path"], failed["failures_from_source"]) == (
            "unknown_token", "GET", "/v1/jobs", 1)
        await sub.unsubscribe()


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize(("body", "field"), [
    ({"workload": {"kind": "finetune"}, "workers": "many"}, "body.workers"),
    ({"workload": {"kind": "finetune", "params": {"steps": [1]}}}, "body.workload.finetune.params.steps"),
    ({"workload": {"kind": "command", "command": []}}, "body.workload.command.command"),
    ({"workload": {"kind": "rm -rf"}}, "body.workload"),
    ({"workload": {"kind": "finetune"}, "extra": 1}, "body.extra"),
    ({}, "body.workload"),
    ([1, 2], "body"),
], ids=["wrong-type", "nested-wrong-type", "empty-argv", "unknown-kind", "unknown-field", "missing", "array"])
async def test_invalid_bodies_are_422_naming_the_field(env, body, field):
    async with gateway(env, stand_in=False) as gw:
        resp = await gw.client.post("/v1/jobs", json=body, headers=gw.as_("submitter"))
        assert resp.status_code == 422, resp.text
        assert field in resp.json()["reason"]


async def test_hostile_bodies_get_4xx_never_500(env):
    async with gateway(env, stand_in=False) as gw:
        h = {**gw.as_("submitter"), "content-type": "application/json"}
        huge = b'{"workload": {"kind": "finetune"}, "name": "' + b"x" * (5 << 20) + b'"}'
        resp = await gw.client.post("/v1/jobs", content=huge, headers=h)
        assert resp.status_code == 413 and resp.json()["error"] == "too_large"
        deep = b'{"workload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        for hostile in (deep, b"\xff\xfe not json", b"{not json", b""):
            resp = await gw.client.post("/v1/jobs", content=hostile, headers=h)
            assert resp.status_code == 422, resp.text
            assert resp.json()["errors"][0]["field"].startswith("body")
        nested_env = {"workload": {"kind": "command", "command": ["x"], "env": {"A": {"B": {"C": [1]}}}}}
        resp = await gw.client.post("/v1/jobs", json=nested_env, headers=h)
        assert resp.status_code == 422 and "body.workload.command.env.A" in resp.json()["reason"]
        for number in (b"1e400", b"NaN", b"-Infinity"):
            body = b'{"workload": {"kind": "finetune"}, "gpu_ceiling_seconds": ' + number + b"}"
            resp = await gw.client.post("/v1/jobs", content=body, headers=h)
            assert resp.status_code == 422 and "body.gpu_ceiling_seconds" in resp.json()["reason"]


async def test_executors_come_from_the_health_view(env):
    async with gateway(env, stand_in=False) as gw:
        await gw.rt.pool.execute(HEALTH_BUDGET_DDL)
        await gw.rt.pool.execute(
            "INSERT INTO health.executors_public VALUES ('e1', 'n1', 'g', '[]', true, 'idle', null, null, null,"
            " now(), 'ok', now(), '{}')")
        (ex,) = (await gw.client.get("/v1/executors", headers=gw.as_("viewer"))).json()
        assert ex["executor_id"] == "e1" and ex["group_name"] == "g" and ex["gpus"] == [] and ex["signal"] == "ok"


async def test_serve_answers_over_http_and_stops_when_cancelled(env):
    from libs.runtime.ports import free_port
    from services.gateway.app import serve

    port = free_port()
    settings = env.settings(GatewaySettings, http_port=port)
    async with running(serve, settings) as task:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).json() == {"status": "ok", "connected": True}
            assert "/v1/jobs" in (await client.get("/openapi.json")).json()["paths"]
    assert task.done()


async def test_gateway_refusals_reach_the_real_audit_log_and_verify_passes(env):
    from services.audit.app import serve as audit_serve
    from services.audit.settings import AuditSettings

    async with running(audit_serve, env.settings(AuditSettings)):
        async with gateway(env, stand_in=False) as gw:
            resp = await gw.client.post("/v1/jobs", json={"workload": {"kind": "finetune"}}, headers=gw.as_("viewer"))
            assert resp.status_code == 403

            async def refused_entries() -> list[dict[str, Any]]:
                resp = await gw.client.get("/v1/audit?kind=submit", headers=gw.as_("auditor"))
                assert resp.status_code == 200, resp.text
                return [e for e in resp.json()["entries"] if e["outcome"] == "refused"]

            (entry,) = await eventually(refused_entries, timeout=15)
            assert entry["actor"] == "viewer-actor" and "finetune:submit" in entry["reason"]
            verdict = (await gw.client.get("/v1/audit/verify", headers=gw.as_("auditor"))).json()
            assert verdict["ok"] is True and verdict["checked"] >= 1 and verdict["first_bad_seq"] is None
            assert verdict["anchors_checked"] == 0 and verdict["keyed"] is False  # asked of the audit service
            assert (await gw.client.get("/v1/audit", headers=gw.as_("operator"))).status_code == 403


async def test_audit_verify_without_the_audit_service_is_503_saying_so(env):
    """Verify needs the audit key, which only the audit service holds: the gateway asks it, never itself."""
    async with gateway(env, stand_in=False) as gw:
        resp = await gw.client.get("/v1/audit/verify", headers=gw.as_("auditor"))
        assert resp.status_code == 503, resp.text
        assert "audit service" in resp.json()["reason"]


async def test_database_gone_is_503_not_500(env):
    async with gateway(env, stand_in=False) as gw:
        await gw.rt.pool.close()
        resp = await gw.client.get("/v1/jobs", headers=gw.as_("viewer"))
        assert resp.status_code == 503 and resp.json()["error"] == "unavailable"


async def test_with_the_real_queue_submit_cancel_and_refusals(env):
    """The column contract of queue.jobs_public / job_events_public, checked against the queue itself."""
    queue_app = pytest.importorskip("services.queue.app")
    from services.queue.settings import QueueSettings

    async with running(queue_app.serve, env.settings(QueueSettings)):
        async with gateway(env, stand_in=False, timeout=10.0) as gw:
            resp = await gw.client.post("/v1/jobs", json={"name": "real", "workload": {"kind": "finetune"}},
                                        headers=gw.as_("submitter"))
            assert resp.status_code == 201, resp.text
            job = resp.json()
            assert job["name"] == "real" and job["owner"] == "submitter-actor" and job["state"] == "queued"
            assert job["events"][0]["event"] == "submitted" and job["checkpoint"]["every_steps"] == 50
            resp = await gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.as_("submitter"))
            assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
            assert [e["event"] for e in resp.json()["events"]] == ["submitted", "cancelled"]
            again = await gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.as_("operator"))
            assert again.status_code == 409 and again.json()["by"] == "queue"
            listed = (await gw.client.get("/v1/jobs?state=cancelled", headers=gw.as_("auditor"))).json()
            assert [j["id"] for j in listed] == [job["id"]]


async def test_respond_async_answers_once_durable_and_the_decision_is_read_from_the_audit_log(env):
    """``Prefer: respond-async`` (RFC 7240): 202 as soon as the command is in the command stream, with where to read
    its decision; ``GET /v1/commands/{id}`` then says pending, accepted or refused (with the reason and who
    decided), to its actor and to whoever sees every owner's jobs only. The same endpoint answers the plain 202 (no
    outcome in time)."""
    queue_app = pytest.importorskip("services.queue.app")
    from services.audit.app import serve as audit_serve
    from services.audit.settings import AuditSettings
    from services.queue.settings import QueueSettings

    async with running(queue_app.serve, env.settings(QueueSettings)), \
            running(audit_serve, env.settings(AuditSettings, batch_linger_seconds=0.0)):
        async with gateway(env, stand_in=False, timeout=10.0) as gw:
            prefer = {**gw.as_("submitter"), "Prefer": "wait=5, respond-async"}
            resp = await gw.client.post("/v1/jobs", json={"name": "later", "workload": {"kind": "finetune"}},
                                        headers=prefer)
            assert resp.status_code == 202, resp.text
            assert resp.headers["preference-applied"] == "respond-async"
            body = resp.json()
            assert body["status"] == "pending" and resp.headers["location"] == f"/v1/commands/{body['command_id']}"

            async def decided(command_id: str, role: str = "submitter") -> dict[str, Any] | None:
                r = await gw.client.get(f"/v1/commands/{command_id}", headers=gw.as_(role))
                return r.json() if r.status_code == 200 and r.json()["status"] != "pending" else None

            view = await eventually(lambda: decided(body["command_id"]), timeout=20)
            assert view["status"] == "accepted" and view["by"] == "queue" and view["kind"] == "submit"
            assert view["job_id"] == body["job_id"] and view["actor"] == "submitter-actor"
            assert view["received_at"] and view["decided_at"]
            job = (await gw.client.get(f"/v1/jobs/{body['job_id']}", headers=gw.as_("submitter"))).json()
            assert job["state"] == "queued"  # accepted: the job exists as the queue made it

            # A refusal is read the same way: cancelling the job twice, the second asynchronously.
            first = await gw.client.post(f"/v1/jobs/{body['job_id']}/cancel", headers=gw.as_("submitter"))
            assert first.status_code == 200, first.text
            second = await gw.client.post(f"/v1/jobs/{body['job_id']}/cancel", headers=prefer)
            assert second.status_code == 202
            refused = await eventually(lambda: decided(second.json()["command_id"]), timeout=20)
            assert refused["status"] == "refused" and refused["reason"] and refused["by"] == "queue"

            # Its actor and whoever sees every owner's jobs (operator, auditor) see it; another actor gets the 404
            # an unknown id gets.
            other = await gw.client.get(f"/v1/commands/{body['command_id']}", headers=gw.as_("viewer"))
            assert other.status_code == 404
            for role in ("operator", "auditor"):
                assert (await decided(body["command_id"], role))["status"] == "accepted"
            assert (await gw.client.get("/v1/commands/nope", headers=gw.as_("submitter"))).status_code == 404
            assert (await gw.client.get("/v1/commands/bad%20id", headers=gw.as_("submitter"))).status_code == 422
