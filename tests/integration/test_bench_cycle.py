"""``teto bench cycle`` (issue 12 item 1's per-job targets) runs against a real ``teto up`` with one executor and
reports both intervals in the common shape, each with its absolute target and a reference from the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_quick_smoke_of_the_cycle_benchmark(tmp_path):
    out = tmp_path / "bench-results.json"
    proc = subprocess.run([sys.executable, "-m", "teto.cli", "bench", "cycle", "--quick", "--timeout", "300",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"cycle: grant -> started", "cycle: finished -> next grant"}
    assert {r["target"] for r in rows.values()} == {30.0, 50.0}
    for r in rows.values():
        assert r["figure"] > 0 and r["reference"] > 0 and isinstance(r["passed"], bool), r
        assert "one local executor" in r["note"] and "by the queue's clock" in r["note"]
