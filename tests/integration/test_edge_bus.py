"""The edge on real NATS and PostgreSQL: a poison message is dead-lettered while the rest of its batch is
applied and nothing is left redelivering; a message that keeps failing is dead-lettered after its deliveries;
dead letters are listed and replayed; an outbox row the bus refuses is quarantined and the rows behind it are
published; and the queue fails a job whose event cannot travel instead of wedging its outbox."""

from __future__ import annotations

import asyncio
import contextlib
import json

import asyncpg
import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.dead import DeadCause, DeadLetter
from libs.contracts.envelope import ContractError, utcnow
from libs.contracts.jobs import JobEvent, JobSpec
from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime import db, outbox
from libs.runtime.edge import Consumer
from libs.runtime.service import Runtime
from services.gateway.dead_letters import DeadLetters
from services.queue.domain.lifecycle import Submitted, submit
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import client, queue_service
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def text(body: bytes) -> str:
    if body == b"not text":
        raise ContractError("t/1", "not text")
    return body.decode()


async def settled(rt: Runtime, stream: str, durable: str):
    info = await rt.js.consumer_info(rt.subjects.stream_name(stream), durable)
    return info if info.num_ack_pending == 0 and info.num_pending == 0 else None


async def dead_letters(rt: Runtime, n: int) -> list[DeadLetter]:
    sub = await rt.js.pull_subscribe(rt.subjects.dead_all, durable=None)
    got: list[DeadLetter] = []

    async def more():
        with contextlib.suppress(TimeoutError):
            got.extend(DeadLetter.decode(m.data) for m in await sub.fetch(n - len(got), timeout=0.5))
        return got if len(got) >= n else None

    try:
        return await eventually(more, timeout=15)
    finally:
        await sub.unsubscribe()


async def test_a_poison_message_is_dead_lettered_the_rest_applied_and_it_can_be_replayed_after_a_fix(env):
    rt = await Runtime.open("edge", env.settings(), schema=None, package=None)
    await rt.pool.execute("CREATE TABLE notes (body text NOT NULL)")
    fixed = asyncio.Event()

    async def store(bodies: list[str]) -> None:
        async with rt.pool.acquire() as conn, conn.transaction():
            for b in bodies:  # PostgreSQL refuses NUL in text: a DataError, permanent, until the fix
                await conn.execute("INSERT INTO notes VALUES ($1)", b.replace("\x00", "") if fixed.is_set() else b)

    # A command subject: what the gateway may publish, so what it may replay (dead_letters.refusal).
    subject = rt.subjects.cmd("edgetest")
    try:
        await rt.consume([Consumer(subject, "CMD", "edge-notes", text, store, batch=50,
                                   wait_seconds=0.2)])
        for body in (b"one", b"two\x00NUL", b"not text", b"three"):
            await rt.js.publish(subject, body)
        rows = await eventually(lambda: rt.pool.fetch("SELECT body FROM notes ORDER BY body"), timeout=15)
        await eventually(lambda: settled(rt, "CMD", "edge-notes"), timeout=15)
        assert sorted(r["body"] for r in await rt.pool.fetch("SELECT body FROM notes")) == ["one", "three"], rows
        (letter,) = await dead_letters(rt, 1)
        assert letter.cause is DeadCause.PERMANENT and letter.payload == b"two\x00NUL"
        assert letter.subject == subject and letter.consumer == "edge-notes" and "0x00" in letter.reason
        assert rt.rejected == 1 and rt.dead == 1  # the malformed one was refused visibly, not buried

        # An operator lists it through the gateway's reader and replays it once the handler is fixed.
        reader = DeadLetters(rt)
        ((seq, listed),) = await reader.list(service="edge", after_seq=0, limit=10)
        assert listed.payload == letter.payload and await reader.counts() == {"edge": 1}
        fixed.set()
        await reader.replay(seq, listed)
        await eventually(lambda: rt.pool.fetchval("SELECT count(*) = 3 FROM notes"), timeout=15)
    finally:
        await rt.close()


async def test_a_message_that_fails_on_every_delivery_is_dead_lettered_after_its_limit(env):
    rt = await Runtime.open("edge", env.settings(), schema=None, package=None)
    seen: list[str] = []

    async def handle(bodies: list[str]) -> None:
        seen.extend(bodies)
        if "flaky" in bodies:
            raise KeyError("a bug met by this message only")

    try:
        await rt.consume([Consumer(rt.subjects.heartbeat_all, "HB", "edge-flaky", text, handle, max_deliver=3,
                                   backoff=(0.1,), wait_seconds=0.2)])
        await rt.js.publish(rt.subjects.heartbeat("x"), b"flaky")
        await rt.js.publish(rt.subjects.heartbeat("x"), b"fine")
        (letter,) = await dead_letters(rt, 1)
        assert letter.cause is DeadCause.EXHAUSTED and letter.deliveries == 3 and "KeyError" in letter.reason
        await eventually(lambda: settled(rt, "HB", "edge-flaky"), timeout=15)
        assert seen.count("fine") >= 1 and rt.edge.dead == 1
    finally:
        await rt.close()


async def test_an_outbox_row_the_bus_refuses_is_quarantined_and_the_rows_behind_it_are_published(env):
    rt = await Runtime.open("edge", env.settings(), schema="tq", package=None)
    told: list[tuple[str, str]] = []

    async def hook(conn, subject: str, payload: bytes, reason: str) -> None:
        told.append((subject, reason))

    try:
        await db.migrate(rt.pool, "tq", "libs.runtime")
        small = [SubmitJob(actor="a", spec={"workload": {"kind": "finetune"}}) for _ in range(2)]
        huge = SubmitJob(actor="a", spec=JobSpec(name="x", workload={"kind": "command", "command": ["true"],
                                                                      "env": {f"BIG{i}": "x" * 100_000
                                                                              for i in range(2)}}))
        async with rt.pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, "tq", [(rt.subjects.cmd("submit"), small[0])])
            # Bypass add()'s encoding to store a row over the server's max payload, as a bug or an old row would.
            await conn.execute('INSERT INTO "tq".outbox (msg_id, subject, payload) VALUES ($1, $2, $3)', "huge",
                               rt.subjects.cmd("submit"), huge.encode() * 8)
            await outbox.add(conn, "tq", [(rt.subjects.cmd("submit"), small[1])])
        relay = outbox.OutboxRelay(rt.pool, "tq", rt.js, on_quarantine=hook, bury=rt.bury)
        assert await relay.relay_once() == 2 and relay.quarantined == 1
        reason = await rt.pool.fetchval('SELECT quarantine_reason FROM "tq".outbox WHERE msg_id = $1', "huge")
        assert "MaxPayload" in reason and told and told[0][0] == rt.subjects.cmd("submit")
        assert await relay.relay_once() == 0  # never tried again
        sub = await rt.js.pull_subscribe(rt.subjects.cmd("submit"), durable=None)
        got = await sub.fetch(5, timeout=2)
        assert [SubmitJob.decode(m.data).id for m in got] == [m.id for m in small]
        (letter,) = await dead_letters(rt, 1)
        assert letter.cause is DeadCause.UNPUBLISHABLE and letter.truncated and letter.payload_bytes > 1_000_000
    finally:
        await rt.close()


async def test_a_job_whose_submitted_event_cannot_travel_fails_with_the_reason_and_the_queue_goes_on(env):
    settings = env.settings(QueueSettings)
    async with queue_service(settings), client(settings) as c:
        max_payload = c.nc.max_payload

        def submit_with(filler: str) -> tuple[SubmitJob, JobEvent]:
            # One environment value is bounded (131072 characters, the kernel's own limit): fill several.
            env = {f"F{i}": filler[i:i + 100_000] for i in range(0, len(filler), 100_000)} or {"F0": ""}
            cmd = SubmitJob(actor="ann", spec={"name": "n" * 200, "workload": {
                "kind": "command", "command": ["true"], "env": env}})
            draft = submit(Submitted(cmd.job_id, cmd.spec.name, cmd.actor, cmd.spec), utcnow()).events[0]
            return cmd, JobEvent(job_id=cmd.job_id, seq=1, event=draft.event, state=draft.state, detail=draft.detail)

        # The command fits under the server's limit (with room for its headers); the submitted event (the spec
        # plus the job's name and owner) does not: before the quarantine this wedged the queue's outbox for every
        # job behind it.
        guess = max_payload - 150
        probe, _ = submit_with("x" * guess)
        overhead = len(probe.encode()) - guess  # the envelope, the spec's other fields, the env's keys
        big, event = submit_with("x" * (max_payload - 150 - overhead))
        assert len(big.encode()) + 150 <= max_payload < len(event.encode())
        outcome = await c.command(big)
        assert outcome.accepted
        job = await c.wait_state(big.job_id, "failed", timeout=20)
        assert "undeliverable" in job["reason"]
        small = SubmitJob(actor="ann", spec={"workload": {"kind": "finetune"}})
        assert (await c.command(small)).accepted
        (event,) = await c.published_events(small.job_id, 1)
        assert event["event"] == "submitted"


async def test_a_poison_heartbeat_never_keeps_other_executors_heartbeats_out(env):
    """Regression: a step of 2**63 failed the bigint column and the whole batch was redelivered for as long as
    the stream kept it, so every executor in that batch falsely showed no_signal. Now it is refused (at decode,
    or dead-lettered if it got past its contract) and the others' heartbeats are ingested."""
    from services.health.app import serve as health
    from services.health.settings import HealthSettings
    from tests.integration.helpers_hba import jetstream
    from tests.support.services import running

    settings = env.settings(HealthSettings)
    s = settings.subjects
    good = [Heartbeat(executor_id=f"ex{i}", node_id=f"n{i}", group="g1", sent_at=utcnow(), interval_seconds=1,
                      progress_interval_seconds=1) for i in range(3)]
    poison = json.loads(good[0].model_copy(update={"executor_id": "exbad", "job_id": "j1", "epoch": 1,
                                                   "phase": Phase.TRAINING}).encode())
    poison["step"] = 2**63
    async with running(health, settings), jetstream(env.infra.nats_url) as (nc, js):
        await js.publish(s.heartbeat("exbad"), json.dumps(poison).encode())
        for hb in good:
            await js.publish(s.heartbeat(hb.executor_id), hb.encode())
        pg = await asyncpg.connect(env.database_url)
        try:
            await eventually(lambda: pg.fetchval(
                "SELECT count(*) = 3 FROM health.executors WHERE executor_id = ANY($1::text[]) AND last_heartbeat"
                " IS NOT NULL", [hb.executor_id for hb in good]), timeout=15)
            info = await eventually(lambda: _settled_js(js, s.stream_name("HB"), "health-heartbeats"), timeout=15)
            assert info.num_redelivered <= 1

            async def refused_or_buried() -> int:
                counts = [(await js.stream_info(s.stream_name(name))).state.messages for name in ("DEAD", "REJECTED")]
                return sum(counts)

            assert await eventually(refused_or_buried, timeout=10) == 1
        finally:
            await pg.close()


async def _settled_js(js, stream: str, durable: str):
    info = await js.consumer_info(stream, durable)
    return info if info.num_ack_pending == 0 and info.num_pending == 0 else None
