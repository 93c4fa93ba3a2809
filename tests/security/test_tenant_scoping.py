"""Attack: one tenant reads or reaches another's jobs. A submitter or viewer sees only its own jobs: another's
is not found (404, the id is not confirmed), absent from lists (also when asked for by owner), its events are
not found, and cancelling it is not found (audited, the job untouched). The executor list hides which job of
another owner an executor runs. The Idempotency-Key is the actor's: Bob sending Alice's key gets a job of his own
and cannot read hers; Alice repeating it gets hers back."""

from __future__ import annotations

import sys

import pytest

from tests.security.gateway_stack import gateway_stack
from tests.support.services import eventually

pytestmark = pytest.mark.security

FINETUNE = {"workload": {"kind": "finetune", "params": {"steps": 5}}}


async def test_submitters_and_viewers_see_only_their_own_jobs(env, tmp_path):
    async with gateway_stack(env, tmp_path / "s") as s:
        alice, bob, vic = s.as_("alice"), s.as_("bob"), s.as_("vic")
        r = await alice.post("/v1/jobs", json={**FINETUNE, "name": "alice-private"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        assert (await bob.post("/v1/jobs", json={**FINETUNE, "name": "bob-own"})).status_code == 201

        for intruder in (bob, vic):
            r = await intruder.get(f"/v1/jobs/{job_id}")
            assert r.status_code == 404 and r.json()["reason"] == f"no such job: {job_id}"
            assert (await intruder.get(f"/v1/jobs/{job_id}/events")).status_code == 404
            assert (await intruder.get(f"/v1/jobs/{job_id}/steps")).status_code == 404
            assert job_id not in {j["id"] for j in (await intruder.get("/v1/jobs", params={"name": "alice"})).json()}
            listed = (await intruder.get("/v1/jobs")).json()
            assert job_id not in {j["id"] for j in listed}
            assert (await intruder.get("/v1/jobs", params={"owner": "alice"})).json() == []
        assert {j["name"] for j in (await bob.get("/v1/jobs")).json()} == {"bob-own"}

        r = await bob.post(f"/v1/jobs/{job_id}/cancel")
        assert r.status_code == 404, r.text
        await eventually(lambda: s.audit_rows(actor="bob", kind="cancel", outcome="refused"), 20, "bob's refusal")
        assert (await alice.get(f"/v1/jobs/{job_id}")).json()["state"] == "queued"

        # read:all (operator, auditor) sees everyone's; the owner cancels her own as before.
        for reader in ("olga", "aude"):
            assert (await s.as_(reader).get(f"/v1/jobs/{job_id}")).status_code == 200
            assert len((await s.as_(reader).get("/v1/jobs")).json()) == 2
        assert (await alice.post(f"/v1/jobs/{job_id}/cancel")).status_code == 200


async def test_an_idempotency_key_names_a_job_of_its_own_actor_only(env, tmp_path):
    async with gateway_stack(env, tmp_path / "s", audit=False) as s:
        alice, bob = s.as_("alice"), s.as_("bob")
        key = {"Idempotency-Key": "nightly-run-1"}
        a = await alice.post("/v1/jobs", json={**FINETUNE, "name": "alice-job"}, headers=key)
        assert a.status_code == 201, a.text
        b = await bob.post("/v1/jobs", json={**FINETUNE, "name": "bob-job"}, headers=key)
        assert b.status_code == 201, b.text
        assert b.json()["id"] != a.json()["id"] and b.json()["name"] == "bob-job" and b.json()["owner"] == "bob"
        assert (await bob.get(f"/v1/jobs/{a.json()['id']}")).status_code == 404
        again = await alice.post("/v1/jobs", json={**FINETUNE, "name": "alice-job"}, headers=key)
        assert again.status_code in (200, 201) and again.json()["id"] == a.json()["id"]
        assert await s.db.fetchval("SELECT count(*) FROM queue.jobs") == 2


async def test_the_executor_list_hides_which_job_of_another_owner_runs(env, tmp_path):
    async with gateway_stack(env, tmp_path / "s", audit=False, health=True) as s:
        s.start_executor("sec-1")
        await s.wait_executors("sec-1")
        spec = {"workload": {"kind": "command", "command": [sys.executable, "-c", "import time; time.sleep(60)"]}}
        r = await s.as_("olga").post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        async def running_on_executor() -> bool:
            rows = (await s.as_("olga").get("/v1/executors")).json()
            return any(e["job_id"] == job_id for e in rows)
        await eventually(running_on_executor, 60, "the executor to report the job")
        (entry,) = [e for e in (await s.as_("alice").get("/v1/executors")).json() if e["executor_id"] == "sec-1"]
        assert entry["job_id"] is None and entry["epoch"] is None
        assert job_id in {n.get("job_id") for n in (await s.as_("olga").get("/v1/nodes")).json()}
        for nodes_reader in ("alice", "vic"):
            assert all(n.get("job_id") is None for n in (await s.as_(nodes_reader).get("/v1/nodes")).json())
        assert (await s.as_("olga").post(f"/v1/jobs/{job_id}/cancel")).status_code == 200


async def test_a_submitter_sees_its_own_usage_only(env, tmp_path):
    """Attack (issue 26, item 6): bob asks the usage report for everyone's GPU-seconds and job counts, grouped by
    user, as JSON and as CSV. He gets his own row and his own total; alice's GPU time and jobs stay unseen."""
    import asyncpg

    from libs.runtime import db as migrations

    async with gateway_stack(env, tmp_path / "s", audit=False) as s:
        alice, bob = s.as_("alice"), s.as_("bob")
        ids = {}
        for person, client in (("alice", alice), ("bob", bob)):
            r = await client.post("/v1/jobs", json={**FINETUNE, "name": f"{person}-usage"})
            assert r.status_code == 201, r.text
            ids[person] = r.json()["id"]
        pool = await asyncpg.create_pool(env.database_url, min_size=1, max_size=1)
        try:
            await migrations.migrate(pool, "budget", "services.budget")
        finally:
            await pool.close()
        await s.db.executemany(
            "INSERT INTO budget.ledger (job_id, epoch, executor_id, seq, devices, wall_seconds, gpu_seconds, ended_at)"
            " VALUES ($1, 1, 'ex', $2, 1, $3, $3, now())", [(ids["alice"], 1, 7200.0), (ids["bob"], 2, 30.0)])

        report = (await bob.get("/v1/usage", params={"group_by": "user"})).json()
        assert [(r["key"], r["gpu_seconds"]) for r in report["rows"]] == [("bob", 30.0)]
        assert report["total_gpu_seconds"] == 30.0 and report["unattributed_gpu_seconds"] == 0.0
        assert sum(sum(r["jobs"].values()) for r in report["rows"]) == 1 and report["owner"] == "bob"
        csv_text = (await bob.get("/v1/usage", params={"group_by": "user", "format": "csv"})).text
        assert "alice" not in csv_text and "7200" not in csv_text
        for group_by in ("org", "project"):
            rows = (await bob.get("/v1/usage", params={"group_by": group_by})).json()["rows"]
            assert sum(r["gpu_seconds"] for r in rows) == 30.0
        assert (await s.as_("vic").get("/v1/usage", params={"group_by": "user"})).json()["rows"] == []

        # read:all (operators, auditors) sees every owner, as for jobs.
        every = (await s.as_("olga").get("/v1/usage", params={"group_by": "user"})).json()
        assert {r["key"]: r["gpu_seconds"] for r in every["rows"]} == {"alice": 7200.0, "bob": 30.0}


async def test_an_organisations_run_limits_bound_its_jobs_and_fill_those_they_leave_unset(env, tmp_path):
    """Issue 26, item 6: a submitter asks for more memory per run than its organisation allows (refused, with the
    numbers); a job that sets no limit of a kind gets the organisation's, which its grants then carry."""
    from services.gateway.auth import create_token

    async with gateway_stack(env, tmp_path / "s", audit=False) as s:
        admin = s.as_("olga")
        admin.headers["Authorization"] = f"Bearer {create_token(s.root / 'tokens.json', 'adam', 'admin')}"
        r = await admin.put("/v1/orgs/default", json={"run_limits": {"memory_mb": 2048, "pids": 128}})
        assert r.status_code == 200, r.text
        greedy = await s.as_("alice").post("/v1/jobs", json={**FINETUNE, "limits": {"memory_mb": 65536}})
        assert greedy.status_code == 409 and "limits.memory_mb 65536" in greedy.json()["reason"], greedy.text
        modest = await s.as_("alice").post("/v1/jobs", json={**FINETUNE, "limits": {"memory_mb": 512}})
        assert modest.status_code == 201, modest.text
        stored = (await s.as_("alice").get(f"/v1/jobs/{modest.json()['id']}")).json()["spec"]["limits"]
        assert stored == {"memory_mb": 512, "pids": 128, "disk_mb": None}
