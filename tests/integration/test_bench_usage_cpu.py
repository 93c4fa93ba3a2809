"""``teto bench usage_cpu --quick`` as a smoke that the benchmark still works: one row, every report in the
ledger once, the CPU split by process in the note; never a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from teto import benchrun

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_quick_smoke_of_the_usage_cpu_benchmark(tmp_path):
    out = tmp_path / "bench-results.json"
    proc = subprocess.run([sys.executable, "-m", "teto.cli", "bench", "usage_cpu", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert set(benchrun.KEYS) <= set(result) and result["bench"] == "usage_cpu"
    assert result["passed"] is True and result["figure"] > 0, result  # the ledger holds every report once
    assert "ledger rows 2000 of 2000" in result["note"] and "budget " in result["note"], result["note"]
    for part in ("self", "postgres", "nats-server"):
        assert part in result["note"]
