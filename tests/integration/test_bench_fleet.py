"""The fleet bench still works (bench/bench_fleet.py, quick size): the simulated executors register, heartbeat,
take grants from the real queue and renew them, the three services run in their own processes, and the result
rows say what was measured. No timing is asserted (speed belongs to the bench's own runs)."""

from __future__ import annotations

import pytest

from bench import bench_fleet
from teto import benchrun

pytestmark = pytest.mark.integration


async def test_a_small_fleet_runs_against_the_real_services_and_reports_every_measure():
    result = await bench_fleet.run(60, 2.0, cycles=2)
    counters = result["counters"]
    assert counters["heartbeats"] >= 60 and counters["grants"] >= 1 and counters["renewals"] >= 1
    assert result["killed"] == 1 and result["passes"] >= 1
    assert set(result["pending_max"]) == {d for _, d in bench_fleet.DURABLES}
    rows = bench_fleet.rows([result])
    assert [r["name"] for r in rows] == ["fleet 60: signal evaluation lag p99", "fleet 60: false no_signal",
                                         "fleet 60: killed found", "fleet: largest that holds"]
    for r in rows:
        assert set(benchrun.KEYS) <= set(r) and isinstance(r["passed"], bool) and r["note"]
