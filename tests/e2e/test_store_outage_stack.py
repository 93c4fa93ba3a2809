"""The checkpoint store away, on a whole stack using the operator's own S3 store (``TETO_CHECKPOINT_STORE_URL``:
a SeaweedFS this test owns, so it can kill it and start it again; ``teto up`` then starts none of its own).

- Stopped during a run: the run goes on; its checkpoints stay ``uploading`` (the job says why and how far behind
  the store is) and none is valid until stored; back, the uploads complete in step order.
- Down at resume: the next run waits for it and retries (``checkpoint_store_waiting`` on the job), never starting
  from step 0 while a stored checkpoint exists; back, it resumes from that checkpoint.
- Corrupted objects: each checkpoint is skipped with the object's name, the previous one used."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from agents.executor.store import manifest as mf
from tests.support.seaweed import own_seaweed
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import start_stack

pytestmark = pytest.mark.e2e


def _finetune(steps: int, every: int, delay: float, name: str) -> dict:
    return {"name": name, "workload": {"kind": "finetune", "params": {"steps": steps, "batch_size": 8, "seq_len": 32,
                                                                       "step_delay_seconds": delay}},
            "checkpoint_every_steps": every, "checkpoints_kept": 0}


def _kill_agent(stack, executor_id: str) -> None:
    (proc,) = [p for p in stack.processes() if p["executor_id"] == executor_id]
    os.kill(proc["pid"], signal.SIGKILL)


def test_store_outage_during_a_run_at_resume_and_a_corrupt_object(stack_dir: Path):
    with own_seaweed(stack_dir.parent / "store") as store:
        stack = start_stack(stack_dir, args=("--checkpoint-store", "s3"), extra_env=store.env())
        try:
            assert not (stack_dir / "seaweedfs").exists()  # the operator's store, none of teto up's own
            # 1. The store stopped during a run.
            job = stack.post("/v1/jobs", _finetune(80, 10, 0.2, "outage")).json()["id"]
            first = eventually(lambda: (j := stack.job(job))["last_checkpoint"] and j["last_checkpoint"]["step"] >= 10
                               and j, 180, "a stored checkpoint")["last_checkpoint"]
            store.kill()
            retried = eventually(lambda: [e for e in stack.events(job) if e["event"] == "checkpoint_uploading"
                                          and e["reason"]], 120, "an upload retried while the store is down")
            assert "unavailable" in retried[0]["reason"] and retried[0]["detail"]["store"] == "s3://teto-checkpoints"
            # The run goes on past two more checkpoints of its own ...
            held = eventually(lambda: (j := stack.job(job))["last_step"] and j["last_step"] >= first["step"] + 25
                              and j, 120, "the run to go on while the store is down")
            # ... and none of them is valid: the job's checkpoint (resume point, interruption cost) has not moved.
            assert held["state"] == "running" and held["last_checkpoint"]["step"] == first["step"], held
            uploading = [e["detail"] for e in stack.events(job) if e["event"] == "checkpoint_uploading"]
            assert max(d["step"] for d in uploading) > first["step"] + 10 and max(d["behind"] for d in uploading) >= 2
            store.start()
            done = stack.wait_state(job, {"succeeded", "failed"}, 240)
            assert done["state"] == "succeeded", stack.log_tail()
            stored = [e["detail"]["step"] for e in stack.events(job) if e["event"] == "checkpointed"]
            assert stored == sorted(stored) and len(set(stored)) == len(stored) and stored[-1] == 80, stored
            assert done["last_checkpoint"]["state"] == "stored" and done["last_checkpoint"]["upload_seconds"] >= 0

            # 2. The store down at resume, and 3. corrupt objects, on one job: checkpoints at 10, 20, ...
            job = stack.post("/v1/jobs", _finetune(60, 10, 0.2, "resume")).json()["id"]
            running = eventually(lambda: (j := stack.job(job))["last_checkpoint"] and
                                 j["last_checkpoint"]["step"] >= 20 and j, 180, "two stored checkpoints")
            (agent,) = [p["pid"] for p in stack.processes() if p["executor_id"] == running["executor_id"]]
            os.kill(agent, signal.SIGSTOP)  # frozen: it stores and reports nothing more
            s3 = store.client()
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket="teto-checkpoints", Prefix=f"{job}/")["Contents"]]
            corrupt = {}
            for step, epoch in mf.stored(job, keys)[:-1]:  # every stored checkpoint's data but the first's
                corrupt[step] = mf.object_key(job, epoch, step, f"step-{step:08d}.pt")
                s3.put_object(Bucket="teto-checkpoints", Key=corrupt[step], Body=b"rotten")
            store.kill()
            os.kill(agent, signal.SIGKILL)
            waited = eventually(lambda: [e for e in stack.events(job) if e["event"] == "checkpoint_store_waiting"],
                                120, "the next run to wait for the store")
            assert "unavailable" in waited[0]["reason"] and waited[0]["epoch"] > running["lease_epoch"]
            assert not [e for e in stack.events(job) if e["event"] == "started" and e["epoch"] == waited[0]["epoch"]]
            accepted = stack.job(job)["last_checkpoint"]  # all its reports are in: a newer lease was granted
            assert accepted["step"] in corrupt, (accepted, corrupt)
            store.start()
            done = stack.wait_state(job, {"succeeded", "failed"}, 240)
            assert done["state"] == "succeeded", stack.log_tail()
            events = stack.events(job)
            started = [e for e in events if e["event"] == "started"][-1]["detail"]
            skipped = {e["detail"]["path"]: e["reason"] for e in events if e["event"] == "checkpoint_skipped"}
            assert skipped[f"s3://teto-checkpoints/{corrupt[accepted['step']]}"].startswith("corrupt"), skipped
            assert started["resumed_from_step"] == 10, started  # the one checkpoint left whole
        finally:
            assert stack.stop() == 0
