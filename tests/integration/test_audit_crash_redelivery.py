"""The audit service dying in the middle of a batch, against real NATS and PostgreSQL, with its consumers reading
the next batch while one is written (``read_ahead``): a replica stops dead either just before a batch's
transaction or just after its commit, before any of that batch's acknowledgements. Nothing of that batch, nor of
the batch already read behind it, has been acknowledged then (only batches whose handler returned are); another
replica then takes every message over (the one read ahead at once, the one in the dead handler after its ack
wait), and in the end every command is stored exactly once, the chain and every mac verify, and the stream is
fully acknowledged."""

from __future__ import annotations

import asyncio
import functools

import asyncpg
import pytest

from libs.contracts.commands import SubmitJob
from libs.runtime.bus import ensure_streams
from libs.runtime.edge import Consumer
from services.audit import handlers, store
from services.audit.app import serve
from services.audit.domain import entries
from services.audit.keyfile import create_key_file, load_key
from services.audit.settings import AuditSettings
from tests.integration.helpers_hba import jetstream
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration
BATCH, COMMANDS = 100, 700


async def acknowledged(js, stream: str) -> int:
    """How many of the stream's messages the audit's command durable has acknowledged (none redelivered yet)."""
    info = await js.consumer_info(stream, "audit-commands")
    return info.delivered.stream_seq - info.num_ack_pending


@pytest.mark.parametrize("dies", ["before its transaction", "after its commit"])
async def test_a_replica_dying_mid_batch_loses_nothing_and_stores_nothing_twice(env, tmp_path, monkeypatch, dies):
    key_file = tmp_path / "audit.key"
    create_key_file(key_file)
    settings = env.settings(AuditSettings, batch_size=BATCH, audit_key_file=key_file)
    s = settings.subjects
    # A short ack wait, so the dead replica's batch comes back within the test (15 s in production).
    monkeypatch.setattr(handlers, "Consumer", functools.partial(Consumer, ack_wait_seconds=2.0))
    commands = [SubmitJob(actor=f"user-{i % 5}", spec={"workload": {"kind": "finetune"}}) for i in range(COMMANDS)]
    real_append, returned, dying, frozen = store.append, [], [], asyncio.Event()
    batches, read = [], []
    real_read = entries.from_command

    def reading(*args):
        read.append(entry := real_read(*args))
        return entry

    async def dying_append(conn, found, **kw):
        """The first replica's store: the third batch stops dead, before its transaction or after its commit."""
        if found and found[0].subject.endswith(".submit") and len(batches) == 2:
            dying.extend(found)
            if dies == "after its commit":
                await real_append(conn, found, **kw)
            frozen.set()
            await asyncio.Event().wait()  # the process is gone: its handler never returns, nothing more is acked
        stored = await real_append(conn, found, **kw)
        if found and found[0].subject.endswith(".submit"):
            batches.append(len(found))
            returned.extend(found)
        return stored

    pool = await asyncpg.create_pool(env.database_url, min_size=1, max_size=2)
    async with jetstream(settings.nats_url) as (_, js):
        await ensure_streams(js, s)
        for cmd in commands:  # published first: full batches from the start
            await js.publish(s.cmd("submit"), cmd.encode())
        stream = s.stream_name("CMD")
        monkeypatch.setattr(store, "append", dying_append)
        monkeypatch.setattr(entries, "from_command", reading)
        async with running(serve, settings):
            await asyncio.wait_for(frozen.wait(), 60)
            rows = await pool.fetchval("SELECT count(*) FROM audit.log")
            assert rows == len(returned) + (len(dying) if dies == "after its commit" else 0)
            # Read ahead, the batch behind the dying one is fetched and read; yet only the messages of batches
            # whose handler returned (after their commit) are ever acknowledged.
            await eventually(lambda: len(read) > len(returned) + len(dying), timeout=30,
                             what="the batch behind the dying one read")
            assert await acknowledged(js, stream) == len(returned) > 0
        monkeypatch.setattr(store, "append", real_append)
        monkeypatch.setattr(entries, "from_command", real_read)
        async with running(serve, settings):  # another replica takes over
            await eventually(lambda: pool.fetchval(f"SELECT count(*) >= {COMMANDS} FROM audit.log"), timeout=120)

            async def all_acknowledged() -> bool:
                info = await js.consumer_info(stream, "audit-commands")
                return info.ack_floor.stream_seq >= COMMANDS and info.num_ack_pending == 0

            await eventually(all_acknowledged, timeout=60, what="every message acknowledged")
        stored = [r["command_id"] for r in await pool.fetch("SELECT command_id FROM audit.log")]
    assert sorted(stored) == sorted(c.command_id for c in commands)  # each once: none lost, none twice
    result = await store.verify(pool, load_key(key_file))
    assert result.ok and result.checked == COMMANDS and result.macs_checked == COMMANDS
    await pool.close()
