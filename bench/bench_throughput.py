"""Job throughput end to end (issue 12, item 1): N trivial ``command`` jobs (``true``) through the whole stack as a
user runs it (``teto up`` with 8 local executors, HTTP submits), against the same N processes started by a plain
asyncio pool with the same 8 slots in the same run (the machine's own cost of running them, no platform).

The figure is N over the time from the first submit until no job is queued or running (polled over the API at
4 Hz with two one-row pages; every job's success is checked afterwards);
the reference is N over the time the pool took. The ratio says what share of the bare process throughput the
platform keeps; the target is the issue's absolute one, 16 jobs/s (twice Slurm's 8.2 on this machine kind), in
the note. The stack starts fresh (its executors pass their deep health checks first, untimed).

Run: .venv/bin/python -m bench.bench_throughput [N] [EXECUTORS], or ``teto bench throughput`` (``main``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench import _cpu

TARGET_JOBS_PER_SECOND = 16.0
TRUE = shutil.which("true") or "/bin/true"
CLIENTS = 16  # concurrent submitting threads, each on a kept-alive connection


async def reference(n: int, slots: int) -> float:
    """Seconds a pool of ``slots`` concurrent ``true`` processes takes to run n of them."""
    gate = asyncio.Semaphore(slots)

    async def one() -> None:
        async with gate:
            proc = await asyncio.create_subprocess_exec(TRUE)
            await proc.wait()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - t0


def through_teto(n: int, executors: int) -> tuple[float, dict]:
    from tests.e2e.stack import start_stack  # the e2e tests' way of running `teto up` as a user does

    root = Path(tempfile.mkdtemp(prefix="teto-bench-"))
    data = root / "data"
    data.mkdir()
    stack = start_stack(data, executors=executors, lease=30, heartbeat=5)
    try:
        _wait_schedulable(stack, executors)
        spec = {"workload": {"kind": "command", "command": [TRUE]}, "gpu_ceiling_seconds": 600}
        with client_of(stack) as http:
            cpu_before = _cpu.snapshot(stack.data_dir)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(CLIENTS) as pool:  # submits as 16 concurrent clients would send them
                ids = list(pool.map(lambda i: _submit(http, spec, i), range(n)))
            submitted = time.perf_counter() - t0
            states: dict = {}
            while any(_listed(http, state, 1) for state in ("queued", "running")):
                time.sleep(0.25)  # two one-row pages: the poll itself must not load the gateway it measures
            took = time.perf_counter() - t0
            states["cpu_ms_per_job"] = _cpu.per_job_ms(_cpu.spent(cpu_before, _cpu.snapshot(stack.data_dir)), n)
            states["submit_seconds"] = round(submitted, 2)
            done = {j["id"] for j in _listed(http, "succeeded", n + 1)}
            failed = _listed(http, "failed", 10)
        if failed or not done >= set(ids):  # checked after the clock stopped
            raise AssertionError(f"{len(set(ids) - done)} of {n} trivial jobs did not succeed; failed: "
                                 f"{[j.get('error') for j in failed]}")
        return took, states
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


def client_of(stack) -> httpx.Client:
    """One HTTP client for the run's submits and polls, its connections kept alive between requests (up to one
    per submitting thread), as a program submitting many jobs keeps them. A client made per request (httpx's
    module-level calls) costs the bench's own process about 36 ms of CPU each (a new TLS context and connection),
    which bounded the submits to about 13 a second on this machine, on the cores the stack needs."""
    return httpx.Client(base_url=stack.url, headers=stack.headers, timeout=30,
                        limits=httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS))


def _listed(http: httpx.Client, state: str, limit: int) -> list[dict]:
    """Up to ``limit`` jobs in ``state``, following the pages' cursors."""
    jobs: list[dict] = []
    params: dict = {"state": state, "limit": min(limit, 1000)}
    while len(jobs) < limit:
        r = http.get("/v1/jobs", params=params)
        jobs += r.json()
        cursor = r.headers.get("X-Next-Cursor")
        if not cursor:
            break
        params["cursor"] = cursor
    return jobs[:limit]


def _submit(http: httpx.Client, spec: dict, i: int) -> str:
    r = http.post("/v1/jobs", json={**spec, "name": f"true-{i}"})
    assert r.status_code in (200, 201, 202), r.text
    body = r.json()
    return body.get("id") or body["job_id"]


def _wait_schedulable(stack, executors: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = stack.get("/v1/nodes").json()
        nodes = nodes.get("nodes", nodes) if isinstance(nodes, dict) else nodes
        if sum(1 for x in nodes if x.get("schedulable")) >= executors:
            return
        time.sleep(1)
    raise AssertionError("the executors' nodes did not pass their checks in time")


def run(n: int, executors: int) -> dict:
    ref = asyncio.run(reference(n, executors))
    took, extra = through_teto(n, executors)
    figure, reference_rate = n / took, n / ref
    cpu = extra["cpu_ms_per_job"]
    return {"cpu_ms_per_job": cpu, "name": "throughput", "figure": round(figure, 2), "reference": round(reference_rate, 1),
            "ratio": round(figure / reference_rate, 4), "target": None, "unit": "jobs/s",
            "passed": figure >= TARGET_JOBS_PER_SECOND,
            "note": (f"{n} trivial command jobs (true) on {executors} local executors through teto up, HTTP submits "
                     f"from {CLIENTS} threads on kept-alive connections (all submitted in {extra['submit_seconds']} s); "
                     f"reference: the same {n} "
                     f"processes from an asyncio pool with {executors} slots; target >= "
                     f"{TARGET_JOBS_PER_SECOND:.0f} jobs/s absolute (issue 12 item 1); CPU ms per job: "
                     f"{sum(cpu.values()):.0f} in all, " + ", ".join(f"{k} {v}" for k, v in cpu.items()))}


def main(quick: bool = False) -> dict:
    return run(100, 8) if quick else run(2_000, 8)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000
    executors = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    r = run(n, executors)
    print(f"throughput: {r['figure']} jobs/s, reference {r['reference']} processes/s, ratio {r['ratio']}; "
          f"target {TARGET_JOBS_PER_SECOND} jobs/s: {'pass' if r['passed'] else 'short'}\n{r['note']}")
    print(json.dumps(r["cpu_ms_per_job"], indent=1))
