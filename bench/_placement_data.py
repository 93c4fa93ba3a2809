"""The fleet and backlog of the placement benchmark, inserted in bulk straight into the queue's migrated tables.

Shape (sizes scale with ``Sizes``): organisations in two cohorts (reclaim_borrowed), each with three projects,
quotas in four node groups and, for a third of them, a monthly GPU-second budget (so a pass asks the budget
service); queued jobs of every organisation and project with mixed priorities and GPU needs, a few gangs, and
some placed before (lease_epoch > 0: the pass asks what they consumed); jobs running on busy executors (each
held against its organisation's quota); a history of finished jobs, as a jobs table that has run for a while
holds; executors that sent a heartbeat just now, each on a node the health service reports schedulable.
Rows are written as the queue writes them (``store.job_from_row`` reads every one back in the benchmark).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.tenancy import OrgSpec, QuotaSpec

GROUPS = ("g-a100", "g-h100", "g-l4", "g-cpu")
GPUS = {"g-a100": 8, "g-h100": 8, "g-l4": 1, "g-cpu": 0}
GROUP_SHARE = (0.25, 0.25, 0.3, 0.2)  # of the executors


@dataclass(frozen=True)
class Sizes:
    queued: int = 10_000
    free: int = 1_000
    busy: int = 200
    finished: int = 20_000
    orgs: int = 20


def org_name(i: int) -> str:
    return f"org{i:02d}"


def org_spec(i: int, sizes: Sizes) -> OrgSpec:
    per = max(1, (sizes.free + sizes.busy) // sizes.orgs)
    quotas = {g: QuotaSpec(nominal=per * max(1, GPUS[g]) // 2, borrowing_limit=per * max(1, GPUS[g]))
              for g in GROUPS}
    return OrgSpec(cohort=f"cohort{i % 2}", weight=1.0 + (i % 3), quotas=quotas,
                   budget_gpu_seconds=1e9 if i % 3 == 0 else None)


def _group_of(i: int, n: int) -> str:
    edge = 0.0
    for g, share in zip(GROUPS, GROUP_SHARE, strict=True):
        edge += share
        if i < edge * n:
            return g
    return GROUPS[-1]


def _spec(rng: random.Random, project: str, priority: int, gang: bool) -> JobSpec:
    gpus = rng.choice((0, 1, 1, 1, 8, 8))
    return JobSpec(workload=CommandWorkload(command=["true"]), workers=rng.choice((2, 4)) if gang else 1,
                   gpus_per_worker=gpus, gpu_ceiling_seconds=rng.choice((600.0, 3600.0, 36_000.0)),
                   project=project, priority=priority)


async def seed(conn: asyncpg.Connection, now: datetime, sizes: Sizes, seed_value: int = 12) -> dict:
    """Insert the whole data set; returns counts for the notes."""
    rng = random.Random(seed_value)
    orgs = [org_name(i) for i in range(sizes.orgs)]
    await conn.executemany(
        "INSERT INTO queue.cohorts (name, preemption, updated_by, updated_at) VALUES ($1, 'reclaim_borrowed',"
        " 'bench', $2)", [(f"cohort{c}", now) for c in range(2)])
    await conn.executemany(
        "INSERT INTO queue.orgs (name, spec, updated_by, updated_at) VALUES ($1, $2::jsonb, 'bench', $3)",
        [(o, org_spec(i, sizes).model_dump_json(), now) for i, o in enumerate(orgs)])
    await conn.executemany(
        "INSERT INTO queue.projects (org, name, spec, updated_by, updated_at) VALUES ($1, $2, '{}'::jsonb,"
        " 'bench', $3)", [(o, p, now) for o in orgs for p in ("default", "vision", "llm")])
    # Executors: the busy ones first (they hold the running jobs), all seen just now, all on schedulable nodes.
    n_exec = sizes.free + sizes.busy
    executors = [(f"ex{i:05d}", _group_of(i, n_exec)) for i in range(n_exec)]
    await conn.execute(
        "INSERT INTO queue.executors (executor_id, node_id, group_name, gpus, accepting, job_id, epoch, phase,"
        " sent_at, last_seen, address) SELECT e, 'node-' || e, g, gp, true, j, ep, ph, $5, $5, '10.0.0.1'"
        " FROM unnest($1::text[], $2::text[], $3::int[], $4::text[]) AS x(e, g, gp, j),"
        " LATERAL (SELECT CASE WHEN j IS NULL THEN NULL ELSE 1 END AS ep,"
        "                 CASE WHEN j IS NULL THEN 'idle' ELSE 'running' END AS ph) AS y",
        [e for e, _ in executors], [g for _, g in executors], [GPUS[g] for _, g in executors],
        [f"run{i:05d}" if i < sizes.busy else None for i in range(n_exec)], now)
    await conn.execute(
        "INSERT INTO queue.nodes (node_id, executor_id, group_name, state, schedulable, reason, seq)"
        " SELECT 'node-' || executor_id, executor_id, group_name, 'ready', true, NULL, 1 FROM queue.executors")
    rows = []

    def job(job_id: str, state: str, spec: JobSpec, org: str, created: datetime, *, epoch: int = 0,
            workers: tuple[str, ...] = (), group: str | None = None, devices: int = 0) -> None:
        rows.append((job_id, spec.name, f"user-{org}", state, spec.model_dump_json(), "[]", epoch, epoch,
                     workers[0] if workers else None, list(workers),
                     now + timedelta(minutes=3) if state == "running" else None, created, created + timedelta(
                         seconds=1), org, spec.project, spec.priority, group, devices))

    start = now - timedelta(days=2)
    for i in range(sizes.finished):
        org = orgs[i % len(orgs)]
        job(f"done{i:06d}", rng.choice(("succeeded", "succeeded", "failed", "cancelled")),
            _spec(rng, "default", 0, False), org, start + timedelta(seconds=i))
    for i in range(sizes.busy):
        ex, group = executors[i]
        org = orgs[i % len(orgs)]
        job(f"run{i:05d}", "running", _spec(rng, "default", rng.randrange(3), False), org,
            now - timedelta(hours=1, seconds=i), epoch=1, workers=(ex,), group=group, devices=max(1, GPUS[group]))
    gangs = 0
    for i in range(sizes.queued):
        org = orgs[rng.randrange(len(orgs))]
        gang = i % 250 == 7
        gangs += gang
        job(f"q{i:06d}", "queued", _spec(rng, rng.choice(("default", "vision", "llm")), rng.choice((0, 0, 1, 5)),
                                         gang), org, now - timedelta(minutes=30) + timedelta(milliseconds=i * 100),
            epoch=1 if i % 20 == 3 else 0)
    await conn.copy_records_to_table(
        "jobs", schema_name="queue", records=rows,
        columns=["id", "name", "owner", "state", "spec", "attempts", "attempt_number", "lease_epoch",
                 "executor_id", "workers", "lease_expires_at", "created_at", "updated_at", "org", "project",
                 "priority", "node_group", "devices"])
    await conn.execute("ANALYZE queue.jobs; ANALYZE queue.executors; ANALYZE queue.nodes")
    return {"orgs": len(orgs), "executors": n_exec, "queued": sizes.queued, "gangs": gangs, "busy": sizes.busy,
            "finished": sizes.finished, "placed_before": sum(1 for i in range(sizes.queued) if i % 20 == 3)}
