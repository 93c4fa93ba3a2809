"""Outbox relay throughput against the reference of publishing the same messages straight to JetStream,
each ack awaited in turn (what the relay did before it sent a wave of rows before awaiting their acks), measured
in the same run, with this process's CPU per message for both (the machine's load moves it less than msg/s).
The events are about 50 jobs in turn, so a relay batch of 500 is 10 waves (``libs/runtime/outbox_order``).

Run: .venv/bin/python -m bench.bench_outbox [N], or through ``teto bench outbox`` (``main``).
"""

from __future__ import annotations

import asyncio
import sys
import time

from bench.bench_executor_cpu import cpu_seconds

from bench._servers import servers
from libs.contracts.jobs import JobEvent, JobEventKind, JobState
from libs.contracts.subjects import Subjects
from libs.runtime import bus, db, outbox


def _events(n: int) -> list[JobEvent]:
    return [JobEvent(job_id=f"j{i % 50}", seq=i + 1, event=JobEventKind.CHECKPOINTED, state=JobState.RUNNING)
            for i in range(n)]


async def run(n: int) -> dict:
    with servers() as (nats_url, pg_url):
        nc = await bus.connect(nats_url, "bench")
        js = nc.jetstream()
        subjects = Subjects("bench")
        await bus.ensure_streams(js, subjects)
        pool = await db.create_pool(pg_url)
        await db.migrate(pool, "bench", "libs.runtime")

        events = _events(n)
        c0, t0 = cpu_seconds()[0], time.perf_counter()
        for e in events:
            await js.publish(subjects.job_event(e.job_id, e.event), e.encode(), headers={"Nats-Msg-Id": "r" + e.id})
        reference, ref_cpu = time.perf_counter() - t0, cpu_seconds()[0] - c0

        t0 = time.perf_counter()
        async with pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, "bench", [(subjects.job_event(e.job_id, e.event), e) for e in _events(n)])
        staged = time.perf_counter() - t0
        relay = outbox.OutboxRelay(pool, "bench", js)
        c0, t0 = cpu_seconds()[0], time.perf_counter()
        while await relay.relay_once():
            pass
        relayed, relay_cpu = time.perf_counter() - t0, cpu_seconds()[0] - c0
        await pool.close()
        await nc.close()
    return {"name": "outbox relay", "figure": n / relayed, "reference": n / reference, "ratio": reference / relayed,
            "target": None, "unit": "msg/s", "passed": None,
            "note": f"{n} messages; reference: JetStream publish, ack each in turn; staging {n / staged:.0f} rows/s;"
                    f" CPU of this process per message: relay {relay_cpu / n * 1e6:.0f} us, reference"
                    f" {ref_cpu / n * 1e6:.0f} us"}


def main(quick: bool = False) -> dict:
    return asyncio.run(run(500 if quick else 5000))


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    r = asyncio.run(run(n))
    print(f"messages: {n}")
    print(f"reference  JetStream publish, ack each in turn: {r['reference']:9.0f} msg/s")
    print(f"outbox     relay (publish + mark published):    {r['figure']:9.0f} msg/s")
    print(f"ratio relay / reference: {r['ratio']:.2f}  (1.0 = as fast as publishing directly)  {r['note']}")
