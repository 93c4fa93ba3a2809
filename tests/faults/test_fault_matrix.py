"""The fault matrix (issue 10, "Proof"): each fault injected into the real stack while jobs run, then every
invariant of tests/faults/invariants.py asserted, with the time to recover measured.

One stack for the module (tests/faults/conftest.py); the faults run one after another on it, each in a round:
background jobs are submitted and seen running (mid-stream), the fault is injected, a probe job is submitted
*during* the fault (retried through outages with one idempotency key), the fault is healed where it has an
end, and the round passes when the probe and every background job succeeded and the invariants hold. Figures:
``probe_done_s`` (fault -> probe job succeeded) and ``recovered_s`` (fault -> every invariant holds), next to
``baseline_s``, a probe job on the healthy stack.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
import pytest

from tests.faults.invariants import settle, stream_counts
from tests.faults.rounds import round_of as _round
from tests.faults.rounds import running as _running
from tests.support.faultstack import PREFIX, SERVICES, FaultStack
from tests.support.hostile import hostile_messages
from tests.support.services import eventually

pytestmark = pytest.mark.faults


async def _running_off_proxy(stack: FaultStack) -> list[dict[str, Any]] | None:
    jobs = [await stack.job(s.job_id) for s in stack.accepted[-2:]]
    found = [j for j in jobs if j and j["state"] == "running" and j["executor_id"] not in stack.proxies]
    return found or None


async def test_baseline_a_probe_job_on_the_healthy_stack(stack, matrix):
    t0 = time.monotonic()
    job = await stack.submit(stack.spec("baseline", steps=20))
    done = await stack.wait_done(job, timeout=90)
    matrix.append({"fault": "none (baseline)", "passed": done["state"] == "succeeded",
                   "baseline_s": time.monotonic() - t0})
    await settle(stack, {job})
    assert done["state"] == "succeeded", done


@pytest.mark.parametrize("service", SERVICES)
async def test_sigkill_of_one_service_replica_mid_stream(stack, matrix, service):
    name = stack.leader(service)

    async def inject():
        # Mid-stream: submits in flight when the replica dies (each retried with its own idempotency key).
        burst = [asyncio.create_task(stack.submit(stack.spec(f"{name}-burst{i}", steps=10))) for i in range(4)]
        await asyncio.wait(burst, return_when=asyncio.FIRST_COMPLETED)
        stack.kill(name)  # the survivor alone carries the round; the supervisor's restart comes after it

        async def heal() -> None:
            await asyncio.gather(*burst)
        return heal

    try:
        await _round(stack, matrix, f"SIGKILL {name}", inject)
    finally:  # back to two replicas for the next fault, whatever this one found
        stack.start_replica(service, int(name.rsplit("-", 1)[1]))
        await stack.wait_replicas()


async def test_sigkill_of_an_executor_running_a_job(stack, matrix):
    victim: dict[str, str] = {}

    async def inject():
        # Not the proxied one: the partition round needs it (and a kill there would test the proxy too).
        running = await eventually(lambda: _running(stack, [s.job_id for s in stack.accepted[-2:]], 1), 30,
                                   "a job running")
        executor = next((j["executor_id"] for j in running if j["executor_id"] not in stack.proxies), None)
        if executor is None:
            running = await eventually(lambda: _running_off_proxy(stack), 30, "a job running off the proxy")
            executor = running[0]["executor_id"]
        victim["id"] = executor
        stack.kill(f"executor:{executor}", group=False)  # the agent only, as a crash would
        return None

    try:
        await _round(stack, matrix, "SIGKILL executor", inject)
    finally:
        if victim:  # a restarted agent is a new incarnation with a new id (as teto up's supervisor does it)
            fresh = f"{victim['id']}-2"
            stack.start_executor(fresh)
            await stack.wait_executors(fresh)


async def test_nats_server_restart(stack, matrix):
    async def inject():
        await asyncio.to_thread(stack.nats.stop)

        async def heal() -> None:
            await asyncio.sleep(1.0)  # the outage itself: a second without a server
            await asyncio.to_thread(stack.nats.start)
        return heal

    await _round(stack, matrix, "NATS server restart", inject)


async def test_postgresql_restart(stack, matrix):
    async def inject():
        await asyncio.to_thread(stack.pg.stop)

        async def heal() -> None:
            await asyncio.sleep(1.0)  # the outage itself
            await asyncio.to_thread(stack.pg.start)
        return heal

    await _round(stack, matrix, "PostgreSQL restart", inject)


async def test_executor_partitioned_longer_than_its_lease(stack, matrix):
    proxied = next(iter(stack.proxies))
    cut: dict[str, Any] = {}

    async def job_on_proxied() -> dict[str, Any] | None:
        for s in stack.accepted[-3:]:
            job = await stack.job(s.job_id)
            if job and job["state"] == "running" and job["executor_id"] == proxied:
                return job
        return None

    async def inject():
        job = await eventually(job_on_proxied, 60, f"a job running on {proxied} (behind the proxy)")
        cut["job"] = job
        assert stack.proxies[proxied].cut() >= 1

        async def heal() -> None:
            # Longer than the lease: the queue redelivers under a new epoch before the link comes back.
            await stack.wait_job(job["id"], lambda j: j["lease_epoch"] > job["lease_epoch"], 60,
                                 "redelivery under a new epoch")
            stack.proxies[proxied].restore()
        return heal

    # Three background jobs keep all three executors busy, so one of them runs behind the proxy.
    try:
        row = await _round(stack, matrix, "executor partitioned > lease", inject, background=3, steps=160)
    finally:
        stack.proxies[proxied].restore()
    done = await stack.job(cut["job"]["id"])
    assert done["attempts"]["transport_lost"] >= 1 and done["attempts"]["training_error"] == 0, done
    row["partitioned_job_epochs"] = done["lease_epoch"]


async def test_hostile_burst_on_every_subject(stack, matrix):
    sent: dict[str, int] = {}
    to_subject: dict[str, int] = {}

    async def inject():
        nc = await nats.connect(stack.nats.url)
        try:
            js = nc.jetstream(timeout=15)
            msgs = hostile_messages(PREFIX, executor_ids=stack.executor_ids(), max_payload=nc.max_payload)
            for i, m in enumerate(msgs):
                if m.core:
                    await nc.publish(m.subject, m.data)
                else:
                    await js.publish(m.subject, m.data, headers={"Nats-Msg-Id": f"hostile-{i}-{time.time_ns()}"})
                sent[m.kind.split(" in ")[0]] = sent.get(m.kind.split(" in ")[0], 0) + 1
                to_subject[m.subject] = to_subject.get(m.subject, 0) + 1
            await nc.flush()
        finally:
            await nc.close()
        return None

    before = await stream_counts(stack, ("DEAD", "REJECTED"))
    try:
        await _round(stack, matrix, "hostile burst", inject)
    finally:
        after = await stream_counts(stack, ("DEAD", "REJECTED"))
        # Our own hostile messages on teto.dead.* / teto.rejected.* are not letters a service wrote.
        ours = {base: sum(n for subject, n in to_subject.items() if f".{base.lower()}." in subject)
                for base in after}
        matrix[-1].update(hostile_messages=sum(sent.values()),
                          **{f"{k.lower()}_letters": after[k] - before[k] - ours[k] for k in after})
