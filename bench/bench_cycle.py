"""One executor's cycle per job (issue 12, item 1's per-job targets): what the platform adds around each job on one
executor, from grant to process start (<= 30 ms) and from a job's end to the next grant (<= 50 ms).

``teto up`` with one local executor (its node passes its deep health checks first, untimed) and N trivial
``command`` jobs (``true``) submitted at once, so the executor always has a next job waiting; only the jobs granted
after the last submit was answered count (the submits' own work is item 2's, not the cycle's). Each interval is
read from the jobs' own events, all stamped by the queue's clock:

- **grant -> started**: from the ``leased`` event (the placement pass that granted the job) to the ``started``
  event (the queue recording the agent's report that the process runs). It holds the grant's way out (outbox
  relay, the agent's pull), the agent's lease confirmation and preparation, the process's start, and the report's
  way back (a few ms): an upper bound of grant -> process start.
- **finished -> next grant**: from a job's end event (``succeeded``) to the next job's ``leased`` event.

The reference, measured in the same run: starting a bare ``true`` from an asyncio process and seeing it end, what
a process start costs on this machine with no platform. Ratios are figure / reference; the targets are the issue's
absolute ones.

Run: .venv/bin/python -m bench.bench_cycle [N], or ``teto bench cycle``.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from bench._latency import percentile
from bench.bench_throughput import TRUE, _listed, _submit, _wait_schedulable, client_of

GRANT_TO_START_MS = 30.0
END_TO_GRANT_MS = 50.0
ENDS = ("succeeded", "failed", "cancelled")


def _at(event: Mapping) -> float:
    return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00")).timestamp()


def intervals(jobs: Iterable[Sequence[Mapping]], after: float = 0.0) -> tuple[list[float], list[float]]:
    """(grant -> started, finished -> next grant) in seconds, from each job's events on one executor (pure): of the
    jobs granted at ``after`` (a Unix time) or later.

    A job counts its first ``leased`` and first ``started``; the next grant is the next job by grant time, and a
    pair whose next grant came before the end (another executor's) is not a gap of this one."""
    runs = []
    for events in jobs:
        first: dict[str, float] = {}
        for e in events:
            first.setdefault(str(e["event"]), _at(e))
        if first.get("leased", -1.0) >= after:
            runs.append(first)
    runs.sort(key=lambda r: r["leased"])
    to_start = [r["started"] - r["leased"] for r in runs if "started" in r]
    ended = [next((r[k] for k in ENDS if k in r), None) for r in runs]
    to_grant = [nxt["leased"] - end for end, nxt in zip(ended, runs[1:]) if end is not None and nxt["leased"] >= end]
    return to_start, to_grant


async def bare_start(n: int) -> list[float]:
    """Seconds each of n bare ``true`` processes took from asyncio's spawn to its end."""
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(TRUE)
        await proc.wait()
        took.append(time.perf_counter() - t0)
    return took


def through_teto(n: int) -> tuple[list[list[dict]], float]:
    """Each job's events, and when the last submit was answered (a Unix time)."""
    from tests.e2e.stack import start_stack  # the e2e tests' way of running `teto up` as a user does

    root = Path(tempfile.mkdtemp(prefix="teto-bench-"))
    data = root / "data"
    data.mkdir()
    stack = start_stack(data, executors=1, lease=30, heartbeat=5)
    try:
        _wait_schedulable(stack, 1)
        spec = {"workload": {"kind": "command", "command": [TRUE]}, "gpu_ceiling_seconds": 600}
        with client_of(stack) as http:
            ids = [_submit(http, spec, i) for i in range(n)]
            submitted = time.time()
            deadline = time.monotonic() + 60 + n
            while any(_listed(http, state, 1) for state in ("queued", "running")):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{n} trivial jobs on one executor still not done")
                time.sleep(0.25)
        events = [stack.events(j) for j in ids]
        if failed := [j for j, ev in zip(ids, events) if not any(e["event"] == "succeeded" for e in ev)]:
            raise AssertionError(f"{len(failed)} of {n} trivial jobs did not succeed")
        return events, submitted
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(n: int) -> list[dict]:
    reference = asyncio.run(bare_start(max(20, n // 2)))
    events, submitted = through_teto(n)
    to_start, to_grant = intervals(events, after=submitted)
    counted = f"the {len(to_start)} granted after the last submit counted"
    if len(to_start) < 2 or not to_grant:  # a short run (--quick) whose jobs all ran while it submitted
        to_start, to_grant = intervals(events)
        counted = "all counted (too few granted after the last submit)"
    ref_ms = statistics.median(reference) * 1000
    rows = []
    for name, values, target, what in (
            ("cycle: grant -> started", to_start, GRANT_TO_START_MS,
             "leased event to started event (the agent's report recorded): an upper bound of grant -> process start"),
            ("cycle: finished -> next grant", to_grant, END_TO_GRANT_MS,
             "a job's succeeded event to the next job's leased event")):
        ms = [v * 1000 for v in values]
        p50 = percentile(ms, 50)
        rows.append({"name": name, "figure": round(p50, 2), "reference": round(ref_ms, 2),
                     "ratio": round(p50 / ref_ms, 3), "target": target, "unit": "ms (p50)", "passed": p50 <= target,
                     "note": (f"{n} trivial command jobs (true) on one local executor of teto up, all submitted at "
                              f"once, {counted}; {what}, by the queue's clock; p90 {percentile(ms, 90):.1f} ms, max "
                              f"{max(ms):.1f} ms; reference: a bare true started and ended "
                              f"from asyncio, median of {len(reference)}")})
    return rows


def main(quick: bool = False) -> list[dict]:
    return run(10) if quick else run(300)


if __name__ == "__main__":
    for row in run(int(sys.argv[1]) if len(sys.argv) > 1 else 300):
        print(f"{row['name']}: {row['figure']} ms (target {row['target']}, reference {row['reference']} ms): "
              f"{'pass' if row['passed'] else 'short'}; {row['note']}")
