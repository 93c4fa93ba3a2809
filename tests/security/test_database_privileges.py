"""Attack 3 (job -> the database), against a real PostgreSQL provisioned as ``teto up`` does it
(teto/stack/dbsetup.py): every service logs in with its own login, and each attempts what a job holding that
login's URL would do to the ledger, the audit log or another service's tables. Every attempt is refused by the
server; what each service must do still works (all five serve under their logins; a job submitted through the
gateway is stored by the queue, charged nowhere, audited, and read back through the public views).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from libs.runtime import db
from libs.runtime.dbroles import Roles
from libs.runtime.ports import free_port
from services.audit.app import serve as serve_audit
from services.audit.settings import AuditSettings
from services.budget.app import serve as serve_budget
from services.budget.settings import BudgetSettings
from services.gateway import auth
from services.gateway.app import serve as serve_gateway
from services.gateway.settings import GatewaySettings
from services.health.app import serve as serve_health
from services.health.settings import HealthSettings
from services.queue.app import serve as serve_queue
from services.queue.settings import QueueSettings
from teto.stack import dbsetup
from tests.support.services import eventually, running

pytestmark = pytest.mark.security

DENIED = (asyncpg.InsufficientPrivilegeError,)


@pytest.fixture
async def logins(env, tmp_path: Path) -> dbsetup.DatabaseLogins:
    found = await dbsetup.provision(env.database_url, dbsetup.passwords(tmp_path), own_cluster=False)
    assert found is not None, "the test cluster's superuser provisions"
    return found


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def refused(conn: asyncpg.Connection, sql: str) -> BaseException:
    """Run ``sql`` as an attacker would; return the server's refusal (fails the test if it was allowed)."""
    try:
        async with conn.transaction():
            await conn.execute(sql)
    except asyncpg.PostgresError as exc:
        return exc
    raise AssertionError(f"{await conn.fetchval('SELECT current_user')} was allowed: {sql}")


SEED = [
    "INSERT INTO budget.ledger (job_id, epoch, executor_id, seq, devices, wall_seconds, gpu_seconds)"
    " VALUES ('j1', 1, 'e1', 1, 1, 10, 10)",
]

# What any service login must never do to another's data or to the database (a job holding its URL).
FOREIGN = {
    "queue": ["UPDATE budget.ledger SET gpu_seconds = 0", "INSERT INTO budget.ledger SELECT * FROM budget.ledger",
              "DELETE FROM health.nodes", "SELECT * FROM budget.ledger", "SELECT * FROM budget.jobs_public",
              "UPDATE audit.log SET reason = 'x'",
              "INSERT INTO audit.log (command_id, time, recorded_at, subject, payload, outcome, prev_hash, hash)"
              " VALUES ('forged', now(), now(), 's', '{}', 'accepted', 'x', 'y')"],
    "budget": ["UPDATE queue.jobs SET state = 'succeeded'", "DELETE FROM audit.log", "SELECT * FROM queue.jobs",
               "INSERT INTO audit.log (command_id, time, recorded_at, subject, payload, outcome, prev_hash, hash)"
               " VALUES ('forged', now(), now(), 's', '{}', 'accepted', 'x', 'y')"],
    "health": ["UPDATE queue.jobs SET state = 'failed'", "DELETE FROM budget.ledger", "TRUNCATE audit.log"],
    "audit": ["UPDATE queue.jobs SET state = 'failed'", "DELETE FROM budget.ledger", "SELECT * FROM health.nodes"],
    "gateway": ["INSERT INTO queue.jobs (id) VALUES ('x')", "UPDATE queue.jobs SET state = 'failed'",
                "DELETE FROM budget.ledger", "SELECT * FROM queue.jobs", "SELECT * FROM budget.ledger",
                "SELECT * FROM health.nodes", "UPDATE audit.log SET reason = 'x'", "DELETE FROM audit.log",
                "SELECT * FROM queue.outbox",
                "INSERT INTO gateway.outbox (msg_id, subject, payload) VALUES ('m', 's', '')",
                "CREATE TABLE gateway.mine (x int)", "CREATE VIEW queue.jobs_public2 AS SELECT 1"],
}
# What every login is refused whatever its service: new schemas, objects in public, temporary objects.
EVERYONE = ["CREATE SCHEMA attacker", "CREATE TABLE public.attacker (x int)",
            "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'", "CREATE TEMP TABLE t (x int)",
            "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'"]


@pytest.mark.parametrize("service", sorted(FOREIGN))
async def test_a_login_cannot_touch_what_is_not_its_own(logins, service):
    async with connected(logins.admin_url) as admin:
        for sql in SEED:
            await admin.execute(sql)
    async with connected(logins.urls[service]) as conn:
        roles = Roles(await conn.fetchval("SELECT current_database()"))
        assert await conn.fetchval("SELECT current_user") == roles.login(service)
        for sql in [*FOREIGN[service], *EVERYONE]:
            exc = await refused(conn, sql)
            assert isinstance(exc, DENIED), (sql, exc)
        for other in [roles.audit_owner, *[r for r in roles.logins if r != roles.login(service)]]:
            exc = await refused(conn, f'SET ROLE "{other}"')
            assert isinstance(exc, DENIED), (other, exc)
    async with connected(logins.admin_url) as admin:  # nothing moved
        assert await admin.fetchval("SELECT sum(gpu_seconds) FROM budget.ledger") == 10


async def test_the_audit_login_can_append_and_nothing_else(logins, env):
    """The harm of 'Also': the table's writer rewriting history. It may INSERT and SELECT; the table, its
    triggers and functions belong to a role it cannot become."""
    async with connected(logins.urls["audit"]) as conn:
        roles = Roles(await conn.fetchval("SELECT current_database()"))
        seq = await conn.fetchval(
            "INSERT INTO audit.log (command_id, time, recorded_at, subject, payload, outcome, prev_hash, hash)"
            " VALUES ('c1', now(), now(), 's', '{}', 'received', 'p', 'h') RETURNING seq")
        attacks = [
            f"UPDATE audit.log SET reason = 'rewritten' WHERE seq = {seq}",
            f"DELETE FROM audit.log WHERE seq = {seq}",
            "TRUNCATE audit.log",
            "ALTER TABLE audit.log DISABLE TRIGGER log_no_update_delete",
            "ALTER TABLE audit.log DISABLE TRIGGER ALL",
            "DROP TRIGGER log_no_update_delete ON audit.log",
            "DROP TABLE audit.log",
            "ALTER TABLE audit.log RENAME TO old_log",
            f'ALTER TABLE audit.log OWNER TO "{roles.login("audit")}"',
            "CREATE OR REPLACE FUNCTION audit.log_append_only() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RETURN NEW; END $$",
            "CREATE FUNCTION audit.rewrite() RETURNS void LANGUAGE sql AS $$ DELETE FROM audit.log $$",
            "CREATE TABLE audit.log_forged (LIKE audit.log)",
            "CREATE OR REPLACE VIEW audit.log_public AS SELECT * FROM audit.log WHERE false",
            f'SET ROLE "{roles.audit_owner}"',
            f'GRANT "{roles.audit_owner}" TO "{roles.login("audit")}"',
            "SELECT setval('audit.log_seq_seq', 1)",
        ]
        for sql in attacks:
            exc = await refused(conn, sql)
            assert isinstance(exc, DENIED), (sql, exc)
        # Through the writer role (what the service uses) it is no better.
        await conn.execute(f'SET ROLE "{roles.audit_writer}"')
        for sql in attacks[:4]:
            assert isinstance(await refused(conn, sql), DENIED), sql
        await conn.execute("RESET ROLE")
        assert await conn.fetchval("SELECT reason FROM audit.log WHERE seq = $1", seq) is None
    server_log = env.infra.root / "pg" / "pgdata" / "server.log"  # the embedded server's (no Docker here)
    if server_log.exists():  # the refusals are visible to the operator
        text = server_log.read_text(errors="replace")
        assert "permission denied for table log" in text and "must be owner of table log" in text
    async with connected(logins.admin_url) as admin:
        owner = await admin.fetchval("SELECT tableowner FROM pg_tables WHERE schemaname = 'audit'"
                                     " AND tablename = 'log'")
        can_login = await admin.fetchval("SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", owner)
        members = await admin.fetch("SELECT m.rolname FROM pg_auth_members a JOIN pg_roles m ON m.oid = a.member"
                                    " JOIN pg_roles r ON r.oid = a.roleid WHERE r.rolname = $1", owner)
    assert owner == roles.audit_owner and can_login is False and members == []


async def test_without_the_password_nobody_connects(logins):
    for service, url in logins.urls.items():
        user = url.split("//", 1)[1].split(":", 1)[0]
        rest = url.split("@", 1)[1]
        for wrong in (f"postgresql://{user}@{rest}", f"postgresql://{user}:guess@{rest}"):
            with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
                await asyncpg.connect(wrong, timeout=10)
        async with connected(url) as conn:  # the right one works, and is stored as SCRAM
            assert await conn.fetchval("SELECT 1") == 1, service
    async with connected(logins.admin_url) as admin:
        stored = await admin.fetch("SELECT rolname, rolpassword FROM pg_authid WHERE rolname = ANY($1::text[])",
                                   logins.roles.logins)
    assert len(stored) == 5 and all(r["rolpassword"].startswith("SCRAM-SHA-256$") for r in stored)


async def test_a_login_that_owns_nothing_only_checks_its_migrations(logins, env):
    """The audit service and the gateway do not own their schema: they never migrate, and say so when the
    administrator has not (a new migration not yet applied)."""
    async with connected(logins.admin_url) as admin:
        await admin.execute("DELETE FROM audit.schema_migrations WHERE version = (SELECT max(version) FROM"
                            " audit.schema_migrations)")
    pool = await db.create_pool(logins.urls["audit"], max_size=1)
    try:
        with pytest.raises(db.MigrationsPending) as caught:
            await db.migrate(pool, "audit", "services.audit")
        assert caught.value.schema == "audit" and caught.value.pending
    finally:
        await pool.close()
    pool = await db.create_pool(logins.urls["gateway"], max_size=1)
    try:
        assert await db.migrate(pool, "gateway", "services.gateway") == []
    finally:
        await pool.close()


async def test_every_service_serves_under_its_login_and_a_job_goes_through(env, logins, tmp_path):
    """What each must do still works: all five start (migration checks, consumers, singleton locks, outbox
    relays) under their own login; a submitted job is stored, audited and read back through the views."""

    def settings(cls, service, **extra):
        return env.settings(cls, database_url=logins.urls[service], **extra)

    tokens = tmp_path / "tokens.json"
    secret = auth.create_token(tokens, "alice", "admin")
    port = free_port()
    gateway = settings(GatewaySettings, "gateway", http_port=port, tokens_file=tokens)
    async with contextlib.AsyncExitStack() as stack:
        for serve, cls, name in [(serve_audit, AuditSettings, "audit"), (serve_budget, BudgetSettings, "budget"),
                                 (serve_health, HealthSettings, "health"), (serve_queue, QueueSettings, "queue")]:
            await stack.enter_async_context(running(serve, settings(cls, name)))
        await stack.enter_async_context(running(serve_gateway, gateway))
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30) as http:
            r = await http.post("/v1/jobs", json={"name": "under-logins", "workload": {"kind": "finetune"}})
            assert r.status_code in (201, 202), r.text
            job_id = r.json()["id"]
            job = (await http.get(f"/v1/jobs/{job_id}")).json()
            assert job["state"] == "queued" and job["owner"] == "alice"
            # The job view's interruption cost and the step history read the budget's and the queue's newer
            # public views (usage_public, job_steps_public) under the gateway's login.
            assert "interruption_cost" in job and job["interruption_cost"] is None  # queued: nothing at risk
            steps = await http.get(f"/v1/jobs/{job_id}/steps")
            assert steps.status_code == 200 and steps.json()["reports"] == 0, steps.text
            audited = await eventually(
                lambda: _entries(http, job_id), 30, "the submit to be audited under the audit login")
            assert {"received", "accepted"} <= {e["outcome"] for e in audited}
            assert (await http.get("/v1/executors")).status_code == 200
            verdict = await http.get("/v1/audit/verify")
            assert verdict.status_code == 200 and verdict.json()["ok"] is True, verdict.text
    async with connected(logins.admin_url) as admin:
        owners = {r["tablename"]: r["tableowner"] for r in await admin.fetch(
            "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'queue'")}
    assert set(owners.values()) == {logins.roles.login("queue")}, owners


async def _entries(http: httpx.AsyncClient, job_id: str) -> list[dict]:
    r = await http.get("/v1/audit", params={"job_id": job_id})
    entries = r.json().get("entries", []) if r.status_code == 200 else []
    return entries if {"received", "accepted"} <= {e["outcome"] for e in entries} else []



async def test_an_installation_made_with_one_login_is_taken_over_by_the_owners(env, tmp_path):
    """Upgrading: everything an older Teto migrated as its single (superuser) login changes hands, so the
    audit log's triggers are out of every service's reach there too."""
    pool = await db.create_pool(env.database_url, max_size=1)
    try:
        for schema in dbsetup.ORDER:
            await db.migrate(pool, schema, f"services.{schema}")  # the old way: everything owned by the admin
    finally:
        await pool.close()
    logins = await dbsetup.provision(env.database_url, dbsetup.passwords(tmp_path), own_cluster=False)
    async with connected(logins.admin_url) as admin:
        rows = await admin.fetch(
            "SELECT n.nspname AS schema, c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY($1::text[])"
            " AND c.relkind IN ('r', 'v', 'S')", ["queue", "budget", "health", "audit"])
        functions = await admin.fetch("SELECT proname, pg_get_userbyid(proowner) AS owner FROM pg_proc p JOIN"
                                      " pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'audit'")
    wrong = [(r["schema"], r["relname"], r["owner"]) for r in rows if r["owner"] != logins.roles.owner(r["schema"])]
    assert rows and not wrong
    assert functions and {f["owner"] for f in functions} == {logins.roles.audit_owner}
    async with connected(logins.urls["audit"]) as conn:
        exc = await refused(conn, "ALTER TABLE audit.log DISABLE TRIGGER log_no_update_delete")
        assert isinstance(exc, DENIED)
    pool = await db.create_pool(logins.urls["queue"], max_size=1)
    try:
        assert await db.migrate(pool, "queue", "services.queue") == []  # its own schema, up to date
    finally:
        await pool.close()
