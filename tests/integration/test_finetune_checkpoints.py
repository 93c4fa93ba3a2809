"""The built-in fine-tune checkpoints in the background, and its final checkpoint on a stop (SIGTERM) is durable
and reported before the process exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agents.executor import checkpoints as ck

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("base")  # built once for the module (a fixed seed: always the same)


def test_the_final_checkpoint_on_sigterm_is_complete_before_exit(tmp_path, base_dir):
    ckdir, stop = tmp_path / "ck", tmp_path / "stop.json"
    stop.write_text(json.dumps({"checkpoint_first": True}))
    r, w = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
    env.update(PYTHONPATH=str(ROOT), TETO_JOB_ID="j", TETO_CHECKPOINT_DIR=str(ckdir), TETO_REPORT_FD=str(w),
               TETO_CHECKPOINT_EVERY="3", TETO_STOP_FILE=str(stop), TETO_BASE_DIR=str(base_dir),
               TETO_TORCH_THREADS="1", TETO_PARAMS=json.dumps({"steps": 10_000, "batch_size": 2, "seq_len": 16,
                                                        "step_delay_seconds": 0.2}))
    proc = subprocess.Popen([sys.executable, "-m", "agents.executor.workloads.finetune"], env=env, pass_fds=(w,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(w)
    lines = []
    with os.fdopen(r) as f:
        for raw in f:
            lines.append(json.loads(raw))
            if lines[-1]["type"] == "step" and lines[-1]["step"] == 7:
                proc.send_signal(signal.SIGTERM)  # in the pause after step 7: a final checkpoint is owed
    assert proc.wait(60) == 143, proc.stderr.read()
    last = max(m["step"] for m in lines if m["type"] == "step")
    reported = [m for m in lines if m["type"] == "checkpoint"]
    assert [m["step"] for m in reported][:2] == [3, 6] and reported[-1]["step"] == last == 7
    for m in reported:  # every checkpoint the agent heard of is complete and matches what it was told
        valid, reason = ck.validate(Path(m["path"]))
        assert reason is None and valid.sha256 == m["sha256"]
    latest, skipped = ck.latest_valid(ckdir)
    assert latest.step == last and skipped == []
    assert not [p for p in ckdir.iterdir() if p.name.endswith(".tmp")]
