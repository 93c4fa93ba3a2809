"""The audit's batch path against real PostgreSQL and NATS (services/audit/store.py): redelivered commands are
stored once within a batch and across batches, a large batch verifies with every mac, a payload the database
could not store fails the batch before anything is written (the edge then stores the others alone), and the
service records every message of a mixed stream (duplicates, malformed, lone surrogates, odd numbers) once."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.commands import CommandOutcome, SubmitJob
from libs.runtime import db
from libs.runtime.bus import ensure_streams
from libs.runtime.errors import PermanentError
from services.audit import store
from services.audit.app import serve
from services.audit.domain import entries
from services.audit.domain.entries import Entry, Outcome
from services.audit.keyfile import create_key_file, load_key
from services.audit.settings import AuditSettings
from tests.integration.helpers_hba import jetstream
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
KEY = b"k" * 32


def received(cmd: SubmitJob, seq: int) -> Entry:
    return entries.from_command("t.cmd.submit", cmd.encode(), f"CMD-{seq}", NOW)


def outcome(cmd: SubmitJob) -> Entry:
    body = CommandOutcome(command_id=cmd.command_id, kind="submit", accepted=True, job_id=cmd.job_id, by="queue")
    return entries.from_outcome("t.outcome.submit.x", body.encode(), "OUT-1", NOW)


@pytest.fixture
async def audit_db(env):
    pool = await db.create_pool(env.database_url, max_size=2)
    await db.migrate(pool, store.SCHEMA, "services.audit")
    async with pool.acquire() as conn:
        role = await store.writer_role(conn, None)
    yield pool, role
    await pool.close()


async def test_redelivered_commands_are_stored_once_within_and_across_batches(audit_db):
    pool, role = audit_db
    a, b, c = (SubmitJob(actor=f"user-{i}", spec={"workload": {"kind": "finetune"}}) for i in range(3))
    async with pool.acquire() as conn:
        assert await store.append(conn, [received(a, 1), received(b, 2), received(a, 3)], role=role, now=NOW,
                                  key=KEY) == 2
        assert await store.append(conn, [received(b, 4), received(c, 5), received(a, 6), outcome(a)], role=role,
                                  now=NOW, key=KEY) == 2
        assert await store.append(conn, [received(c, 7), outcome(a)], role=role, now=NOW, key=KEY) == 0
        rows = await conn.fetch("SELECT seq, command_id, outcome, actor FROM audit.log ORDER BY seq")
    assert [(r["command_id"], r["outcome"]) for r in rows] == [
        (a.command_id, "received"), (b.command_id, "received"), (c.command_id, "received"), (a.command_id, "accepted")]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]  # nothing drawn for what was already there
    assert rows[3]["actor"] == "user-0"  # the outcome names none: taken from the command as received
    result = await store.verify(pool, KEY)
    assert result.ok and result.checked == 4 and result.macs_checked == 4


async def test_a_large_batch_of_odd_payloads_verifies_with_every_mac(audit_db):
    pool, role = audit_db
    odd = [{"n": 1e16, "z": -0.0, "tiny": 5e-324, "big": 1.2345e20, "text": "é\u2028\"\\", "list": [1, 2.5]},
           {"nested": {"b": [None, True, {"c": 1e-07}]}, "int": 10**30}]
    batch = [received(SubmitJob(actor=f"user-{i % 7}", spec={"workload": {"kind": "finetune"}}), i)
             for i in range(2400)]
    batch += [Entry(command_id=f"odd-{i}", actor=None, time=NOW, subject="t.cmd.x", kind="x", job_id=None,
                    payload=p, outcome=Outcome.RECEIVED, reason=None) for i, p in enumerate(odd)]  # not normal yet
    batch += [Entry(command_id="odd-keys", actor="a", time=NOW, subject="t.cmd.x", kind="x", job_id=None,
                    payload={2: (1, 2), 10: "x"}, outcome=Outcome.RECEIVED, reason=None)]  # ints keys, a tuple
    async with pool.acquire() as conn:
        assert await store.append(conn, batch, role=role, now=NOW, key=KEY) == len(batch)
        stored = await conn.fetchval("SELECT payload FROM audit.log WHERE command_id = 'odd-0'")
    assert json.loads(stored)["n"] == 10**16
    result = await store.verify(pool, KEY)
    assert result.ok and result.checked == len(batch) and result.macs_checked == len(batch)


async def test_a_payload_the_database_could_not_store_fails_the_batch_before_any_write(audit_db):
    pool, role = audit_db
    good = received(SubmitJob(actor="alice", spec={"workload": {"kind": "finetune"}}), 1)
    for bad in ({"loss": float("nan")}, {"when": NOW}):
        entry = Entry(command_id="bad", actor=None, time=NOW, subject="t.cmd.x", kind="x", job_id=None, payload=bad,
                      outcome=Outcome.RECEIVED, reason=None)
        async with pool.acquire() as conn:
            with pytest.raises(PermanentError, match="cannot be stored"):
                await store.append(conn, [good, entry], role=role, now=NOW, key=KEY)
    lone = Entry(command_id="lone", actor=None, time=NOW, subject="t.cmd.x", kind="x", job_id=None, payload={},
                 outcome=Outcome.RECEIVED, reason="\ud800")
    async with pool.acquire() as conn:
        with pytest.raises(PermanentError, match="cannot be stored"):
            await store.append(conn, [good, lone], role=role, now=NOW, key=KEY)
        assert await store.append(conn, [good], role=role, now=NOW, key=KEY) == 1
        assert await conn.fetchval("SELECT count(*) FROM audit.log") == 1
    assert (await store.verify(pool, KEY)).ok  # numbers drawn by the failed batch leave a gap: links are by hash


async def test_the_service_records_a_mixed_stream_once_each_in_large_batches(env, tmp_path):
    key_file = tmp_path / "audit.key"
    create_key_file(key_file)
    settings = env.settings(AuditSettings, batch_size=500, audit_key_file=key_file)
    s = settings.subjects
    commands = [SubmitJob(actor=f"user-{i % 5}", spec={"workload": {"kind": "finetune"}}) for i in range(1200)]
    odd = [b"\x00 not json", b'{"command_id": "c-nan", "loss": NaN, "big": 1e999, "n": 1e16}',
           b'{"command_id": "c-lone", "actor": "\\ud800", "x": "\xed\xa0\x80"}']
    pool = await asyncpg.create_pool(env.database_url, min_size=1, max_size=2)
    async with jetstream(settings.nats_url) as (_, js):
        await ensure_streams(js, s)
        for i in range(0, len(commands), 200):  # published before the service starts: full batches from the start
            for cmd in commands[i:i + 200]:
                await js.publish(s.cmd("submit"), cmd.encode())
        for cmd in commands[:300]:  # each sent again (a retrying gateway): the same command id, a new message
            await js.publish(s.cmd("submit"), cmd.encode())
        for body in odd:
            await js.publish(s.cmd("submit"), body)
        async with running(serve, settings):
            total = len(commands) + len(odd)
            await eventually(lambda: pool.fetchval(f"SELECT count(*) >= {total} FROM audit.log"), timeout=120)
            stored = [r["command_id"] for r in await pool.fetch("SELECT command_id FROM audit.log")]
    assert len(stored) == total and len(set(stored)) == total
    assert {c.command_id for c in commands} | {"c-nan", "c-lone"} <= set(stored)
    assert sum(1 for c in stored if c.startswith("CMD-")) == 1  # the one that is not JSON, named by its sequence
    result = await store.verify(pool, load_key(key_file))
    assert result.ok and result.checked == total and result.macs_checked == total
    await pool.close()
