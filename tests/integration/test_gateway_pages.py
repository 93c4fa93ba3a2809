"""The gateway's job list walked page by page, and the executor list showing the queue's grant at once, read
from the real views (the queue's, health's and budget's migrations applied; rows written as their owners do)."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from libs.runtime.db import migrate
from libs.runtime.service import Runtime
from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class Gw:
    def __init__(self, rt: Runtime, client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        self.rt, self.client, self.tokens = rt, client, tokens

    async def get(self, path: str, role: str = "auditor", **params: Any) -> httpx.Response:
        return await self.client.get(path, params=params, headers={"Authorization": f"Bearer {self.tokens[role]}"})


@contextlib.asynccontextmanager
async def gateway(env) -> AsyncIterator[Gw]:
    settings = env.settings(GatewaySettings)
    rt = await Runtime.open("gateway", settings, schema="gateway", package="services.gateway")
    try:
        for schema in ("queue", "health", "budget"):
            await migrate(rt.pool, schema, f"services.{schema}")
        tokens = {r.value: auth.create_token(settings.effective_tokens_file, f"{r.value}-actor", r) for r in auth.Role}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(settings, rt)),
                                     base_url="http://gw") as client:
            yield Gw(rt, client, tokens)
    finally:
        await rt.close()


async def insert_jobs(rt: Runtime, rows: list[tuple[str, str, str, str, datetime]]) -> None:
    """(id, name, owner, state, created_at) rows into the queue's table, as the queue stores a submit."""
    spec = json.dumps({"workload": {"kind": "finetune"}, "gpu_ceiling_seconds": 3600, "checkpoint_every_steps": 50})
    await rt.pool.execute(
        "INSERT INTO queue.jobs (id, name, owner, state, spec, attempts, created_at, updated_at)"
        " SELECT i, n, o, s, $5::jsonb, '{}'::jsonb, c, c FROM unnest($1::text[], $2::text[], $3::text[],"
        " $4::text[], $6::timestamptz[]) AS t(i, n, o, s, c)",
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], spec,
        [r[4] for r in rows])


async def walk(gw: Gw, **params: Any) -> tuple[list[str], int]:
    """Every page of the list with these filters: the ids in order, and the number of pages."""
    ids: list[str] = []
    pages = 0
    cursor = None
    while True:
        resp = await gw.get("/v1/jobs", **params, **({"cursor": cursor} if cursor else {}))
        assert resp.status_code == 200, resp.text
        ids += [j["id"] for j in resp.json()]
        pages += 1
        cursor = resp.headers.get("X-Next-Cursor")
        if cursor is None:
            return ids, pages
        assert pages <= 2400, "the walk does not end"


async def test_every_job_is_reached_once_across_pages_past_the_old_1000_cap(env):
    async with gateway(env) as gw:
        # 2,345 jobs; every 5 share a created_at, so ties are broken by id across page boundaries.
        rows = [(f"job-{i:05d}", f"run {i}" + (" Triage" if i % 7 == 0 else ""), "alice" if i % 3 else "bob",
                 "succeeded" if i % 2 else "queued", T0 + timedelta(seconds=i // 5)) for i in range(2345)]
        await insert_jobs(gw.rt, rows)
        expected = [r[0] for r in sorted(rows, key=lambda r: (-r[4].timestamp(), r[0]))]

        started = time.perf_counter()
        ids, pages = await walk(gw, limit=1000)
        took = time.perf_counter() - started
        assert ids == expected and pages == 3  # newest first, each once, beyond the 1,000 one page holds
        print(f"\n[measured] 2,345 jobs in 3 pages of 1,000: {took:.2f}s through the ASGI app ({took / 3:.2f}s a page)")

        ids, _ = await walk(gw, limit=7)  # page boundaries inside groups of equal created_at
        assert ids == expected

        # Filters hold on every page (the caller repeats them with the cursor).
        ids, _ = await walk(gw, limit=50, state="queued", owner="bob")
        assert ids == [i for i in expected if rows[int(i[4:])][3] == "queued" and rows[int(i[4:])][2] == "bob"]
        ids, _ = await walk(gw, limit=40, name="triage")  # part of the name, any case
        assert ids == [i for i in expected if int(i[4:]) % 7 == 0] and ids


async def test_jobs_submitted_during_the_walk_neither_repeat_nor_shift_a_page(env):
    async with gateway(env) as gw:
        await insert_jobs(gw.rt, [(f"old-{i:03d}", "x", "alice", "queued", T0 + timedelta(seconds=i))
                                  for i in range(30)])
        first = await gw.get("/v1/jobs", limit=10)
        cursor = first.headers["X-Next-Cursor"]
        # Newer jobs arrive between pages (an OFFSET would shift every later page by them).
        await insert_jobs(gw.rt, [(f"new-{i}", "x", "alice", "queued", T0 + timedelta(hours=1, seconds=i))
                                  for i in range(5)])
        second = await gw.get("/v1/jobs", limit=10, cursor=cursor)
        assert [j["id"] for j in second.json()] == [f"old-{i:03d}" for i in range(19, 9, -1)]


async def test_the_signal_filter_reads_health_and_skips_finished_jobs(env):
    async with gateway(env) as gw:
        await insert_jobs(gw.rt, [("run-stuck", "a", "alice", "running", T0), ("run-ok", "b", "alice", "running", T0),
                                  ("done", "c", "alice", "succeeded", T0)])
        await gw.rt.pool.execute(
            "INSERT INTO health.jobs (job_id, state, signal, signal_since) VALUES"
            " ('run-stuck', 'running', 'stuck', now()), ('run-ok', 'running', 'ok', now()),"
            " ('done', 'succeeded', 'stuck', now())")
        resp = await gw.get("/v1/jobs", signal="stuck")
        assert [j["id"] for j in resp.json()] == ["run-stuck"] and resp.json()[0]["signal"]["signal"] == "stuck"
        assert (await gw.get("/v1/jobs", signal="sideways")).status_code == 422


async def test_a_scoped_reader_pages_through_its_own_jobs_only(env):
    async with gateway(env) as gw:
        await insert_jobs(gw.rt, [(f"j{i:02d}", "x", "viewer-actor" if i % 2 else "other", "queued",
                                   T0 + timedelta(seconds=i)) for i in range(20)])
        ids: list[str] = []
        cursor = None
        while True:
            resp = await gw.get("/v1/jobs", role="viewer", limit=3, **({"cursor": cursor} if cursor else {}))
            ids += [j["id"] for j in resp.json()]
            cursor = resp.headers.get("X-Next-Cursor")
            if not cursor:
                break
        assert ids == [f"j{i:02d}" for i in range(19, 0, -2)]


@pytest.mark.parametrize("cursor", ["garbage!", base64.urlsafe_b64encode(b'{"v": 1}').decode(), "x" * 513])
async def test_a_cursor_the_gateway_did_not_make_is_422_naming_it(env, cursor):
    async with gateway(env) as gw:
        resp = await gw.get("/v1/jobs", cursor=cursor)
        assert resp.status_code == 422 and "query.cursor" in resp.json()["reason"], resp.text


async def test_the_executor_list_shows_the_granted_job_before_any_heartbeat_names_it(env):
    async with gateway(env) as gw:
        # The executor's last heartbeat said idle, no job (health's row); the queue has just granted it j1.
        await gw.rt.pool.execute(
            "INSERT INTO health.executors (executor_id, node_id, group_name, accepting, phase, last_heartbeat,"
            " signal) VALUES ('e1', 'n1', 'g', true, 'idle', now(), 'ok')")
        await insert_jobs(gw.rt, [("j1", "x", "alice", "running", T0)])
        await gw.rt.pool.execute("UPDATE queue.jobs SET executor_id = 'e1', lease_epoch = 4 WHERE id = 'j1'")

        (job,) = (await gw.get("/v1/jobs")).json()
        (ex,) = (await gw.get("/v1/executors")).json()
        assert job["executor_id"] == "e1"
        assert (ex["job_id"], ex["epoch"], ex["phase"], ex["job_source"]) == ("j1", 4, "starting", "grant")

        # Its first heartbeat about the run: the heartbeat's phase and step stand.
        await gw.rt.pool.execute("UPDATE health.executors SET job_id = 'j1', epoch = 4, phase = 'training',"
                                 " step = 12 WHERE executor_id = 'e1'")
        (ex,) = (await gw.get("/v1/executors")).json()
        assert (ex["job_id"], ex["phase"], ex["step"], ex["job_source"]) == ("j1", "training", 12, "heartbeat")

        # The job ends: the grant is gone with it, whatever the last heartbeat still says.
        await gw.rt.pool.execute("UPDATE queue.jobs SET state = 'succeeded' WHERE id = 'j1'")
        await gw.rt.pool.execute("UPDATE health.executors SET job_id = null, epoch = null, phase = 'idle'")
        (ex,) = (await gw.get("/v1/executors")).json()
        assert ex["job_id"] is None and ex["job_source"] is None

        # A tenant who does not own the granted job sees that the executor is busy, not with what.
        await gw.rt.pool.execute("UPDATE queue.jobs SET state = 'running' WHERE id = 'j1'")
        (ex,) = (await gw.get("/v1/executors", role="viewer")).json()
        assert ex["job_id"] is None and ex["phase"] == "starting"


async def test_a_frozen_executors_row_says_its_job_left_and_ends_when_its_node_is_gone(env):
    """Issue 26: a frozen executor's row kept showing its job as `training` while the job ran elsewhere, and its
    "Zombie" row stayed for good (services/gateway/domain/departures.py, read from the real views)."""
    async with gateway(env) as gw:
        # e1 froze while training j1 at epoch 3 (its last heartbeat, long ago); the queue granted j1 to e2 at epoch 4.
        await gw.rt.pool.execute(
            "INSERT INTO health.executors (executor_id, node_id, group_name, accepting, phase, step, job_id, epoch,"
            " last_heartbeat, signal) VALUES ('e1', 'n1', 'g', false, 'training', 95, 'j1', 3,"
            " now() - interval '5 minutes', 'no_signal'),"
            " ('e2', 'n2', 'g', false, 'training', 40, 'j1', 4, now(), 'ok')")
        await insert_jobs(gw.rt, [("j1", "x", "alice", "running", T0)])
        await gw.rt.pool.execute("UPDATE queue.jobs SET executor_id = 'e2', lease_epoch = 4 WHERE id = 'j1'")

        rows = {e["executor_id"]: e for e in (await gw.get("/v1/executors")).json()}
        frozen = rows["e1"]
        assert (frozen["job_id"], frozen["phase"], frozen["step"], frozen["job_source"]) == (None, None, None, "left")
        assert frozen["left_job"] == {"job_id": "j1", "epoch": 3, "job_state": "running", "job_epoch": 4,
                                      "job_executor_id": "e2"}
        assert frozen["zombie"] is False and rows["e2"]["job_id"] == "j1" and rows["e2"]["left_job"] is None

        # It wakes and heartbeats under its lost lease (health counts it): a zombie while it names that run.
        await gw.rt.pool.execute(
            "INSERT INTO health.stale_heartbeats VALUES ('e1', 2, 'j1', 3, 4, now(), now())")
        await gw.rt.pool.execute("UPDATE health.executors SET last_heartbeat = now(), signal = 'ok'"
                                 " WHERE executor_id = 'e1'")
        frozen = {e["executor_id"]: e for e in (await gw.get("/v1/executors")).json()}["e1"]
        assert frozen["zombie"] is True and frozen["left_job"]["job_id"] == "j1"
        # A tenant who does not own j1 learns that a run left e1, not which.
        seen = {e["executor_id"]: e for e in (await gw.get("/v1/executors", role="viewer")).json()}["e1"]
        assert seen["left_job"] == dict.fromkeys(frozen["left_job"]) and seen["zombie"] is True

        # It stops that run: idle, the count is history, no zombie.
        await gw.rt.pool.execute("UPDATE health.executors SET job_id = null, epoch = null, step = null,"
                                 " phase = 'idle' WHERE executor_id = 'e1'")
        frozen = {e["executor_id"]: e for e in (await gw.get("/v1/executors")).json()}["e1"]
        assert (frozen["zombie"], frozen["left_job"], frozen["stale_heartbeats"]) == (False, None, 2)

        # Its node is given up by the health service (gone): the row ends; registering again brings it back.
        await gw.rt.pool.execute("INSERT INTO health.nodes (node_id, group_name, executor_id, state)"
                                 " VALUES ('n1', 'g', 'e1', 'gone'), ('n2', 'g', 'e2', 'ready')")
        assert [e["executor_id"] for e in (await gw.get("/v1/executors")).json()] == ["e2"]
        await gw.rt.pool.execute("UPDATE health.nodes SET state = 'joining' WHERE node_id = 'n1'")
        assert [e["executor_id"] for e in (await gw.get("/v1/executors")).json()] == ["e1", "e2"]
