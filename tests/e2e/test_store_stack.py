"""``teto up --checkpoint-store s3 --executors 2``: checkpoints go to the embedded SeaweedFS, each executor writes
into its own local directory, and a job whose agent is SIGKILLed resumes on the other executor from the stored
checkpoint (downloaded there: no filesystem is shared). A ``command`` job on the same stack tries to read and list
the other job's checkpoints and cannot: no credentials in its environment, the key file closed to it, the store
refusing anonymous requests, the other job's local directory closed to its uid."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from agents.executor.store import manifest as mf
from teto.stack.seaweed import EmbeddedSeaweed
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import JOB_PYTHON, start_stack

pytestmark = pytest.mark.e2e

PROBE = r"""
import json, os, sys, urllib.request, urllib.error
endpoint, bucket, job, other_dir, keys = sys.argv[1:6]
out = {"env": sorted(k for k in os.environ if k.startswith(("TETO_CHECKPOINT_STORE", "AWS_")))}
for name, url in (("list", f"{endpoint}/{bucket}?list-type=2&prefix={job}/"),
                  ("get", f"{endpoint}/{bucket}/{job}/manifests/"), ("buckets", f"{endpoint}/")):
    try:
        out[name] = urllib.request.urlopen(url, timeout=10).status
    except urllib.error.HTTPError as exc:
        out[name] = exc.code
for name, path in (("keys", keys), ("local", other_dir)):
    try:
        out[name] = os.listdir(path) if os.path.isdir(path) else open(path).read()[:4]
    except OSError as exc:
        out[name] = type(exc).__name__
print("PROBE " + json.dumps(out), flush=True)
"""


def _finetune(steps: int, every: int, delay: float) -> dict:
    return {"name": "stored", "workload": {"kind": "finetune", "params": {"steps": steps, "batch_size": 8,
                                                                          "seq_len": 32, "step_delay_seconds": delay}},
            "checkpoint_every_steps": every}


def test_sigkilled_agent_resumes_on_the_other_executor_from_the_store(stack_dir: Path):
    stack = start_stack(stack_dir, args=("--checkpoint-store", "s3"))
    try:
        store = EmbeddedSeaweed.running(stack_dir / "seaweedfs")
        s3 = store.client()
        r = stack.post("/v1/jobs", _finetune(steps=60, every=10, delay=0.15))
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        running = eventually(lambda: (j := stack.job(job))["last_checkpoint"] and j["last_checkpoint"]["step"] >= 20
                             and j, 180, "a stored checkpoint at step 20")
        ckpt = running["last_checkpoint"]
        # Reported once its manifest is in the store: the accepted checkpoint's path is the manifest's address.
        assert ckpt["path"].startswith(f"s3://{store.bucket}/{job}/manifests/"), ckpt
        key = ckpt["path"].removeprefix(f"s3://{store.bucket}/")
        made = mf.load(s3.get_object(Bucket=store.bucket, Key=key)["Body"].read(), job_id=job, step=ckpt["step"],
                       epoch=ckpt["epoch"])
        assert made.sha256 == ckpt["sha256"] and made.bytes == ckpt["bytes"]
        # The rehearsal's server runs below the training processes' CPU priority (it serves the uploads).
        (weed,) = [p for p in stack.processes() if p["name"] == "seaweedfs"]
        assert os.getpriority(os.PRIO_PROCESS, weed["pid"]) == 10, weed
        victim = running["executor_id"]
        victim_dir = stack_dir / "executors" / victim / "checkpoints" / job
        assert (victim_dir / made.path).is_file()
        assert not (stack_dir / "checkpoints" / job).exists()  # the shared checkpoint directory is not used

        (proc,) = [p for p in stack.processes() if p["executor_id"] == victim]
        os.kill(proc["pid"], signal.SIGKILL)
        killed_at = ckpt["step"]
        done = stack.wait_state(job, {"succeeded", "failed"}, 240)
        assert done["state"] == "succeeded", (done, stack.log_tail())
        if done["executor_id"] == victim or done["attempts"]["training_error"]:
            # Printed whole (an assertion's message is cut): each event, then the stack's log.
            for e in stack.events(job):
                print(e["event"], e["reason"], e["detail"])
            print(stack.log_tail())
        assert done["executor_id"] != victim and done["attempts"]["training_error"] == 0, done["attempts"]
        started = [e for e in stack.events(job) if e["event"] == "started"][-1]["detail"]
        assert started["resumed_from_step"] >= killed_at
        other_dir = stack_dir / "executors" / done["executor_id"] / "checkpoints" / job
        assert Path(started["resumed_from"]).parent == other_dir, started
        assert done["last_checkpoint"]["step"] == 60 and done["last_checkpoint"]["path"].startswith("s3://")
        assert done["last_checkpoint"]["kind"] == "file", done["last_checkpoint"]  # stored, still of its kind
        view = done["checkpoint_store"]  # the job view: each recent checkpoint's place and state
        assert view["behind"] == 0 and view["checkpoints"][0]["step"] == 60, view
        assert view["checkpoints"][0]["state"] == "stored" and view["checkpoints"][0]["location"] == \
            done["last_checkpoint"]["path"]
        # What its stored checkpoints hold (the newest 3, the default retention) is the usage report's, per org.
        keys = s3.list_objects_v2(Bucket=store.bucket, Prefix=f"{job}/")["Contents"]
        assert len(mf.stored(job, [o["Key"] for o in keys])) == 3
        assert done["last_checkpoint"]["stored_bytes"] == sum(o["Size"] for o in keys)
        rows = {r["key"]: r for r in stack.get("/v1/usage").json()["rows"]}
        assert rows[done["org"]]["checkpoint_bytes"] == done["last_checkpoint"]["stored_bytes"], rows

        # A command job cannot read or list that job's checkpoints: it is given nothing to do it with.
        spec = {"name": "probe", "workload": {"kind": "command", "command": [
            JOB_PYTHON, "-c", PROBE, store.endpoint, store.bucket, job, str(other_dir), str(store.secret_file)]}}
        r = stack.post("/v1/jobs", spec)
        assert r.status_code == 201, r.text
        probe = r.json()["id"]
        assert stack.wait_state(probe, {"succeeded", "failed"}, 120)["state"] == "succeeded", stack.log_tail()
        out = stack.cli("logs", probe)
        line = [x for x in out.stdout.splitlines() if x.startswith("PROBE ")]
        assert line, (out.stdout, out.stderr)
        seen = json.loads(line[0].removeprefix("PROBE "))
        assert seen["env"] == [], seen
        assert seen["list"] == 403 and seen["get"] == 403 and seen["buckets"] == 403, seen
        assert seen["keys"] == "PermissionError", seen
        if os.geteuid() == 0:  # runs have uids of their own (teto up as root): another job's directory is closed
            assert seen["local"] == "PermissionError", seen
    finally:
        assert stack.stop() == 0
