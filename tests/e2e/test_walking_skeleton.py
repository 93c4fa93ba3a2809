"""The whole path on real parts, as a user drives it: ``teto up`` (embedded NATS and PostgreSQL, five services,
two executors), a fine-tune submitted over HTTP that succeeds with checkpoints on disk, an executor SIGKILLed
mid-run whose job finishes on the other executor from its latest checkpoint, the CLI, and a restart of the
stack on the same data directory that finds every job and event where it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import _clean_env, start_stack

pytestmark = pytest.mark.e2e


def _finetune(steps: int, every: int, delay: float = 0.0, name: str = "e2e") -> dict:
    return {"name": name, "workload": {"kind": "finetune", "params": {"steps": steps, "batch_size": 8,
                                                                       "seq_len": 32, "step_delay_seconds": delay}},
            "checkpoint_every_steps": every}


def test_submit_train_checkpoint_kill_resume_restart(stack_dir: Path):
    data_dir = stack_dir
    stack = start_stack(data_dir)
    try:
        # 1. A job submitted over HTTP succeeds, with its checkpoints on disk.
        r = stack.post("/v1/jobs", _finetune(steps=30, every=5, name="first"))
        assert r.status_code == 201, r.text
        first = r.json()
        assert first["state"] in ("queued", "running") and first["owner"] == "local-admin"
        # Its output followed from the CLI while it runs, until it ends.
        follow = subprocess.Popen([sys.executable, "-m", "teto.cli", "logs", first["id"], "-f", "--data-dir",
                                   str(data_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=_clean_env())
        done = stack.wait_state(first["id"], {"succeeded", "failed"}, 180)
        assert done["state"] == "succeeded", (done, stack.log_tail())
        followed, notices = follow.communicate(timeout=60)
        assert follow.returncode == 0 and "fine-tune:" in followed, notices
        if "attempt 2" in notices:  # printed whole when it fails (an assertion's message is cut)
            for e in stack.events(first["id"]):
                print(e["event"], e["reason"], e.get("error"), e["detail"])
            print(stack.log_tail())
        assert notices.splitlines()[-2:] == ["[teto: attempt 1 rank 0 ended: exit status 0]",
                                             "[teto: job ended: succeeded]"], notices
        assert done["last_checkpoint"]["step"] == 30
        # Six checkpoints written and reported; the newest three kept (the executor's default), sidecars too.
        ckpts = sorted(p.name for p in (data_dir / "checkpoints" / first["id"]).iterdir())
        assert ckpts == [f"step-000000{s}.{ext}" for s in (20, 25, 30) for ext in ("json", "pt")], ckpts
        events = [e["event"] for e in stack.events(first['id'])]
        assert events[0] == "submitted" and events[-1] == "succeeded" and events.count("checkpointed") == 6

        # 2. SIGKILL the executor running a second job after a checkpoint: it finishes elsewhere, resumed.
        r = stack.post("/v1/jobs", _finetune(steps=60, every=10, delay=0.15, name="second"))
        second = r.json()["id"]
        running = eventually(lambda: (j := stack.job(second))["last_checkpoint"] and j["last_checkpoint"]["step"]
                             >= 20 and j, 180, "a checkpoint at step 20")
        victim = running["executor_id"]
        (proc,) = [p for p in stack.processes() if p["executor_id"] == victim]
        os.kill(proc["pid"], signal.SIGKILL)
        killed_at_step = running["last_checkpoint"]["step"]
        done = stack.wait_state(second, {"succeeded", "failed"}, 240)
        assert done["state"] == "succeeded", (done, stack.log_tail())
        assert done["executor_id"] != victim
        if done["attempts"]["training_error"]:
            # Printed whole (an assertion's message is cut): each event, then the stack's log.
            for e in stack.events(second):
                print(e["event"], e["reason"], e.get("error"), e["detail"])
            print(stack.log_tail())
        assert done["attempts"]["transport_lost"] >= 1 and done["attempts"]["training_error"] == 0, done["attempts"]
        started = [e for e in stack.events(second) if e["event"] == "started"]
        assert started[-1]["detail"]["resumed_from_step"] >= killed_at_step

        # 3. The CLI sees the same jobs.
        out = stack.cli("jobs", "--json")
        assert out.returncode == 0, out.stderr
        assert {first["id"], second} <= {j["id"] for j in json.loads(out.stdout)}
        assert "succeeded" in stack.cli("job", second).stdout
        # ... and the output of both attempts of the second job: the one cut short by the kill, then the resumed.
        logs = stack.cli("logs", second)
        assert logs.returncode == 0 and logs.stdout.count("fine-tune:") == 2, (logs.stdout[-2000:], logs.stderr)
        assert logs.stderr.splitlines()[-1] == "[teto: attempt 2 rank 0 ended: exit status 0]", logs.stderr
    finally:
        rc = stack.stop()
    assert rc == 0

    # 4. `teto up` again on the same data directory: every job and event is where it was.
    stack = start_stack(data_dir)
    try:
        again = stack.job(second)
        assert again["state"] == "succeeded" and again["executor_id"] == done["executor_id"]
        assert len(stack.events(second)) >= 6
    finally:
        assert stack.stop() == 0
