"""Placement at scale (issue 12, item 4): one placement pass with 10,000 queued jobs and 1,000 free executors,
against a bare ``SELECT ... LIMIT n FOR UPDATE SKIP LOCKED`` of the same candidates in the same run; the plan of
every statement of the pass; the queue service's memory at that scale.

What runs: the real ``services.queue.scheduler.Scheduler.place_once`` (the function the queue's placement loop
calls) on a real embedded PostgreSQL migrated with the queue's own migrations, holding the data set of
``bench/_placement_data.py`` (20 organisations in 2 cohorts, quotas in 4 node groups, 3 projects each, budgets
for a third of them, a few gangs, 5 % of the backlog placed before, 200 running jobs, 20,000 finished ones).
Only the NATS round trips of the pass are answered in process (``teto.rpc.budget.orgs`` and
``teto.rpc.budget.status``: every organisation and job consumed a little). Before each timed pass the jobs, their
events and the outbox are restored to the seeded state (untimed, then VACUUM ANALYZE), so every pass places the
same jobs: a pass of the default size (``max_jobs_per_pass`` 200) and one that considers the whole backlog
(10,000: every free executor can be filled in one pass). The placing process's collector is tuned as the queue
service tunes its own once ready (``libs/runtime/gctune.py``), and the collections within each pass are counted
and timed (``gc.callbacks``).

Plans: every statement one pass ran, EXPLAIN (ANALYZE, BUFFERS) in a rolled-back transaction on the restored
state, into the result's ``plans``; the benchmark fails (an exception, a ``short`` row) when one seq-scans the
jobs table. Memory: the real queue service (``python -m teto.cli service queue``) is started against the same
database and NATS and places the backlog by itself; its VmRSS and VmHWM (peak) are read from /proc once it has
filled every free executor (several passes), and its passes' durations from its log.

Run: .venv/bin/python -m bench.bench_placement [--quick] [--json PATH] (or ``teto bench placement``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from bench import _placement_data as data
from bench import _recording as rec
from bench._servers import servers
from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest, OrgBudgetReply, OrgBudgetRequest
from libs.runtime import db
from libs.runtime.gctune import tune_for_batches
from libs.runtime.service import Runtime
from services.queue import store
from services.queue.scheduler import Scheduler
from services.queue.settings import QueueSettings

PREFIX = "bench"
TARGET_MS = 100.0
TARGET_RSS_MB = 150.0


class _Reply:
    def __init__(self, data: bytes) -> None:
        self.data = data


class BudgetAnswers:
    """The NATS client of the pass, answering the budget's two requests in process (nothing else is asked)."""

    def __init__(self, settings: QueueSettings) -> None:
        self.subjects = settings.subjects
        self.asked = 0

    async def request(self, subject: str, payload: bytes, timeout: float) -> _Reply:  # noqa: ARG002
        self.asked += 1
        if subject == self.subjects.rpc_budget_orgs:
            req = OrgBudgetRequest.decode(payload)
            return _Reply(OrgBudgetReply(org_consumed={o: 3600.0 for o in req.orgs},
                                         job_consumed={j: 60.0 for j in req.jobs}).encode())
        if subject == self.subjects.rpc_budget_status:
            req = BudgetStatusRequest.decode(payload)
            return _Reply(BudgetStatusReply(job_id=req.job_id, known=True, consumed_seconds=60.0).encode())
        raise RuntimeError(f"the placement pass asked {subject}, which this benchmark does not answer")


async def _columns(conn) -> list[str]:  # noqa: ANN001
    rows = await conn.fetch("SELECT column_name FROM information_schema.columns WHERE table_schema = 'queue'"
                            " AND table_name = 'jobs' AND is_generated = 'NEVER' ORDER BY ordinal_position")
    return [r[0] for r in rows]


async def keep(conn) -> None:  # noqa: ANN001
    await conn.execute("CREATE TABLE public.bench_jobs AS SELECT * FROM queue.jobs WHERE state NOT IN"
                       " ('succeeded', 'failed', 'cancelled')")


async def restore(pool) -> None:  # noqa: ANN001
    """Back to the seeded state: every job a pass changed, no events, an empty outbox; then VACUUM ANALYZE."""
    async with pool.acquire() as conn:
        cols = [c for c in await _columns(conn) if c != "id"]
        async with conn.transaction():
            await conn.execute("TRUNCATE queue.job_events, queue.outbox")
            # Every executor heard from just now (the runs take longer than an executor may stay silent).
            await conn.execute("UPDATE queue.executors SET last_seen = clock_timestamp(), sent_at = clock_timestamp()")
            await conn.execute(
                f"UPDATE queue.jobs j SET ({', '.join(cols)}) = ({', '.join('b.' + c for c in cols)})"
                " FROM public.bench_jobs b WHERE j.id = b.id AND (j.event_seq <> b.event_seq"
                " OR j.waiting IS DISTINCT FROM b.waiting OR j.state <> b.state)")
        await conn.execute("VACUUM ANALYZE queue.jobs")
        await conn.execute("VACUUM ANALYZE queue.outbox")


async def reference_ms(pool, limit: int) -> float:  # noqa: ANN001
    """The bare candidate query of the pass: the same rows locked, nothing decided or written."""
    async with pool.acquire() as conn, conn.transaction():
        t0 = time.perf_counter()
        await conn.fetch(f"{store.SELECT_JOB} WHERE state = 'queued' ORDER BY created_at, id LIMIT $1"
                         " FOR UPDATE SKIP LOCKED", limit)
        return (time.perf_counter() - t0) * 1000


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class CollectorPauses:
    """Python's garbage collections while it is installed (``gc.callbacks``): how many, and their milliseconds."""

    def __init__(self) -> None:
        self.count, self.ms, self._t0 = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:  # noqa: ARG002
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.ms += (time.perf_counter() - self._t0) * 1000

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


async def passes(runtime: Runtime, settings: QueueSettings, rounds: int) -> dict:
    """``rounds`` timed passes from the same state, interleaved with the reference; medians and p95, and the
    garbage collections that ran within each pass."""
    scheduler = Scheduler(runtime, settings)
    took, cpu, refs, placed, collected = [], [], [], [], []
    for _ in range(rounds):
        await restore(runtime.pool)
        refs.append(await reference_ms(runtime.pool, settings.max_jobs_per_pass))
        with CollectorPauses() as pauses:
            t0, c0 = time.perf_counter(), time.process_time()
            placed.append(await scheduler.place_once())
            took.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)  # this process's CPU: the pass's Python, not PostgreSQL's
        collected.append((pauses.count, round(pauses.ms, 1)))
        print(f"placement: pass of {settings.max_jobs_per_pass} considered placed {placed[-1]} in {took[-1]:.0f} ms"
              f" ({cpu[-1]:.0f} ms CPU here, {collected[-1][0]} collections {collected[-1][1]} ms; reference"
              f" {refs[-1]:.1f} ms, load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    return {"median_ms": statistics.median(took), "p95_ms": _pct(took, 0.95), "all_ms": [round(t, 1) for t in took],
            "cpu_median_ms": statistics.median(cpu), "cpu_all_ms": [round(c, 1) for c in cpu],
            "reference_ms": statistics.median(refs), "placed": placed, "collections": collected,
            "load": os.getloadavg()[0]}


async def plans(runtime: Runtime, settings: QueueSettings, index_paths: bool = False) -> tuple[list[dict], int]:
    """Every statement of one pass, explained on the state that pass saw; and how many round trips the pass made
    (statements sent, a pipelined ``executemany`` one; the transaction's BEGIN and COMMIT not counted).
    ``index_paths`` (--quick's few thousand rows, where PostgreSQL rightly seq-scans for the grants' UPDATE of a
    few hundred): explained with seq scans priced out, so only a statement with no usable index shows one."""
    recording = rec.Recording(runtime.pool)
    await restore(runtime.pool)
    await Scheduler(Runtime(runtime.name, settings, recording, runtime.nc, None), settings).place_once()
    await restore(runtime.pool)
    async with runtime.pool.acquire() as conn:
        return await rec.explain(conn, recording.statements, index_paths=index_paths), len(recording.calls)


def _row(name: str, r: dict, settings: QueueSettings, counts: dict, note: str = "") -> dict:
    return {"name": name, "figure": round(r["median_ms"], 1), "reference": round(r["reference_ms"], 2),
            "ratio": round(r["median_ms"] / r["reference_ms"], 1), "target": TARGET_MS, "unit": "ms",
            "passed": r["median_ms"] <= TARGET_MS,
            "note": f"median of {len(r['all_ms'])} passes (p95 {r['p95_ms']:.0f} ms, all {r['all_ms']}; median CPU "
                    f"of the placing process {r['cpu_median_ms']:.0f} ms; garbage collections within each pass, "
                    f"count and ms: {r['collections']}), "
                    f"max_jobs_per_pass {settings.max_jobs_per_pass}, placed {r['placed'][-1]} per pass; "
                    f"{counts['queued']} queued ({counts['gangs']} gangs), {counts['executors'] - counts['busy']} "
                    f"free of {counts['executors']} executors, {counts['finished']} finished jobs; reference: bare "
                    f"SELECT .. LIMIT {settings.max_jobs_per_pass} FOR UPDATE SKIP LOCKED of the same rows "
                    f"(ratio = pass / reference); load average {r['load']:.1f}{note}"}


async def run(sizes: data.Sizes, rounds: int, *, service: bool = True, out: Path | None = None,
              index_paths: bool = False) -> list[dict]:
    from bench._placement_rss import service_rss

    with servers() as (nats_url, pg_url):
        base = dict(nats_url=nats_url, database_url=pg_url, subject_prefix=PREFIX)
        settings = QueueSettings.from_env(env={}, **base)
        # The pool as the queue service opens it (Runtime.open): connections returned without asyncpg's reset.
        pool = await db.create_pool(pg_url, max_size=4, reset=db.rollback_only)
        await db.migrate(pool, store.SCHEMA, "services.queue")
        async with pool.acquire() as conn:
            now = await conn.fetchval("SELECT clock_timestamp()")
            counts = await data.seed(conn, now - timedelta(seconds=1), sizes)
            await keep(conn)
        runtime = Runtime("queue", settings, pool, BudgetAnswers(settings), None)  # type: ignore[arg-type]
        # The collector as the queue service has it once ready (services/queue/app.py): start-up and the seeding
        # frozen out of collections, the youngest generation collected after 20,000 net allocations.
        # Put back afterwards: ``teto bench`` runs the other benchmarks in this process.
        thresholds = tune_for_batches()
        rows, detail = [], {"counts": counts}
        try:
            for per_pass in (200, sizes.queued):
                s = settings.model_copy(update={"max_jobs_per_pass": per_pass})
                runtime.settings = s
                r = await passes(runtime, s, rounds if per_pass == 200 else max(2, rounds // 2 + 1))
                detail[f"passes_{per_pass}"] = r
                rows.append(_row(f"placement pass, {per_pass} considered", r, s, counts))
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
        runtime.settings = settings
        explained, sent = await plans(runtime, settings, index_paths)
        detail["plans"], detail["statements_per_pass"] = explained, sent
        scans = [p for p in explained if p["seq_scan_jobs"]]
        rows[0]["note"] += (f"; {sent} statements a pass (BEGIN and COMMIT besides), {len(explained)} distinct "
                            f"explained, {len(scans)} seq-scan the jobs table")
        if service:
            await restore(pool)
            rss = await service_rss(settings, pg_url, pool, sizes)
            detail["service"] = rss
            rows.append({"name": "queue service RSS at that scale", "figure": rss["rss_mb"], "reference": None,
                         "ratio": None, "target": TARGET_RSS_MB, "unit": "MB",
                         "passed": rss["rss_mb"] <= TARGET_RSS_MB,
                         "note": f"python -m teto.cli service queue placed {rss['placed']} jobs in "
                                 f"{rss['passes']} passes ({rss['seconds']:.1f} s); VmRSS then, VmHWM (peak) "
                                 f"{rss['hwm_mb']} MB; load average {rss['load']:.1f}"})
        await pool.close()
    if out is not None:
        out.write_text(json.dumps({"rows": rows, **detail}, indent=1, default=str))
    if scans:  # the plans are the point: a seq scan over the jobs table is a failure, whatever the speed
        raise AssertionError("seq scan over queue.jobs in: " + " | ".join(p["query"][:200] for p in scans))
    return rows


def main(quick: bool = False) -> list[dict]:
    sizes = data.Sizes(queued=1_000, free=100, busy=20, finished=2_000, orgs=6) if quick else data.Sizes()
    out = Path(os.environ.get("TETO_BENCH_PLACEMENT_JSON", "bench-placement.json"))
    return asyncio.run(run(sizes, 3 if quick else 5, out=out, index_paths=quick))


if __name__ == "__main__":
    args = sys.argv[1:]
    path = Path(args[args.index("--json") + 1]) if "--json" in args else Path("bench-placement.json")
    os.environ["TETO_BENCH_PLACEMENT_JSON"] = str(path)
    for row in main(quick="--quick" in args):
        print(f"{row['name']}: {row['figure']} {row['unit']} (reference {row['reference']}, ratio {row['ratio']}, "
              f"target {row['target']}): {'pass' if row['passed'] else 'short'}\n  {row['note']}")
    print(f"plans and passes: {path}")
