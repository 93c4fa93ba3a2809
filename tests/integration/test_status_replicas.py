"""Two replicas of every service, each its own process with its own metrics endpoint (the fault matrix's stack):
counters summed over the replicas count each fact once (GPU-seconds charged equal the ledger's sum, grants equal
the jobs' ``leased`` events), ``GET /v1/status`` lists both replicas of each service with every singleton held by
exactly one, and after the replica holding the queue's singletons is SIGKILLed it shows the loss (the lost
replica named, for as long as ``status_forget_seconds``) and the survivor holding them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from libs.runtime.ports import free_port
from tests.support.faultstack import SERVICES, FaultStack, remove_root, stack_root
from tests.support.services import eventually

pytestmark = pytest.mark.timeout(600)


class ObservedStack(FaultStack):
    """The fault stack with a metrics port for every process it starts (kept across a restart)."""

    ports: dict[str, int]

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        self.ports = getattr(self, "ports", {})
        port = self.ports.setdefault(name, free_port())
        return super()._spawn(name, argv, {**env, "TETO_METRICS_PORT": str(port),
                                           "TETO_METRICS_SAMPLE_SECONDS": "0.5"})

    def scrape(self, name: str) -> dict[str, list]:
        text = httpx.get(f"http://127.0.0.1:{self.ports[name]}/metrics", timeout=10).text
        out: dict[str, list] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append(s)
        return out

    def summed(self, service: str, sample: str) -> float:
        return sum(s.value for i in (1, 2) for s in self.scrape(f"{service}-{i}").get(sample, []))


@pytest_asyncio.fixture
async def stack() -> ObservedStack:
    root = stack_root()
    s = ObservedStack(Path(root))
    try:
        await s.start(("ex-a", "ex-b"))
        yield s
    finally:
        s.close()
        remove_root(root)


async def status_where(stack: ObservedStack, check, what: str, timeout: float = 60) -> dict:
    seen: list[dict] = []

    async def probe() -> dict | None:
        r = await stack.http("GET", "/v1/status")
        seen.append(r.json())
        return seen[-1] if r.status_code == 200 and check(seen[-1]) else None

    try:
        return await eventually(probe, timeout, what, every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status problems: {seen[-1].get('problems') if seen else None}") from None


def replicas(status: dict, service: str) -> list[str]:
    return [r["instance"] for r in status["services"][service]["replicas"]]


async def test_counters_sum_over_replicas_and_status_shows_a_lost_replica_and_the_take_over(stack):
    # 1. Both replicas of every service answer; every singleton has exactly one holder.
    status = await status_where(stack, lambda s: s["ok"] and all(len(replicas(s, n)) == 2 for n in SERVICES),
                                "two replicas of each service, every singleton held")
    queue = status["services"]["queue"]["singletons"]
    assert {"queue-placement", "queue-lease-scanner", "queue-outbox"} <= set(queue)
    assert all(holder in replicas(status, "queue") for holder in queue.values())

    # 2. Jobs run; each fact is counted by the one replica that committed it.
    jobs = [await stack.submit(stack.spec(f"observed-{i}", steps=20, step_seconds=0.05)) for i in range(3)]
    for job_id in jobs:
        assert (await stack.wait_done(job_id, timeout=120))["state"] == "succeeded"

    async def charged_equals_ledger() -> bool:
        (row,) = await stack.sql("SELECT coalesce(sum(gpu_seconds), 0) AS s FROM budget.ledger")
        charged = stack.summed("budget", "teto_gpu_seconds_charged_total")
        return row["s"] > 0 and abs(charged - row["s"]) < 1e-6

    await eventually(charged_equals_ledger, 60, "GPU-seconds charged over both budget replicas = ledger sum")
    leased = 0
    for job_id in jobs:
        leased += sum(1 for e in await stack.events(job_id) if e["event"] == "leased")
    assert stack.summed("queue", "teto_lease_grants_total") == leased >= 3
    instances = {s.labels["instance"] for i in (1, 2) for s in stack.scrape(f"queue-{i}")["teto_replica"]}
    assert len(instances) == 2  # two series, one per replica

    # 3. SIGKILL the replica holding the queue's placement (nothing restarts it here): status shows one replica,
    # names the lost one as not answering (it answered before), and the survivor holding every queue singleton.
    holder = queue["queue-placement"]
    victim = next(f"queue-{i}" for i in (1, 2)
                  if any(s.value == 1 and s.labels["singleton"] == "queue-placement"
                         for s in stack.scrape(f"queue-{i}")["teto_singleton_leader"]))
    stack.kill(victim)
    lost = f"queue: replica {holder} did not answer"
    after = await status_where(stack, lambda s: len(replicas(s, "queue")) == 1 and len(s["problems"]) == 1
                               and s["problems"][0].startswith(lost),
                               "one queue replica left, holding every queue singleton, the lost one named")
    assert after["ok"] is False
    (survivor,) = replicas(after, "queue")
    assert survivor != holder
    assert set(after["services"]["queue"]["singletons"].values()) == {survivor}
    # The rest of the control plane is unaffected.
    assert all(len(replicas(after, n)) == 2 for n in SERVICES if n != "queue")
