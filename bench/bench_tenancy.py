"""Admission under tenancy at Kueue's published baseline shape: 30 organisations (Kueue: ClusterQueues) x 500
small jobs = 15,000 jobs, admitted with simulated executors; Kueue's reference is 15,000 workloads admitted in
351 s. The figure is the wall time until every job was admitted; ratio = reference / figure (above 1: faster).

What runs: the queue's tenancy planner (``services.queue.tenancy.placement.plan``: fair share, quotas with
borrowing in 3 cohorts of 10, budget reservations, a waiting reason for every job left queued, reclaim checks)
in passes over a fleet of 300 simulated single-GPU executors. Each admitted job runs for 1-3 passes (its length
drawn from a fixed seed), then its executor is free again and its budget reservation is settled with what it
used. The snapshot each pass sees is built from the simulation's own state, not read from PostgreSQL: this
measures the admission rules, not the database round trips of a placement pass (docs/tenancy.md).

Run: .venv/bin/python -m bench.bench_tenancy [--quick]
"""

from __future__ import annotations

import random
import sys
import time
from datetime import UTC, datetime, timedelta

from services.queue.tenancy import budget as budgets
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Node, Snapshot
from services.queue.tenancy.model import Cohort, GroupQuota, Organisation, Pending, Running

KUEUE_SECONDS = 351.0
KUEUE_WORKLOADS = 15_000
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def simulate(orgs_n: int = 30, jobs_per_org: int = 500, executors: int = 300, seed: int = 14) -> dict:
    rng = random.Random(seed)
    per_org = executors // orgs_n
    orgs = {f"org{i:02d}": Organisation(f"org{i:02d}", cohort=f"cohort{i % 3}", weight=1.0 + (i % 2),
                                        quotas={"sim": GroupQuota(per_org, borrowing_limit=per_org)},
                                        budget_gpu_seconds=10.0 ** 9) for i in range(orgs_n)}
    cohorts = {f"cohort{c}": Cohort(f"cohort{c}") for c in range(3)}
    pending = {f"{o}-j{k}": Pending(f"{o}-j{k}", o, T0 + timedelta(milliseconds=k * orgs_n + i), 1, 1,
                                    priority=rng.randrange(3), needs_gpu_seconds=600.0)
               for k in range(jobs_per_org) for i, o in enumerate(orgs)}
    accounts = {o: budgets.BudgetAccount(o, org.budget_gpu_seconds) for o, org in orgs.items()}
    running: dict[str, tuple[Running, int]] = {}  # job -> (run, passes left)
    admitted, passes, reasons = 0, 0, 0
    t0 = time.perf_counter()
    while pending or running:
        busy = {e for run, _ in running.values() for e in run.executors}
        nodes = [Node(f"e{i}", "sim", 1, free=f"e{i}" not in busy) for i in range(executors)]
        result = plan(Snapshot(orgs, nodes, list(pending.values()), [r for r, _ in running.values()], cohorts,
                               accounts))
        passes += 1
        reasons += len(result.waiting)
        assert all(w.reason for w in result.waiting.values()), "every waiting job has a reason"
        accounts = dict(result.budgets)
        for a in result.admitted:
            job = pending.pop(a.job_id)
            running[a.job_id] = (Running(a.job_id, a.org, a.group, a.devices, job.priority,
                                         T0 + timedelta(seconds=passes), a.workers), rng.randint(1, 3))
            admitted += 1
        for job_id, (run, left) in list(running.items()):  # one pass of simulated time
            if left <= 1:
                del running[job_id]
                accounts[run.org] = budgets.settle(accounts[run.org], job_id, rng.uniform(60.0, 600.0))
            else:
                running[job_id] = (run, left - 1)
        if passes > 100_000:
            raise RuntimeError("the simulation does not converge")
    return {"seconds": time.perf_counter() - t0, "admitted": admitted, "passes": passes, "reasons": reasons}


def main(quick: bool = False) -> dict:
    jobs_per_org = 50 if quick else 500
    sim = simulate(jobs_per_org=jobs_per_org)
    # Kueue's figure scaled to this run's size (quick runs a tenth of the jobs).
    reference = KUEUE_SECONDS * sim["admitted"] / KUEUE_WORKLOADS
    ratio = reference / sim["seconds"]
    print(f"tenancy: {sim['admitted']} jobs of 30 organisations admitted in {sim['seconds']:.1f} s over "
          f"{sim['passes']} passes ({sim['reasons']} waiting reasons given); Kueue {reference:.0f} s; "
          f"ratio {ratio:.1f}x", file=sys.stderr)
    return {"name": "tenancy_admission", "figure": round(sim["seconds"], 2), "reference": round(reference, 1),
            "ratio": round(ratio, 2), "target": 1.0, "unit": "s", "passed": ratio > 1.0,
            "note": f"{sim['admitted']} jobs, 30 orgs, 300 simulated executors, {sim['passes']} passes; "
                    "Kueue 15,000 workloads in 351 s (scaled when quick); planner only, no database"}


if __name__ == "__main__":
    print(main(quick="--quick" in sys.argv))
