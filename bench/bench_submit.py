"""Submit latency (issue 12, item 2): ``POST /v1/jobs`` from 32 concurrent keep-alive clients against the real
gateway of a fresh ``teto up`` (no executors: the jobs stay queued; the queue service answers each submit, the
audit service records it), against the same 32 clients calling ``GET /healthz`` of the same server in the same
run: the reference is what the HTTP stack alone costs, so the ratio shows the submit path's own cost.

A submit is accepted when the gateway answers 201 (the queue's outcome came back in time) or 202 (the command is
durable in the command stream, outcome pending); anything else is an error and fails the run. The reference runs
before and after the submits (the faster counts, so a disturbed reference cannot flatter a ratio). Targets are
the issue's absolute ones: p50 <= 10 ms, p99 <= 50 ms, >= 300 accepted submits/s.

The note also gives the CPU time each part of the stack (gateway, queue, audit, PostgreSQL, NATS, ...) spent per
submit during the submits (bench/_cpu.py), which other processes' load on a shared machine moves far less
than the rates: its total bounds the submits/s the stack could sustain on this machine's idle cores.

``--profile DIR`` also samples the gateway and the queue service with py-spy (``record --format raw``: collapsed
stacks, ``DIR/<part>.txt``) while the submits run, to find where their time goes (docs/performance.md).

The open loop (``--paced-seconds``, default 15) is profiled on its own (``DIR/paced-<part>.txt``): its tail.

Run: .venv/bin/python -m bench.bench_submit [N] [--clients 32] [--profile DIR] [--paced-seconds S], or
``teto bench submit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench._latency import summary
from bench import _cpu

TARGET_P50_MS, TARGET_P99_MS, TARGET_RATE = 10.0, 50.0, 300.0
SPEC = {"workload": {"kind": "command", "command": ["true"]}, "gpu_ceiling_seconds": 600}
ACCEPTED = (201, 202)


async def hammer(url: str, token: str, clients: int, n: int, method: str, path: str,
                 headers: dict[str, str] | None = None) -> tuple[list[float], float, dict[int, int]]:
    """n requests from ``clients`` concurrent keep-alive clients (one connection each), with ``headers`` on each;
    the latency of each, the wall time of the whole, and the count of each status."""
    left = [n]
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def client() -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}", **(headers or {})},
                                     limits=limits, timeout=60) as http:
            while left[0] > 0:
                left[0] -= 1
                body = {**SPEC, "name": f"bench-{left[0]}"} if method == "POST" else None
                t0 = time.perf_counter()
                r = await http.request(method, path, json=body)
                latencies.append(time.perf_counter() - t0)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - t0, statuses


def schedule(rate: float, seconds: float, clients: int) -> list[list[float]]:
    """Send times (seconds from the start) of an open-loop run: ``rate`` requests a second for ``seconds``, evenly
    spaced, dealt round-robin to ``clients`` (pure)."""
    if rate <= 0 or seconds <= 0 or clients <= 0:
        raise ValueError("rate, seconds and clients must be positive")
    times = [i / rate for i in range(int(rate * seconds))]
    return [times[c::clients] for c in range(clients)]


async def paced(url: str, token: str, clients: int, rate: float, seconds: float) -> tuple[list[float], float,
                                                                                          dict[int, int]]:
    """Submits at a fixed ``rate`` (open loop), whatever the answers' speed: the latency of each is counted from
    the time it was due to be sent, so a stack that falls behind shows it (no coordinated omission)."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    dues = schedule(rate, seconds, clients)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    https = [httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, limits=limits, timeout=60)
             for _ in dues]
    # Each client made and connected before the schedule starts: making 32 clients (an SSL context each) and
    # their first connections took the bench's own event loop about 0.7 s, which the first submits due were
    # charged for (the open loop's whole p99 tail).
    await asyncio.gather(*(http.get("/healthz") for http in https))
    start = time.perf_counter() + 0.1

    async def client(http: httpx.AsyncClient, due: list[float]) -> None:
        for i, at in enumerate(due):
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            r = await http.post("/v1/jobs", json={**SPEC, "name": f"paced-{i}"})
            latencies.append(time.perf_counter() - (start + at))
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

    try:
        await asyncio.gather(*(client(http, due) for http, due in zip(https, dues, strict=True)))
    finally:
        await asyncio.gather(*(http.aclose() for http in https))
    return latencies, time.perf_counter() - start, statuses


PROFILED = ("gateway", "queue")


def _profilers(data_dir: Path, out: Path, prefix: str = "") -> list[subprocess.Popen]:
    """py-spy recording each of PROFILED into ``out/<prefix><part>.txt`` until interrupted (none without py-spy)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy is not installed (pip install -e '.[dev]'): no profile", file=sys.stderr)
        return []
    out.mkdir(parents=True, exist_ok=True)
    pids = {r["name"]: r["pid"] for r in json.loads((data_dir / "processes.json").read_text())}
    return [subprocess.Popen([spy, "record", "--pid", str(pids[name]), "--rate", "200", "--format", "raw",
                              "--output", str(out / f"{prefix}{name}.txt"), "--nonblocking"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name in PROFILED]


def _stop(spies: list[subprocess.Popen]) -> None:
    for spy in spies:  # py-spy writes its file when interrupted
        spy.send_signal(signal.SIGINT)
        spy.wait(60)


PACED_RATE = 20.0  # submits/s: well under what the stack sustains here, so the latency is a submit's own


def run(n: int, clients: int = 32, profile: Path | None = None, paced_seconds: float = 15.0) -> list[dict]:
    from tests.e2e.stack import start_stack  # `teto up` as a user runs it (the e2e tests' helper)

    root = Path(tempfile.mkdtemp(prefix="teto-bench-submit-"))
    data = root / "data"
    data.mkdir()
    stack = start_stack(data, executors=0, lease=30, heartbeat=5)
    try:
        async def measure() -> tuple:
            await hammer(stack.url, stack.token, clients, max(clients * 2, n // 20), "POST", "/v1/jobs")  # warm
            ref1 = await hammer(stack.url, stack.token, clients, n, "GET", "/healthz")
            spies = _profilers(data, profile) if profile else []
            cpu0 = _cpu.snapshot(data)
            sub = await hammer(stack.url, stack.token, clients, n, "POST", "/v1/jobs")
            cpu1 = _cpu.snapshot(data)
            _stop(spies)
            ref2 = await hammer(stack.url, stack.token, clients, n, "GET", "/healthz")
            # The open loop's tail (a few slow submits among fast ones) is profiled on its own: paced-<part>.txt.
            spies = _profilers(data, profile, "paced-") if profile else []
            open_loop = await paced(stack.url, stack.token, clients, PACED_RATE, paced_seconds)
            _stop(spies)
            # Last (the queue decides this backlog after the measurement): answered once durable, not decided.
            later = await hammer(stack.url, stack.token, clients, n, "POST", "/v1/jobs", {"Prefer": "respond-async"})
            return ref1, sub, ref2, _cpu.per_job_ms(_cpu.spent(cpu0, cpu1), n), open_loop, later

        ref1, sub, ref2, cpu, open_loop, later = asyncio.run(measure())
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)
    bad = {s: c for s, c in [*sub[2].items(), *open_loop[2].items(), *later[2].items()] if s not in ACCEPTED}
    if bad:
        raise AssertionError(f"submits refused or failed: {bad}")
    got, refs = summary(sub[0], sub[1]), [summary(r[0], r[1]) for r in (ref1, ref2)]
    ref = min(refs, key=lambda s: s["p50_ms"])
    note = (f"{n} submits (command `true`) from {clients} keep-alive httpx clients to teto up's gateway, no "
            f"executors; p95 {got['p95_ms']:.1f} ms, max {got['max_ms']:.0f} ms; {sub[2].get(202, 0)} answered 202 "
            f"(outcome pending); reference: GET /healthz, same clients, same server (p99 {ref['p99_ms']:.1f} ms); "
            f"CPU ms per submit: {sum(cpu.values()):.1f} in all, {', '.join(f'{k} {v}' for k, v in cpu.items() if v)}; "
            f"load average {os.getloadavg()[0]:.1f}")

    def row(name: str, key: str, target: float, unit: str, at_most: bool, measured: dict = got,
            why: str = note) -> dict:
        figure = measured[key]
        return {"name": name, "figure": round(figure, 2), "reference": round(ref[key], 2),
                "ratio": round(figure / ref[key], 3) if ref[key] else None, "target": target, "unit": unit,
                "passed": figure <= target if at_most else figure >= target, "note": why}

    slow = summary(open_loop[0], open_loop[1])
    paced_row = {"name": f"submit: p50 at {PACED_RATE:.0f}/s paced", "figure": round(slow["p50_ms"], 2),
                 "reference": round(ref["p50_ms"], 2), "ratio": round(slow["p50_ms"] / ref["p50_ms"], 3),
                 "target": None, "unit": "ms", "passed": None,
                 "note": f"open loop: {len(open_loop[0])} submits due at {PACED_RATE:.0f}/s over {paced_seconds:.0f} s "
                         f"from the same {clients} clients, each timed from when it was due (a stack behind its "
                         f"schedule shows it); p95 {slow['p95_ms']:.1f} ms, p99 {slow['p99_ms']:.1f} ms, max "
                         f"{slow['max_ms']:.0f} ms: a submit's own latency, without the queueing of the closed "
                         f"loop above (where 32 are always in flight, so latency is 32 / rate)"}
    durable = summary(later[0], later[1])
    async_note = (f"Prefer: respond-async: {n} submits from the same {clients} clients answered 202 once durable in "
                  f"the command stream ({later[2].get(202, 0)} of {n}), not once decided (the queue decides them "
                  f"afterwards, at the rate of the rows above; GET /v1/commands/{{id}} reads each decision); "
                  f"{durable['rate']:.0f} a second, p95 {durable['p95_ms']:.1f} ms, max {durable['max_ms']:.0f} ms")
    return [row("submit: p50 latency", "p50_ms", TARGET_P50_MS, "ms", True),
            row("submit: p99 latency", "p99_ms", TARGET_P99_MS, "ms", True),
            row("submit: accepted rate", "rate", TARGET_RATE, "submits/s", False), paced_row,
            row("submit respond-async: p50 latency", "p50_ms", TARGET_P50_MS, "ms", True, durable, async_note),
            row("submit respond-async: p99 latency", "p99_ms", TARGET_P99_MS, "ms", True, durable, async_note)]


def main(quick: bool = False) -> list[dict]:
    return run(128, 32, paced_seconds=3.0) if quick else run(3_000, 32)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=3_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy collapsed stacks of the gateway and queue")
    parser.add_argument("--paced-seconds", type=float, default=15.0, help="length of the open-loop run (20/s)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = main(quick=True) if args.quick else run(args.n, args.clients, args.profile, args.paced_seconds)
    for r in rows:
        print(f"{r['name']}: {r['figure']} {r['unit']} (reference {r['reference']}, ratio {r['ratio']}; target "
              f"{r['target']}: {'-' if r['passed'] is None else 'pass' if r['passed'] else 'short'})")
    for note in dict.fromkeys(r["note"] for r in rows):  # the closed loop's (CPU per submit) and the open loop's
        print(note)
