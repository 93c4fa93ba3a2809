"""The accelerator benchmark's prepared run (bench/gpu_device.sh run) on this machine, which has no GPU: the
deep-check suite and the built-in fine-tune really run (on the CPU) and their figures land in gpu.json. A smoke,
never a timing: on a GPU machine the same script adds the peaks, the CPU reference and the checkpoint stall."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_prepared_run_writes_the_suite_and_fine_tune_figures(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_device.sh"), "run", "--quick", "--steps", "12"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu.json").read_text())
    assert doc["device"] == "cpu" and doc["quick"] is True
    gemm, mem, tune = doc["results"]  # no CUDA: no checkpoint row (the checkpoint benchmark covers the CPU)
    assert gemm["name"].startswith("deep check GEMM") and gemm["figure"] > 0 and gemm["reference"] is None
    assert "suite matmul passed" in gemm["note"]
    assert mem["figure"] > 0 and "suite membw passed" in mem["note"]
    assert tune["name"] == "built-in fine-tune on cpu" and tune["figure"] > 0 and "12 steps" in tune["note"]
    assert "built-in fine-tune on cpu" in proc.stdout


def test_the_script_refuses_an_unknown_verb():
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_device.sh"), "measure"], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr
