"""Directory checkpoints through the whole stack (``teto up``, issue 27): a command job writing ``checkpoint-N/``
directories reaches its GPU ceiling and is interrupted on a directory checkpoint (reported as one, with its kind,
size and files); one file of that newest directory is then corrupted; requeued, the next run skips it with a
``checkpoint_skipped`` event naming the file and why, and resumes from the previous directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import JOB_PYTHON, start_stack

pytestmark = pytest.mark.e2e

CEILING = 8.0  # GPU-seconds: a CPU worker counts as one device
TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_script.py")


def _spec() -> dict[str, Any]:
    return {"name": "directories", "gpu_ceiling_seconds": CEILING, "checkpoint_every_steps": 5,
            "workload": {"kind": "command", "command": [JOB_PYTHON, TRAIN_SCRIPT],
                         "env": {"STEPS": "100000", "STEP_SECONDS": "0.1", "CHECKPOINT_KIND": "directory"}}}


def test_a_corrupt_file_in_the_newest_checkpoint_directory_is_skipped_for_the_previous(tmp_path: Path):
    data_dir = tmp_path / "teto"
    stack = start_stack(data_dir, executors=1, lease=6, heartbeat=1, extra_env={"TETO_STOP_GRACE_SECONDS": "10"})
    try:
        r = stack.post("/v1/jobs", _spec())
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        job = stack.wait_state(job_id, {"interrupted", "failed", "succeeded"}, 180)
        assert job["state"] == "interrupted" and job["reason"] == "gpu_ceiling", (job, stack.log_tail())
        k = job["last_checkpoint"]["step"]
        assert job["last_checkpoint"]["kind"] == "directory" and job["last_checkpoint"]["files"] == 2
        assert k >= 10 and job["last_checkpoint"]["path"].endswith(f"checkpoint-{k}")
        assert [c["kind"] for c in job["checkpoints"]] == ["directory"] * len(job["checkpoints"])
        ckpt_dir = data_dir / "checkpoints" / job_id
        kept = sorted(int(p.name.split("-")[1]) for p in ckpt_dir.iterdir() if p.name.startswith("checkpoint-"))
        assert kept[-1] == k and len(kept) >= 2 and all((ckpt_dir / f"checkpoint-{s}" / "teto-manifest.json").is_file()
                                                          for s in kept), kept
        previous = kept[-2]

        damaged = ckpt_dir / f"checkpoint-{k}" / "optimizer" / "optimizer.bin"
        damaged.write_bytes(b"\xff" + damaged.read_bytes()[1:])

        def requeued() -> bool:
            consumed = (stack.job(job_id)["budget"] or {}).get("consumed_seconds")
            if consumed is None:
                return False
            answer = stack.post(f"/v1/jobs/{job_id}/requeue", {"gpu_ceiling_seconds": consumed + 300})
            return answer.status_code in (200, 201, 202)

        eventually(requeued, 60, "the requeue to be accepted")

        def resumed() -> list[dict] | None:
            started = [e for e in stack.events(job_id) if e["event"] == "started"]
            return started if len(started) == 2 else None

        started = eventually(resumed, 120, "the second run to start")
        assert started[1]["detail"]["resumed_from_step"] == previous, (started, stack.log_tail())
        assert started[1]["detail"]["resumed_from"].endswith(f"checkpoint-{previous}")
        (skipped,) = [e for e in stack.events(job_id) if e["event"] == "checkpoint_skipped"]
        assert skipped["detail"]["path"].endswith(f"checkpoint-{k}")
        assert skipped["reason"].startswith("optimizer/optimizer.bin: checksum mismatch"), skipped
        assert stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "done"}).status_code in (200, 202)
    finally:
        stack.stop()
