"""Tenancy on the whole stack (``teto up``, four real executors, real fine-tunes): two organisations in a cohort;
South borrows North's idle share, North submits and gets it back by preemption; the preempted job checkpoints,
is requeued with no attempt spent and resumes from its checkpoint; the usage report's total equals the sum the
budget charged the jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import start_stack

pytestmark = pytest.mark.e2e


def _finetune(name: str, steps: int = 400) -> dict:
    return {"name": name, "workload": {"kind": "finetune", "params": {"steps": steps, "batch_size": 4, "seq_len": 16,
                                                                       "step_delay_seconds": 0.2}},
            "checkpoint_every_steps": 5, "gpu_ceiling_seconds": 3000}


@pytest.mark.timeout(900)  # four real fine-tunes on a shared 2-core machine, one of them twice
def test_a_lender_gets_its_share_back_and_the_preempted_job_resumes_from_its_checkpoint(stack_dir: Path):
    stack = start_stack(stack_dir, executors=4)
    try:
        quota = {"quotas": {"local": {"nominal": 2}}, "cohort": "hospitals"}  # teto up's node group
        for path, body in (("/v1/cohorts/hospitals", {"preemption": "reclaim_borrowed"}),
                           ("/v1/orgs/north", quota), ("/v1/orgs/south", quota)):
            r = _put(stack, path, body)
            assert r.status_code == 200, r.text
        south = []
        for i in range(4):
            r = stack.post("/v1/jobs?org=south", _finetune(f"south-{i}"))
            assert r.status_code == 201, r.text
            south.append(r.json()["id"])
        seen: list = []

        def all_running() -> bool:
            jobs = [stack.job(s) for s in south]
            seen[:] = [(j["state"], j.get("executor_id"), (j.get("waiting") or {}).get("reason"),
                        (j.get("last_checkpoint") or {}).get("step")) for j in jobs]
            return all(j["state"] == "running" and j["last_checkpoint"] for j in jobs)
        try:
            eventually(all_running, 300, "South's four jobs running with a checkpoint each")
        except AssertionError:
            raise AssertionError(f"{seen}\n{stack.get('/v1/executors').json()}\n{stack.log_tail(3000)}") from None

        r = stack.post("/v1/jobs?org=north", _finetune("north-0", steps=20))
        assert r.status_code == 201, r.text
        north = r.json()["id"]

        def preempted() -> str | None:
            for s in south:
                events = stack.events(s)
                if any(e["event"] == "requeued" and e["reason"] == "preempted" for e in events):
                    return s
            return None
        victim = eventually(preempted, 120, "a South job preempted")
        stop = next(e for e in stack.events(victim) if e["event"] == "stop_requested")
        assert stop["detail"]["for_org"] == "north" and stop["detail"]["for_job"] == north
        checkpoint_step = stack.job(victim)["last_checkpoint"]["step"]
        done = stack.wait_state(north, {"succeeded", "failed"}, 240)
        assert done["state"] == "succeeded" and done["org"] == "north", (done, stack.log_tail())

        # The preempted job runs again once capacity frees (North's job ended): from its checkpoint, for free.
        # The run after the preemption's requeue (on a loaded machine an earlier run may also have been requeued
        # for a late lease renewal, before any checkpoint: not this one).
        requeued_at = next(e["seq"] for e in stack.events(victim)
                           if e["event"] == "requeued" and e["reason"] == "preempted")

        def resumed() -> dict | None:
            started = [e for e in stack.events(victim) if e["event"] == "started" and e["seq"] > requeued_at]
            return started[0] if started else None
        again = eventually(resumed, 240, "the preempted job to start again")
        assert again["detail"]["resumed_from_step"] >= checkpoint_step
        job = stack.job(victim)
        if job["attempts"]["training_error"]:  # printed whole (an assertion's message is cut), then the stack's log
            for e in stack.events(victim):
                print(e["event"], e["epoch"], e.get("reason"), e.get("error"), e.get("detail"))
            print(stack.log_tail())
        assert job["attempts"]["preempted"] == 1 and job["attempts"]["training_error"] == 0, [
            (e["event"], e["epoch"], e.get("reason"), e.get("detail")) for e in stack.events(victim)
            if e["event"] not in ("checkpointed", "step")]

        # Every job ended: the usage report's total is what the budget charged them, to the second.
        for s_ in south:
            stack.post(f"/v1/jobs/{s_}/cancel", {"reason": "test over"})
        for j in [*south, north]:
            stack.wait_state(j, {"succeeded", "failed", "cancelled"}, 60)

        def agree() -> dict | None:
            usage = stack.get("/v1/usage", params={"group_by": "org"}).json()
            budgets = {j: stack.job(j)["budget"] for j in [*south, north]}
            seen[:] = [usage, budgets]
            if any(b is None for b in budgets.values()):
                return None
            charged = sum(b["consumed_seconds"] or 0.0 for b in budgets.values())
            return usage if charged > 0 and abs(usage["total_gpu_seconds"] - charged) < 1.0 else None
        try:
            usage = eventually(agree, 60, "the usage total to equal the jobs' charged GPU-seconds")
        except AssertionError:
            raise AssertionError(f"{seen}\n{stack.log_tail(6000)}") from None
        assert {r["key"] for r in usage["rows"]} == {"north", "south"}
    finally:
        assert stack.stop() == 0


def _put(stack, path: str, body: dict):  # noqa: ANN001
    import httpx

    return httpx.put(stack.url + path, json=body, headers=stack.headers, timeout=30)
