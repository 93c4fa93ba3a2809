"""The executor's CPU per job (issue 12, item 1): one real agent (agents.executor.main.serve on an embedded NATS
and PostgreSQL, its run cgroup on, heartbeat 5 s as ``teto up`` runs it in bench_throughput) runs N trivial
``command`` jobs (``true``) one after another, granted by this process, which plays the queue (the grant, the
lease renewals, reading the progress). Measured from the kernel's accounting, so the machine's load moves it
little: this process's CPU time per job (the agent, with the queue's stand-in: a few messages a job) and its
children's (the agent's run guard, read live from /proc as it lives as long as the agent, with the jobs'
processes it reaped), against the CPU of starting and reaping one bare ``true`` from the same process (the
reference). The note also counts the messages the job causes on the bus, by
subject (the agent's and the stand-in's, JetStream acknowledgements and API calls included).

This is the executors' part of bench_throughput's "CPU ms per job by part" with nothing else running, so a
change to the agent's run path can be measured in seconds rather than with the whole stack.

Run: .venv/bin/python -m bench.bench_executor_cpu [N], or ``teto bench executor_cpu``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.runtime import bus

from bench import _cpu
from bench._servers import servers
from bench.bench_agent_overhead import AgentArm

TRUE = shutil.which("true") or "/bin/true"
WARMUP_JOBS = 5


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, its children's: those reaped, and the agent's live run guard with the jobs it
    reaped; the guard lives as long as the agent, so its CPU is read from /proc, not from the reaped total)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime + _cpu.children_cpu(os.getpid(), _cpu.RUN_GUARD)


def kind(subject: str, prefix: str) -> str:
    """A subject without its ids: the prefix, ``$JS.ACK`` and ``$JS.API`` details and inboxes folded (pure)."""
    if subject.startswith("_INBOX."):
        return "_INBOX (replies)"
    if subject.startswith("$JS.ACK."):
        return "$JS.ACK (acknowledgements)"
    if subject.startswith("$JS.API."):
        return "$JS.API." + subject.split(".")[2]
    words = subject.removeprefix(prefix + ".").split(".")
    if words[0] == "rpc":
        return ".".join(words[:2])
    return words[0] + (f".*.{words[-1]}" if words[0] == "agent" and len(words) > 2 else "")


async def _bare(n: int) -> float:
    c0 = cpu_seconds()
    for _ in range(n):
        proc = await asyncio.create_subprocess_exec(TRUE)
        await proc.wait()
    c1 = cpu_seconds()
    return (c1[0] - c0[0] + c1[1] - c0[1]) / n


async def _jobs(nats_url: str, pg_url: str, n: int) -> tuple[float, float, float, Counter, str]:
    data = Path(tempfile.mkdtemp(prefix="teto-bench-cpu-"))
    prefix = "b" + uuid.uuid4().hex[:8]
    settings = ExecutorSettings.from_env(env={}, nats_url=nats_url, database_url=pg_url, subject_prefix=prefix,
                                         data_dir=data, executor_id=f"ex-{uuid.uuid4().hex[:6]}",
                                         heartbeat_seconds=5.0, lease_seconds=30.0, workload_cgroup=True)
    seen: Counter = Counter()
    counting = False

    async def count(msg) -> None:
        if counting:
            seen[kind(msg.subject, prefix)] += 1

    spy = await bus.connect(nats_url, "bench-spy")
    await spy.subscribe(">", cb=count)
    try:
        async with AgentArm(settings) as arm:
            for i in range(WARMUP_JOBS + n):
                if i == WARMUP_JOBS:
                    await spy.flush()
                    counting, c0, t0 = True, cpu_seconds(), time.perf_counter()
                await _one(arm)
            c1, took = cpu_seconds(), time.perf_counter() - t0
            await spy.flush()
            counting = False
    finally:
        await spy.close()
        shutil.rmtree(data, ignore_errors=True)
    return (c1[0] - c0[0]) / n, (c1[1] - c0[1]) / n, took / n, seen, prefix


async def _one(arm: AgentArm) -> None:
    s, job = arm.settings, uuid.uuid4().hex
    arm.finished[job] = asyncio.get_running_loop().create_future()
    grant = RunJob(job_id=job, epoch=1, executor_id=s.executor_id, attempt=1,
                   spec=JobSpec(workload=CommandWorkload(command=[TRUE]), gpu_ceiling_seconds=10**6),
                   lease_seconds=s.lease_seconds, heartbeat_seconds=s.heartbeat_seconds)
    await bus.publish(arm.js, s.subjects.agent(s.executor_id, "run"), grant)
    done = await asyncio.wait_for(arm.finished[job], 60)
    if done.exit_code != 0:
        raise AssertionError(f"a trivial job failed under the agent: {done.outcome} {done.error}")
    await asyncio.sleep(0.05)  # the agent clears its run just after reporting it finished


def run(n: int) -> dict:
    started = time.monotonic()
    with servers() as (nats_url, pg_url):
        loop = asyncio.new_event_loop()  # not asyncio.run: see bench_overshoot (the agent's fetch may linger)
        try:
            bare = loop.run_until_complete(_bare(max(20, n // 4)))
            own, kids, seconds, seen, _ = loop.run_until_complete(_jobs(nats_url, pg_url, n))
        finally:
            with contextlib.suppress(Exception):
                loop.close()
    total = (own + kids) * 1e3
    messages = sum(seen.values()) / n
    by_kind = ", ".join(f"{k} {v / n:.1f}" for k, v in seen.most_common())
    return {"name": "executor CPU per job", "figure": round(total, 1), "reference": round(bare * 1e3, 2),
            "ratio": round(total / (bare * 1e3), 1), "target": None, "unit": "CPU ms/job", "passed": None,
            "note": (f"{n} trivial jobs (true) one after another on one agent (run cgroup on, heartbeat 5s); "
                     f"agent process (with the queue's stand-in) {own * 1e3:.1f} ms, run guard + job "
                     f"{kids * 1e3:.1f} ms; reference: one bare true started and reaped from asyncio; "
                     f"{seconds * 1e3:.0f} ms a job end to end; messages on the bus per job {messages:.1f}: "
                     f"{by_kind}; {time.monotonic() - started:.0f}s")}


def main(quick: bool = False) -> dict:
    return run(20) if quick else run(200)


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
