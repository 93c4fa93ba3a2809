"""Agent overhead on training step time (issue 12, item 6): the same training script (bench/_tiny_train.py: a
tiny MLP on CPU, one thread, a few hundred steps, each step timed by the script) run under a real executor agent
(agents.executor.main.serve: its report pipe, ``teto.sdk.report_step`` every step, which the SDK writes at
most 4 times a second, heartbeats and progress messages to a real embedded NATS) and without it (a plain
subprocess, no ``TETO_*`` environment: the SDK calls do nothing), A/B interleaved with the order alternating,
several rounds.

Each run's figure is its median step time after a warm-up; each round's overhead is (with / without - 1). The
figure is the median overhead over the rounds in percent, with its spread in the note; the reference is the
median step time without the agent. When the rounds spread over more than ten times the target the row has no
verdict (``passed`` None): the noise decides the median then. On a shared machine the rounds' spread is other
processes' noise, so the note also gives figures that noise moves far less: the overhead in the training
thread's CPU time per step (with against without, same rounds), the ``report_step`` call's own time inside the
step (what the training thread pays), and the agent's CPU time per step (what it takes from the machine's
cores, the run's start and finish included; the agent runs in this process, which otherwise only waits).

The agent runs with a 1 s heartbeat (30 s by default), so heartbeats are 30 times as frequent as in production:
a pessimistic setting. The benchmark plays the queue: it renews the lease.

Run: .venv/bin/python -m bench.bench_agent_overhead [--quick] [--rounds N] [--steps N] [--no-cgroup], or
``teto bench agent_overhead``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from agents.executor.main import serve
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.leases import LeaseRenewReply
from libs.contracts.telemetry import RunFinished
from libs.runtime import bus

from bench._latency import spread
from bench._servers import servers

SCRIPT = Path(__file__).resolve().parent / "_tiny_train.py"
TARGET_PERCENT = 1.0
WARMUP_STEPS = 20
HEARTBEAT = 1.0


def step_time(times: list[float]) -> float:
    """A run's step time: the median after the warm-up steps (allocator and caches settling)."""
    return statistics.median(times[WARMUP_STEPS:] if len(times) > 2 * WARMUP_STEPS else times)


def overhead_percent(with_agent: float, without: float) -> float:
    return (with_agent / without - 1.0) * 100.0


def verdict(median: float, low: float, high: float, target: float = TARGET_PERCENT) -> bool | None:
    """Pass or short against the target, or None (no verdict) when the rounds spread over more than ten times the
    target: other processes' noise then decides the median, not the agent."""
    if high - low > 10 * target:
        return None
    return median <= target


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}


def read_run(out: Path) -> tuple[float, float, float]:
    """(step time, median ``report_step`` time, step CPU time) of one run's file."""
    data = json.loads(out.read_text())
    return step_time(data["steps"]), step_time(data["report"]), step_time(data["cpu"])


def without_agent(steps: int, out: Path) -> tuple[float, float, float, float]:
    subprocess.run([sys.executable, str(SCRIPT), str(steps), str(out)], env=_plain_env(), check=True, timeout=600)
    return (*read_run(out), 0.0)


class AgentArm:
    """A real agent on the embedded NATS; ``run`` grants it the script and waits for the run to finish."""

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.finished: dict[str, asyncio.Future] = {}

    async def __aenter__(self) -> AgentArm:
        s = self.settings
        self.nc = await bus.connect(s.nats_url, "bench")
        self.js = self.nc.jetstream()

        async def on_renew(msg) -> None:
            await msg.respond(LeaseRenewReply(ok=True).encode())

        async def on_progress(msg) -> None:
            if b'"finished"' in msg.data:
                done = RunFinished.decode(msg.data)
                fut = self.finished.get(done.job_id)
                if fut is not None and not fut.done():
                    fut.set_result(done)

        self.subs = [await self.nc.subscribe(s.subjects.rpc_lease_renew, cb=on_renew),
                     await self.nc.subscribe(s.subjects.progress_all, cb=on_progress)]
        ready = asyncio.Event()
        self.agent = asyncio.create_task(serve(s, ready=ready))
        await asyncio.wait_for(ready.wait(), 60)
        return self

    async def run(self, steps: int, out: Path) -> tuple[float, float, float, float]:
        """(step time, report_step time, step CPU time, this process's CPU seconds per step while the run ran)."""
        s, job = self.settings, uuid.uuid4().hex
        cpu0 = time.process_time()
        self.finished[job] = asyncio.get_running_loop().create_future()
        command = [sys.executable, str(SCRIPT), str(steps), str(out)]
        grant = RunJob(job_id=job, epoch=1, executor_id=s.executor_id, attempt=1,
                       spec=JobSpec(workload=CommandWorkload(command=command), gpu_ceiling_seconds=10**6),
                       lease_seconds=s.lease_seconds, heartbeat_seconds=s.heartbeat_seconds)
        await bus.publish(self.js, s.subjects.agent(s.executor_id, "run"), grant)
        done = await asyncio.wait_for(self.finished[job], 600)
        if done.exit_code != 0:
            raise AssertionError(f"the training run under the agent failed: {done.outcome} {done.error}")
        if done.last_step != steps:
            raise AssertionError(f"the agent heard of step {done.last_step}, not {steps}")
        return (*read_run(out), (time.process_time() - cpu0) / steps)

    async def __aexit__(self, *exc) -> None:
        for sub in self.subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await self.nc.close()
        self.agent.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self.agent), 15)


Arm = tuple[float, float, float, float]  # step time, report_step time, step CPU time, agent CPU per step


async def _rounds(nats_url: str, pg_url: str, rounds: int, steps: int, cgroup: bool) -> list[tuple[Arm, Arm]]:
    data = Path(tempfile.mkdtemp(prefix="teto-bench-agent-"))
    os.chmod(data, 0o777)  # the run writes its step times here
    settings = ExecutorSettings.from_env(
        env={}, nats_url=nats_url, database_url=pg_url, subject_prefix="b" + uuid.uuid4().hex[:8], data_dir=data,
        executor_id=f"ex-{uuid.uuid4().hex[:6]}", heartbeat_seconds=HEARTBEAT, lease_seconds=6.0,
        workload_cgroup=cgroup)
    pairs = []
    async with AgentArm(settings) as arm:
        loop = asyncio.get_running_loop()
        for i in range(rounds):
            out_a, out_b = data / f"with-{i}.json", data / f"without-{i}.json"
            if i % 2 == 0:
                a = await arm.run(steps, out_a)
                b = await loop.run_in_executor(None, without_agent, steps, out_b)
            else:
                b = await loop.run_in_executor(None, without_agent, steps, out_b)
                a = await arm.run(steps, out_a)
            print(f"round {i + 1}: with agent {a[0] * 1e3:.3f} ms/step, without {b[0] * 1e3:.3f} ms/step, "
                  f"overhead {overhead_percent(a[0], b[0]):+.2f} %; report_step {a[1] * 1e6:.1f} us with the agent, "
                  f"{b[1] * 1e6:.1f} us without; step CPU {a[2] * 1e3:.3f} / {b[2] * 1e3:.3f} ms; agent CPU "
                  f"{a[3] * 1e6:.0f} us/step", file=sys.stderr, flush=True)
            pairs.append((a, b))
    return pairs


def run(rounds: int, steps: int, cgroup: bool = True) -> dict:
    started = time.monotonic()
    with servers() as (nats_url, pg_url):
        loop = asyncio.new_event_loop()  # not asyncio.run: see bench_overshoot (the agent's fetch may linger)
        try:
            pairs = loop.run_until_complete(_rounds(nats_url, pg_url, rounds, steps, cgroup))
        finally:
            with contextlib.suppress(Exception):
                loop.close()
    overheads = [overhead_percent(a[0], b[0]) for a, b in pairs]
    med, low, high = spread(overheads)
    with_ms, without_ms = (statistics.median(arm[0] for arm in x) * 1e3 for x in zip(*pairs, strict=True))
    report_us = statistics.median(a[1] for a, _ in pairs) * 1e6
    agent_us = statistics.median(a[3] for a, _ in pairs) * 1e6
    cpu_med, cpu_low, cpu_high = spread([overhead_percent(a[2], b[2]) for a, b in pairs])
    load = os.getloadavg()[0]
    return {"name": "agent overhead", "figure": round(med, 3), "reference": round(without_ms, 3),
            "ratio": round(with_ms / without_ms, 4), "target": TARGET_PERCENT, "unit": "% step time",
            "passed": verdict(med, low, high),
            "note": (f"{rounds} rounds A/B interleaved, {steps} steps each (median after {WARMUP_STEPS}); overhead "
                     f"median {med:+.2f} % [{low:+.2f}..{high:+.2f}]; step {with_ms:.3f} ms with the agent "
                     f"(heartbeat {HEARTBEAT:g}s, report_step every step: the SDK writes at most 4 lines a "
                     f"second; run cgroup {'on' if cgroup else 'off'}), {without_ms:.3f} ms without (reference); "
                     f"training thread's CPU time per step "
                     f"{cpu_med:+.2f} % "
                     f"[{cpu_low:+.2f}..{cpu_high:+.2f}]; report_step {report_us:.1f} us per step inside the step "
                     f"({report_us / 10 / without_ms:.3f} %), agent CPU {agent_us:.0f} us per step "
                     f"({agent_us / 10 / without_ms:.2f} % of a core's step); load average {load:.1f}; "
                     f"{time.monotonic() - started:.0f}s")}


def main(quick: bool = False) -> dict:
    return run(2, 60) if quick else run(7, 400)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--no-cgroup", action="store_true", help="runs without their own cgroup (the default: with)")
    args = parser.parse_args()
    print(main(quick=True) if args.quick else run(args.rounds, args.steps, not args.no_cgroup))
