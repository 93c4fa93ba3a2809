"""Heartbeat ingest by every consumer of heartbeats, each against a plain nats-py pull consumer draining the same
stream (fetch 500, ack each), measured in the same run (issue 12, item 3: target 0.5x).

The reference runs before and after the services, and the faster of the two counts (the stricter ratio). N
heartbeats from E simulated executors are published to the HB stream and N usage reports (one record each, the
budget's charge path; ``teto.usage.<executor>``) to the USAGE stream first, after each job's lease grant (a
``leased`` job event: the budget charges usage only within one) has been taken in by the budget and the health
service, the job events' consumers (a first, unmeasured run of each, which migrates its schema); then each consumer
drains its stream from the beginning, one at a time: the references, then the real services' durables (their own
declarations and handlers, libs/runtime/edge.py, on migrated schemas): the queue's, the health service's and the
budget's heartbeat consumers, and the budget's usage reports. A rate is the messages over the time from the
consumer's first delivery to its last acknowledgement (the budget's two durables in one run of the service,
concurrently, each timed from its own first delivery). A first row runs the edge alone with a handler that does
nothing: its share of each consumer's time. Before the edge, the queue fetched one message at a time (~440/s).

Run: .venv/bin/python -m bench.bench_ingest [N] [EXECUTORS], or ``teto bench ingest`` (``main``).
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta

from bench._drain import drained_by, gather_in_chunks, reference, row, service_rate
from bench._servers import servers
from libs.contracts.jobs import JobEvent, JobEventKind, JobState
from libs.contracts.telemetry import Heartbeat
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime.edge import Consumer, from_sender
from libs.runtime.service import Runtime
from libs.runtime.settings import CommonSettings
from libs.runtime.tasks import stop_tasks

PREFIX = "bench"


def heartbeats(subjects, n: int, executors: int):
    now = datetime.now(UTC)
    for i in range(n):
        ex = f"ex{i % executors}"
        yield subjects.heartbeat(ex), Heartbeat(executor_id=ex, node_id=f"n-{ex}", group="g", sent_at=now,
                                                interval_seconds=30, progress_interval_seconds=30)


# When every job's run began: a day ago, long enough for any series of ``usage_reports`` to fit in the time since.
def _run_start() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)


def grants(subjects, executors: int):
    """Each executor's job leased to it (epoch 1) when its run began, as the queue announces a grant: the budget
    charges a usage record only within its grant (services/budget/domain/grants.py). No submission is published,
    so each grant allows the one device per worker that ``usage_reports`` claims, and the jobs have no ceiling."""
    began = _run_start()
    for i in range(executors):
        ex = f"ex{i}"
        yield subjects.job_event(f"job-{ex}", "leased"), JobEvent(
            job_id=f"job-{ex}", seq=1, event=JobEventKind.LEASED, state=JobState.RUNNING,
            previous_state=JobState.QUEUED, epoch=1, executor_id=ex, time=began, detail={"workers": [ex]})


def usage_reports(subjects, n: int, executors: int):
    """One 30 s record per report, each executor's job a numbered series (charged once each, nothing conflicts),
    on one device, from the start of the run ``grants`` leased."""
    start = _run_start()
    for i in range(n):
        ex, seq = f"ex{i % executors}", i // executors + 1
        began = start + timedelta(seconds=30 * (seq - 1))
        rec = UsageRecord(job_id=f"job-{ex}", epoch=1, seq=seq, devices=1, wall_seconds=30.0, started_at=began,
                          ended_at=began + timedelta(seconds=30))
        yield subjects.usage(ex), UsageReport(executor_id=ex, node_id=f"n-{ex}", records=[rec])


async def edge_alone(rt: Runtime, stream: str) -> float:
    """Seconds the edge itself (fetch 500, decode, sender check, ack each) takes with a handler that does nothing:
    the ceiling of any heartbeat consumer built on it, to tell the edge's share from the handler's."""
    async def nothing(beats: list[Heartbeat]) -> None:
        return None

    await rt.consume([Consumer(rt.subjects.heartbeat_all, "HB", "bench-edge-noop", None, nothing, batch=500,
                               read=from_sender(Heartbeat.decode))])
    try:
        return await asyncio.wait_for(drained_by(rt.js, stream, "bench-edge-noop"), 900)
    finally:
        await stop_tasks(rt.tasks)
        rt.tasks.clear()
        await rt.stop_consuming()


async def run(n: int, executors: int) -> list[dict]:
    from services.budget.app import serve as budget
    from services.budget.settings import BudgetSettings
    from services.health.app import serve as health
    from services.health.settings import HealthSettings
    from services.queue.app import serve as queue
    from services.queue.settings import QueueSettings

    with servers() as (nats_url, pg_url):
        base = dict(nats_url=nats_url, database_url=pg_url, subject_prefix=PREFIX)
        rt = await Runtime.open("bench", CommonSettings.from_env(env={}, **base), schema=None, package=None)
        s, js = rt.subjects, rt.js
        hb, usage = s.stream_name("HB"), s.stream_name("USAGE")
        await gather_in_chunks(js.publish(subj, m.encode()) for subj, m in grants(s, executors))
        for serve, settings, durable in ((budget, BudgetSettings, "budget-job-events"),
                                         (health, HealthSettings, "health-job-events")):
            await service_rate(serve, settings.from_env(env={}, **base), js, [(s.stream_name("JOB"), durable)])
        await gather_in_chunks(js.publish(subj, m.encode()) for subj, m in heartbeats(s, n, executors))
        await gather_in_chunks(js.publish(subj, m.encode()) for subj, m in usage_reports(s, n, executors))
        refs = {hb: [await reference(js, s.heartbeat_all, hb, "bench-raw-hb-1", n)],
                usage: [await reference(js, s.usage_all, usage, "bench-raw-usage-1", n)]}
        note = f"{n} messages from {executors} executors; reference: nats-py pull, fetch 500, ack each, same stream"
        measured = [("ingest: edge alone, no-op handler", hb, await edge_alone(rt, hb))]
        for serve, settings, durables in (
                (queue, QueueSettings, [("ingest: queue heartbeats", hb, "queue-heartbeats")]),
                (health, HealthSettings, [("ingest: health heartbeats", hb, "health-heartbeats")]),
                (budget, BudgetSettings, [("ingest: budget heartbeats", hb, "budget-usage"),
                                          ("ingest: budget usage reports", usage, "budget-usage-reports")])):
            took = await service_rate(serve, settings.from_env(env={}, **base), js,
                                      [(stream, durable) for _, stream, durable in durables])
            measured += [(name, stream, t) for (name, stream, _), t in zip(durables, took, strict=True)]
        # The reference again after the services: on a shared machine one run of it can be disturbed; the
        # faster of the two is the reference (the stricter ratio).
        refs[hb].append(await reference(js, s.heartbeat_all, hb, "bench-raw-hb-2", n))
        refs[usage].append(await reference(js, s.usage_all, usage, "bench-raw-usage-2", n))
        rows = []
        for name, stream, seconds in measured:
            extra = (" (the edge's own ceiling, informational)" if "edge alone" in name
                     else " (budget: both consumers in one run, concurrently)" if "budget" in name else "")
            ref_rates = "/".join(f"{n / r:.0f}" for r in refs[stream])
            rows.append(row(name, n, seconds, min(refs[stream]), target=None if "edge alone" in name else 0.5,
                            note=f"{note}; reference runs before/after {ref_rates} msg/s, the faster used{extra}"))
        await rt.close()
    return rows


def main(quick: bool = False) -> list[dict]:
    return asyncio.run(run(2_000, 200) if quick else run(20_000, 2_000))


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    executors = int(sys.argv[2]) if len(sys.argv) > 2 else 2_000
    results = asyncio.run(run(n, executors))
    print(f"\ningest: {n} messages from {executors} executors, one server of each, this machine")
    print(f"{'consumer':34} {'msgs/s':>9} {'ref/s':>9} {'ratio':>6}  target")
    for r in results:
        target = "" if r["target"] is None else ">= 0.5 " + ("pass" if r["passed"] else "short")
        print(f"{r['name']:34} {r['figure']:9.0f} {r['reference']:9.0f} {r['ratio']:6.2f}  {target}")
