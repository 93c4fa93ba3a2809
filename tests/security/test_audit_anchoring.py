"""Attacks on the audit log by someone who can write its table (the database superuser), against the real audit
service with its key, real PostgreSQL and a real nats-server: each rewrite passes the old chain check, and the
audit service's verify (chain + every row's mac + every anchor) names it; the anchors cannot be deleted or purged
through JetStream, and a stream whose old anchors were dropped by a limit is reported."""

from __future__ import annotations

import dataclasses
import json

import asyncpg
import pytest
from nats.js.errors import APIError

from libs.contracts.audit import AuditAnchor, AuditVerifyReply, AuditVerifyRequest
from libs.contracts.commands import SubmitJob
from libs.runtime.bus import publish
from services.audit import store
from services.audit.app import serve
from services.audit.domain import anchoring, chain
from services.audit.keyfile import create_key_file
from services.audit.settings import AuditSettings
from tests.integration.helpers_hba import jetstream
from tests.support.services import eventually, running

pytestmark = pytest.mark.security

COLUMNS = ("seq", "command_id", "actor", "time", "recorded_at", "subject", "kind", "job_id", "payload", "outcome",
           "reason", "prev_hash", "hash", "mac")


async def rows_of(pg: asyncpg.Connection) -> list[dict]:
    rows = await pg.fetch(f"SELECT {', '.join(COLUMNS[:8])}, payload::text AS payload, {', '.join(COLUMNS[9:])}"
                          " FROM audit.log ORDER BY seq")
    return [{**dict(r), "payload": json.loads(r["payload"])} for r in rows]


async def write_behind_the_trigger(pg: asyncpg.Connection, rows: list[dict]) -> None:
    """The superuser's way past the append-only trigger: disable it, write, enable it again."""
    await pg.execute("ALTER TABLE audit.log DISABLE TRIGGER log_no_update_delete")
    for r in rows:
        await pg.execute("UPDATE audit.log SET actor = $2, payload = $3::jsonb, prev_hash = $4, hash = $5, mac = $6"
                         " WHERE seq = $1", r["seq"], r["actor"], json.dumps(r["payload"]), r["prev_hash"], r["hash"],
                         r["mac"])
    await pg.execute("ALTER TABLE audit.log ENABLE TRIGGER log_no_update_delete")


def recompute_from(rows: list[dict], seq: int, mac_key: bytes | None = None, **change) -> list[dict]:
    """Change row ``seq`` and recompute its hash and every later one consistently (and macs, with some key)."""
    out = [dict(r) for r in rows]
    prev = chain.GENESIS
    for r in out:
        if r["seq"] == seq:
            r.update(change)
        if r["seq"] >= seq:
            r["prev_hash"] = prev
            r["hash"] = chain.row_hash(prev, r)
            if mac_key is not None:
                r["mac"] = anchoring.row_mac(mac_key, r["hash"])
        prev = r["hash"]
    return [r for r in out if r["seq"] >= seq]


async def test_a_superuser_cannot_rewrite_truncate_or_unanchor_the_audit_log_unseen(env, tmp_path):
    key_file = tmp_path / "audit.key"
    create_key_file(key_file)
    key = key_file.read_bytes().strip()
    # Anchors only at shutdown here (the loop's hour never comes), so the test decides what is anchored.
    settings = env.settings(AuditSettings, audit_key_file=key_file, anchor_seconds=3600)
    s = settings.subjects
    anchor_stream = s.stream_name("AUDIT_ANCHOR")
    superuser = env.infra.pg_admin_url.rsplit("/", 1)[0] + "/" + env.database_url.rsplit("/", 1)[-1]
    pg = await asyncpg.connect(superuser)
    pool = await asyncpg.create_pool(superuser, min_size=1, max_size=2)
    first = [SubmitJob(actor=f"user{i}", spec={"workload": {"kind": "finetune"}}) for i in range(6)]
    later = [SubmitJob(actor="late", spec={"workload": {"kind": "finetune"}}) for _ in range(3)]
    async with jetstream(settings.nats_url) as (nc, js):

        async def verify() -> AuditVerifyReply:
            return AuditVerifyReply.decode((await nc.request(s.rpc_audit_verify, AuditVerifyRequest().encode(),
                                                             timeout=30)).data)

        # 1. Commands are audited, with macs; stopping the service anchors the head (seq 6).
        async with running(serve, settings):
            for cmd in first:
                await publish(js, s.cmd("submit"), cmd)
            await eventually(lambda: pg.fetchval("SELECT count(*) = 6 FROM audit.log"), what="6 audit rows")
        anchor = AuditAnchor.decode((await js.get_last_msg(anchor_stream, s.audit_anchor)).data)
        assert anchor.seq == 6 and anchor.mac == anchoring.anchor_mac(key, anchor.model_dump())

        async with running(serve, settings):
            for cmd in later:
                await publish(js, s.cmd("submit"), cmd)
            await eventually(lambda: pg.fetchval("SELECT count(*) = 9 FROM audit.log"), what="9 audit rows")
            original = await rows_of(pg)
            assert {r["actor"] for r in original} == {*(c.actor for c in first), "late"}
            assert all(r["mac"] == anchoring.row_mac(key, r["hash"]) for r in original)
            good = await verify()
            assert good.ok and good.keyed and (good.checked, good.macs_checked, good.pre_key_rows) == (9, 9, 0)
            assert (good.anchors_checked, good.last_anchor_seq, good.head_seq) == (1, 6, 9)

            # 2. After the last anchor: rewrite row 8 and recompute the hashes after it. The old chain check
            #    accepts it; the macs do not.
            await write_behind_the_trigger(pg, recompute_from(original, 8, actor="mallory", payload={"forged": 1}))
            assert await store.verify(pool) == store.VerifyResult(True, 9, None, None)  # today's verify: fooled
            found = await verify()
            assert not found.ok and found.first_bad_seq == 8 and "mac does not match" in found.reason
            assert found.first_bad_anchor is None  # after the anchor: the mac alone sees it

            # 3. The same with macs forged under a key of the attacker's own.
            await write_behind_the_trigger(pg, recompute_from(original, 8, mac_key=b"m" * 32, actor="mallory"))
            found = await verify()
            assert not found.ok and found.first_bad_seq == 8 and "mac does not match" in found.reason

            # 4. Before the anchor, macs forged and stripped: the anchor and the macs both name it.
            forged = recompute_from(original, 3, actor="mallory")
            for r in forged:
                r["mac"] = None  # "pre-key" rows, says the attacker
            await write_behind_the_trigger(pg, forged)
            found = await verify()
            assert not found.ok and found.first_bad_seq == 3 and "mac missing" in found.reason
            assert found.first_bad_anchor == 1
            await write_behind_the_trigger(pg, original)
            assert (await verify()).ok  # put back as it was: the verdict is about the rows, not a memory

            # 5. The anchors cannot be deleted or purged through JetStream, nor the stream's protection lifted.
            for attempt in (js.delete_msg(anchor_stream, 1), js.purge_stream(anchor_stream),
                            js.purge_stream(anchor_stream, subject=s.audit_anchor)):
                with pytest.raises(APIError, match="not permitted"):
                    await attempt
            info = await js.stream_info(anchor_stream)
            for lift in ({"deny_delete": False}, {"deny_purge": False}, {"allow_rollup_hdrs": True}):
                with pytest.raises(APIError):
                    await js.update_stream(dataclasses.replace(info.config, **lift))
            assert (await js.stream_info(anchor_stream)).state.messages == 1

            # 6. Truncating the newest rows (past the anchored seq 6) is reported against the anchor.
            await pg.execute("ALTER TABLE audit.log DISABLE TRIGGER log_no_update_delete")
            await pg.execute("DELETE FROM audit.log WHERE seq >= 5")
            await pg.execute("ALTER TABLE audit.log ENABLE TRIGGER log_no_update_delete")
            assert (await store.verify(pool)).ok  # a shorter chain is still a chain
            found = await verify()
            assert not found.ok and found.first_bad_seq == 5 and found.reason.startswith("truncated")
            assert found.first_bad_anchor == 1

    await pool.close()
    await pg.close()


async def test_junk_forged_and_dropped_anchors_are_reported(env, tmp_path):
    """Whoever may publish on the anchor subject can add junk (skipped, counted) or a forged anchor (named: it is
    not the key's); JetStream lets a client lower the stream's max_msgs, which drops the oldest anchors: verify
    names the gap."""
    key_file = tmp_path / "audit.key"
    create_key_file(key_file)
    settings = env.settings(AuditSettings, audit_key_file=key_file, anchor_seconds=0.2)
    s = settings.subjects
    anchor_stream = s.stream_name("AUDIT_ANCHOR")
    async with running(serve, settings), jetstream(settings.nats_url) as (nc, js):

        async def verify() -> AuditVerifyReply:
            return AuditVerifyReply.decode((await nc.request(s.rpc_audit_verify, AuditVerifyRequest().encode(),
                                                             timeout=30)).data)

        for i in range(3):
            await publish(js, s.cmd("submit"), SubmitJob(actor=f"u{i}", spec={"workload": {"kind": "finetune"}}))
            await eventually(lambda i=i: _anchored_past(js, anchor_stream, s.audit_anchor, i + 1),
                             what=f"an anchor of seq {i + 1}")
        await js.publish(s.audit_anchor, b"\x00 not an anchor")
        found = await verify()
        assert found.ok and found.malformed_anchors == 1 and found.anchors_checked >= 3, found

        real = AuditAnchor.decode((await js.get_msg(anchor_stream, 1)).data)
        forged = anchoring.make_anchor({**real.model_dump(), "hash": "f" * 64}, b"m" * 32)
        ack = await js.publish(s.audit_anchor, AuditAnchor(**forged).encode())
        found = await verify()
        assert not found.ok and found.first_bad_anchor == ack.seq and "not made with the audit key" in found.reason

        info = await js.stream_info(anchor_stream)
        await js.update_stream(dataclasses.replace(info.config, max_msgs=1))  # the server allows this
        found = await verify()
        assert not found.ok and found.first_bad_anchor is not None and "removed from the stream" in found.reason


async def _anchored_past(js, stream: str, subject: str, seq: int) -> bool:
    try:
        return AuditAnchor.decode((await js.get_last_msg(stream, subject)).data).seq >= seq
    except Exception:  # noqa: BLE001 - no anchor yet
        return False
