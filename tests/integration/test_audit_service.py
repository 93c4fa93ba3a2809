"""The audit service against real NATS and PostgreSQL: commands, outcomes and refused messages are stored
once each, the chain verifies, the database refuses changes (through the writer role by privilege, for a
superuser by trigger), and a row changed behind the trigger's back is named by verify."""

from __future__ import annotations

import json

import asyncpg
import pytest

from libs.contracts.commands import CommandOutcome, RequeueJob, SubmitJob
from libs.contracts.envelope import RejectedMessage
from libs.runtime.bus import publish
from services.audit import store
from services.audit.app import serve
from services.audit.settings import AuditSettings
from tests.integration.helpers_hba import jetstream
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


async def test_commands_and_outcomes_are_stored_once_chained_and_unchangeable(env):
    settings = env.settings(AuditSettings)
    s = settings.subjects
    db = env.database_url.rsplit("/", 1)[-1]
    pg = await asyncpg.connect(env.database_url)
    submit = SubmitJob(actor="alice", spec={"workload": {"kind": "finetune"}})
    requeue = RequeueJob(actor="bob", job_id=submit.job_id, gpu_ceiling_seconds=30)
    async with running(serve, settings), jetstream(settings.nats_url) as (_, js):
        await publish(js, s.cmd("submit"), submit)
        await publish(js, s.cmd("submit"), submit.encode(), msg_id="again")  # a second delivery of the command
        await publish(js, s.cmd("requeue"), requeue)
        await publish(js, s.outcome("submit", submit.command_id), CommandOutcome(
            command_id=submit.command_id, kind="submit", accepted=True, job_id=submit.job_id, by="queue"))
        await publish(js, s.outcome("requeue", requeue.command_id), CommandOutcome(
            command_id=requeue.command_id, kind="requeue", accepted=False, job_id=submit.job_id, by="queue",
            reason="new ceiling 30s is below consumed + 60s = 72s", detail={"minimum_seconds": 72}))
        await publish(js, s.outcome("cancel", "gw1"), CommandOutcome(
            command_id="gw1", kind="cancel", accepted=False, reason="missing permission finetune:manage",
            by="gateway", detail={"actor": "viewer-1"}))
        await publish(js, s.rejected("queue"), RejectedMessage(
            service="queue", subject=s.cmd("submit"), reason="actor: field required",
            payload_excerpt='{"spec": {}}', payload_bytes=12))
        await js.publish(s.cmd("submit"), b"\x00 not json at all")

        await eventually(lambda: pg.fetchval("SELECT count(*) = 7 FROM audit.log_public"))
        rows = {(r["command_id"], r["outcome"]): r for r in await pg.fetch("SELECT * FROM audit.log_public")}
        assert rows[(submit.command_id, "received")]["actor"] == "alice"
        assert rows[(submit.command_id, "accepted")]["actor"] == "alice"  # taken from the command as received
        refused = rows[(requeue.command_id, "refused")]
        assert refused["actor"] == "bob" and "72" in refused["reason"] and refused["job_id"] == submit.job_id
        assert rows[("gw1", "refused")]["actor"] == "viewer-1" and rows[("gw1", "refused")]["kind"] == "cancel"
        (note,) = [r for k, r in rows.items() if k[1] == "rejected"]
        assert note["subject"] == s.cmd("submit") and note["reason"] == "actor: field required"
        (raw,) = [r for k, r in rows.items() if k[0].startswith("CMD-")]  # named by stream and sequence
        assert raw["outcome"] == "received" and "not json" in json.loads(raw["payload"])["raw"]
        pool = await asyncpg.create_pool(env.database_url, min_size=1, max_size=2)
        assert await store.verify(pool) == store.VerifyResult(True, 7, None, None)

        role = f"{db}_audit_writer"
        assert await store.writer_role(pg, None) == role
        async with pg.transaction():
            await pg.execute(f'SET LOCAL ROLE "{role}"')
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
                await pg.execute("UPDATE audit.log SET actor = 'mallory'")
        for sql in ("UPDATE audit.log SET actor = 'mallory'", "DELETE FROM audit.log", "TRUNCATE audit.log"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
                await pg.execute(sql)  # as superuser: the trigger refuses

        victim = rows[(requeue.command_id, "refused")]["seq"]
        await pg.execute("ALTER TABLE audit.log DISABLE TRIGGER log_no_update_delete")
        await pg.execute("UPDATE audit.log SET reason = 'accepted after all' WHERE seq = $1", victim)
        await pg.execute("ALTER TABLE audit.log ENABLE TRIGGER log_no_update_delete")
        result = await store.verify(pool)
        assert not result.ok and result.first_bad_seq == victim and "changed" in result.reason
        await pool.close()
    await pg.close()


async def test_two_replicas_keep_one_chain(env):
    settings = env.settings(AuditSettings, batch_size=7)  # small batches: the replicas interleave
    s = settings.subjects
    commands = [SubmitJob(actor=f"user{i % 3}", spec={"workload": {"kind": "finetune"}}) for i in range(60)]
    pool = await asyncpg.create_pool(env.database_url, min_size=1, max_size=2)
    async with running(serve, settings), running(serve, settings), jetstream(settings.nats_url) as (_, js):
        for cmd in commands:
            await publish(js, s.cmd("submit"), cmd)
        await eventually(lambda: pool.fetchval("SELECT count(*) = 60 FROM audit.log"), timeout=20)
        result = await store.verify(pool)
        assert result.ok and result.checked == 60
        stored = await pool.fetch("SELECT command_id FROM audit.log")
        assert sorted(r["command_id"] for r in stored) == sorted(c.command_id for c in commands)
    await pool.close()
