"""The budget's usage reports: CPU per report against a plain nats-py pull consumer's CPU per message, measured in the
same run (issue 12, item 3: what the usage consumer costs beyond the bus, which a loaded machine moves much less
than the rates ``bench_ingest`` compares).

N usage reports (``bench_ingest.usage_reports``: one 30 s record each, every executor's job a numbered series) are
published on the USAGE stream first, after each job's lease grant (``bench_ingest.grants``, a ``leased`` job event,
as the queue publishes it) has reached the budget: a first, unmeasured run of the service takes the grants in, so
that the measured run charges every report, as a stack does whose grants come before their usage. The reference, a
plain pull consumer (fetch 500, ack each), drains the stream once; then the real budget service (its own
declarations and handlers, in this process, on the schema its first run migrated) drains it into the ledger. For
each: the messages per second and the CPU seconds spent by this process, PostgreSQL (the postmaster with every
backend) and the NATS server, per message. The figure is the reference's CPU per message over the service's (the
share of the service's cost that is the bus's own); the wall-rate ratio, the split by process and the gen-2
collections the service's run saw are in the note. Every report must be in the ledger once.

Run: .venv/bin/python -m bench.bench_usage_cpu [N] [EXECUTORS], or ``teto bench usage_cpu`` (``main``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time

import asyncpg

from bench._cpu import parent, tree_spent
from bench._drain import gather_in_chunks, reference, service_rate
from bench._servers import servers
from bench.bench_audit import stack_cpu
from bench.bench_ingest import PREFIX, grants, usage_reports
from libs.runtime.service import Runtime
from libs.runtime.settings import CommonSettings


def _per_message(cpu: dict[str, float], n: int) -> tuple[float, str]:
    us = {k: v / n * 1e6 for k, v in cpu.items()}
    return sum(us.values()), ", ".join(f"{k} {v:.0f}" for k, v in sorted(us.items(), key=lambda kv: -kv[1]))


async def run(n: int, executors: int) -> dict:
    from services.budget.app import serve as budget
    from services.budget.settings import BudgetSettings

    with servers() as (nats_url, pg_url):
        base = dict(nats_url=nats_url, database_url=pg_url, subject_prefix=PREFIX)
        rt = await Runtime.open("bench", CommonSettings.from_env(env={}, **base), schema=None, package=None)
        s, js = rt.subjects, rt.js
        usage = s.stream_name("USAGE")
        settings = BudgetSettings.from_env(env={}, **base)
        # The grants in first, not measured (the service's schema is migrated here too): the usage stream is empty.
        await gather_in_chunks(js.publish(subj, m.encode()) for subj, m in grants(s, executors))
        await service_rate(budget, settings, js, [(s.stream_name("JOB"), "budget-job-events")])
        await gather_in_chunks(js.publish(subj, m.encode()) for subj, m in usage_reports(s, n, executors))
        probe = await asyncpg.connect(pg_url)
        postmaster = parent(await probe.fetchval("SELECT pg_backend_pid()"))
        cpu0 = stack_cpu(postmaster)
        ref_seconds = await reference(js, s.usage_all, usage, "bench-raw-usage", n)
        ref_cpu = tree_spent(cpu0, stack_cpu(postmaster))
        full = [0]  # gen-2 collections during the service's run

        def collected(phase: str, info: dict) -> None:
            full[0] += phase == "stop" and info["generation"] == 2

        gc.callbacks.append(collected)
        try:
            cpu0 = stack_cpu(postmaster)
            (seconds,) = await service_rate(budget, settings, js, [(usage, "budget-usage-reports")])
            service_cpu = tree_spent(cpu0, stack_cpu(postmaster))
        finally:
            gc.callbacks.remove(collected)
        rows = await probe.fetchval("SELECT count(*) FROM budget.ledger")
        held = await probe.fetchval("SELECT count(*) FROM budget.held_usage")
        await probe.close()
        await rt.close()
    (svc, svc_split), (ref, ref_split) = _per_message(service_cpu, n), _per_message(ref_cpu, n)
    return {"name": "usage reports: CPU per report, raw consumer / budget", "figure": ref / svc if svc else 0.0,
            "reference": ref, "ratio": ref / svc if svc else 0.0, "target": None, "unit": "x",
            "passed": rows == n and not held,
            "note": f"{n} reports from {executors} executors; CPU per message: budget {svc:.0f} us ({svc_split}), "
                    f"raw nats-py consumer {ref:.0f} us ({ref_split}); rates: budget {n / seconds:.0f} msg/s, raw "
                    f"{n / ref_seconds:.0f} msg/s ({ref_seconds / seconds:.2f}x); ledger rows {rows} of {n} "
                    f"({held} held); gen-2 collections during the budget's run {full[0]}; load average "
                    f"{os.getloadavg()[0]:.1f}"}


def main(quick: bool = False) -> dict:
    return asyncio.run(run(2_000, 200) if quick else run(20_000, 2_000))


if __name__ == "__main__":
    started = time.perf_counter()
    result = asyncio.run(run(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000,
                             int(sys.argv[2]) if len(sys.argv) > 2 else 2_000))
    print(f"{result['name']}: {result['figure']:.2f}\n{result['note']}\n({time.perf_counter() - started:.0f} s)")
