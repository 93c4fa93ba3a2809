"""A training process killed (SIGKILL) in the middle of a background checkpoint write: the resume logic the agent
uses (``checkpoints.latest_valid``) picks the previous complete checkpoint, the partial file is never a
candidate, and the agent was never told of the interrupted checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agents.executor import checkpoints as ck
from tests.support.services import eventually_blocking

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import os, sys, time
from pathlib import Path
from teto import sdk
from agents.executor import checkpoints, ckpt_async
marker = Path(sys.argv[2])
sdk.save_checkpoint({"w": list(range(1000))}, 1, background=True)
sdk.wait_checkpoints()

def hang():
    marker.write_text("now")
    time.sleep(60)

if sys.argv[1] == "payload":
    def half(f, payload):  # half the file is on disk under its temporary name when the process dies
        f.write(b"x" * 100_000)
        f.flush()
        os.fsync(f.fileno())
        hang()
    ckpt_async.write_payload = half
else:  # renamed into place, killed before its sidecar is written
    def no_sidecar(*args, **kwargs):
        hang()
    checkpoints.write_sidecar = no_sidecar
sdk.save_checkpoint({"w": list(range(2000))}, 2, background=True)
print("training goes on", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("phase", ["payload", "sidecar"])
def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint_as_the_resume_point(tmp_path, phase):
    ckdir, marker = tmp_path / "ck", tmp_path / "writing"
    r, w = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
    env.update(PYTHONPATH=str(ROOT), TETO_JOB_ID="j", TETO_CHECKPOINT_DIR=str(ckdir), TETO_REPORT_FD=str(w))
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, phase, str(marker)], env=env, pass_fds=(w,),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(w)
    try:
        eventually_blocking(lambda: marker.exists() or proc.poll() is not None, timeout=30,
                            what="the background write to start", every=0.02)
        assert proc.poll() is None, proc.stderr.read()
        assert proc.stdout.readline().strip() == "training goes on"  # the caller was not blocked by the write
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with os.fdopen(r) as f:
        reports = [json.loads(line) for line in f]
    assert [m["step"] for m in reports if m["type"] == "checkpoint"] == [1]  # never told of step 2

    latest, skipped = ck.latest_valid(ckdir)
    assert latest is not None and latest.step == 1
    names = sorted(p.name for p in ckdir.iterdir())
    if phase == "payload":
        (partial,) = [n for n in names if n.endswith(".tmp")]
        assert partial.startswith(".step-00000002.pt.") and (ckdir / partial).stat().st_size == 100_000
        assert [step for step, _ in ck.candidates(ckdir)] == [1] and skipped == []
    else:
        assert "step-00000002.pt" in names and "step-00000002.json" not in names
        assert [(p.name, reason) for p, reason in skipped] == [
            ("step-00000002.pt", "no sidecar: the checkpoint was never completed")]
