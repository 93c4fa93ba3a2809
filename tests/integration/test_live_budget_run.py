"""A real run (queue, health, budget, gateway and a real executor with its training process): while it runs,
the job view shows the ledger plus the provisional stretch since the last usage sample and what an interruption
now would throw away; interrupted at its ceiling, it shows what was lost, which matches the ledger's own
account of the time charged after the checkpoint; its step history is readable for a loss curve."""

from __future__ import annotations

from datetime import datetime

import pytest

from services.budget.app import serve as budget_serve
from services.budget.settings import BudgetSettings
from tests.support.fleet import fleet
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


async def test_a_run_shows_its_provisional_time_and_its_interruption_cost_then_what_was_lost(env, tmp_path):
    async with fleet(env, tmp_path / "fleet") as f, running(budget_serve, env.settings(BudgetSettings)):
        f.start_executor("live")
        await f.wait_executors("live")
        spec = f.spec("live-cost", steps=600, step_seconds=0.05, every=40)
        spec["gpu_ceiling_seconds"] = 10.0  # a CPU worker counts one device: interrupted after ~10 s of run
        job_id = await f.submit(spec)

        async def at_risk() -> dict | None:
            job = await f.job(job_id)
            cost, budget = job.get("interruption_cost"), job.get("budget") or {}
            if (job["state"] == "running" and cost and cost["checkpoint_step"] is not None
                    and job["last_step"] > cost["checkpoint_step"] and budget.get("provisional_seconds", 0) > 0):
                return job
            return None

        job = await eventually(at_risk, 40, "a running job past a checkpoint, between two usage samples")
        cost, budget = job["interruption_cost"], job["budget"]
        assert cost["kind"] == "at_risk" and cost["steps"] == job["last_step"] - job["last_checkpoint"]["step"]
        assert cost["provisional_seconds"] == budget["provisional_seconds"]
        assert 0 < cost["gpu_seconds"] <= budget["consumed_live_seconds"] + 1e-6
        assert budget["consumed_live_seconds"] == pytest.approx(budget["consumed_seconds"]
                                                                + budget["provisional_seconds"], abs=2e-3)
        # A heartbeat interval is 1 s here: the stretch not yet in the ledger is about that, never the whole run.
        assert budget["provisional_devices"] == 1 and budget["provisional_seconds"] < 5.0

        await f.wait_job(job_id, lambda j: j["state"] == "interrupted", 60, "interrupted at its ceiling")

        async def settled() -> dict | None:  # the run's last usage record (cut at its process's exit) is in
            closed = await f.db.fetchval("SELECT bool_or(last) FROM budget.ledger WHERE job_id = $1", job_id)
            return await f.job(job_id) if closed else None

        done = await eventually(settled, 30, "the interrupted run's last usage record")
        lost = done["interruption_cost"]
        assert lost["kind"] == "lost" and lost["provisional_seconds"] == 0
        assert done["budget"]["provisional_seconds"] == 0  # nothing runs: nothing provisional
        ckpt = done["last_checkpoint"]
        assert lost["checkpoint_step"] == ckpt["step"] and lost["steps"] == done["last_step"] - ckpt["step"]
        # The ledger's own account: the run's records are contiguous, so the time charged after the checkpoint
        # is its last record's end minus the checkpoint's time (one device).
        end = await f.db.fetchval("SELECT max(ended_at) FROM budget.ledger WHERE job_id = $1 AND epoch = $2",
                                  job_id, done["lease_epoch"])
        expected = (end - datetime.fromisoformat(ckpt["at"])).total_seconds()
        assert lost["gpu_seconds"] == pytest.approx(expected, abs=0.01) and lost["gpu_seconds"] > 0
        assert lost["gpu_seconds"] <= done["budget"]["consumed_seconds"]
        print(f"\n[measured] running: ledger {budget['consumed_seconds']:.2f} + provisional "
              f"{budget['provisional_seconds']:.2f} GPU-s, at risk {cost['steps']} steps / {cost['gpu_seconds']:.2f} "
              f"GPU-s; interrupted: lost {lost['steps']} steps / {lost['gpu_seconds']:.3f} GPU-s "
              f"(ledger after the checkpoint: {expected:.3f}), consumed {done['budget']['consumed_seconds']:.2f}")

        # The step history behind the loss curve: what the queue accepted, downsampled on demand.
        resp = await f.http.get(f"/v1/jobs/{job_id}/steps")
        assert resp.status_code == 200, resp.text
        history = resp.json()
        steps = [p["step"] for p in history["points"]]
        assert history["reports"] >= 3 and steps == sorted(steps) and steps[-1] == done["last_step"]
        assert all(p["loss"] == pytest.approx(1.0 / p["step"]) for p in history["points"] if p["reports"] == 1)
        few = (await f.http.get(f"/v1/jobs/{job_id}/steps", params={"max_points": 2})).json()
        assert len(few["points"]) <= 2 and few["downsampled"] and few["points"][-1]["step"] == done["last_step"]
        assert sum(p["reports"] for p in few["points"]) == history["reports"]
