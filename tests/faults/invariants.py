"""The invariants every fault must leave true, checked on the live stack (tests/support/faultstack.py, or the
clustered one of tests/support/clusterstack.py).

- no accepted command lost: every submit a gateway answered 201/202 is a job, and in the audit log;
- no job ran in two places: no run found its job's lock held (the workload's ``overlap`` line), each lease
  epoch ran on one executor, and epoch e's last sign of life precedes epoch e+1's first;
- every job ends (the fault workloads all succeed when nothing is wrong with them);
- the budget ledger's sum per job equals the usage the executors put on the bus, each sample once;
- the audit chain verifies;
- no durable consumer is left redelivering, and none is left behind (JetStream consumer info);
- every executor still running is seen heartbeating by health (no false ``no_signal``);
Each check is waited for (the system converges), and ``settle`` returns how long convergence took.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import nats

from libs.runtime import bus
from services.budget.domain.ledger import gpu_seconds
from tests.support.faultstack import PREFIX
from tests.support.stackclient import StackClient
from tests.support.services import eventually

# Heartbeats flow all the time: a consumer checked at an instant may hold a few in flight. A poison message
# shows as num_redelivered > 0 that never clears; a wedged consumer as a backlog that only grows.
IN_FLIGHT_SLACK = 25


@dataclass(frozen=True)
class ConsumerState:
    stream: str
    durable: str
    num_pending: int
    num_ack_pending: int
    num_redelivered: int
    oldest_unacked: str = ""  # subject and start of the message at the ack floor, when one is held
    members: int = 0  # on a NATS cluster: the members holding it (leader and replicas); 0 when none leads

    @property
    def settled(self) -> bool:
        return self.num_redelivered == 0 and self.num_pending + self.num_ack_pending <= IN_FLIGHT_SLACK


async def durable_consumers(stack: StackClient) -> list[ConsumerState]:
    nc = await stack.bus()
    try:
        js = nc.jetstream(timeout=10)
        out = []
        for stream in await js.streams_info():
            for ci in await js.consumers_info(stream.config.name):
                if ci.config.durable_name:
                    held = ""
                    if ci.num_redelivered:  # the first of its messages past the ack floor is unacked: name it
                        filters = ci.config.filter_subjects or [ci.config.filter_subject or ">"]
                        held = await _first_after(js, stream.config.name, ci.ack_floor.stream_seq, filters)
                    members = 1 + len(ci.cluster.replicas or []) if ci.cluster and ci.cluster.leader else 0
                    out.append(ConsumerState(stream.config.name, ci.config.durable_name, ci.num_pending or 0,
                                             ci.num_ack_pending or 0, ci.num_redelivered or 0, held, members))
        return out
    finally:
        await nc.close()


def subject_matches(subject: str, pattern: str) -> bool:
    """NATS wildcard match: ``*`` one token, ``>`` one or more trailing tokens."""
    tokens, wanted = subject.split("."), pattern.split(".")
    for i, w in enumerate(wanted):
        if w == ">":
            return len(tokens) > i
        if i >= len(tokens) or (w != "*" and w != tokens[i]):
            return False
    return len(tokens) == len(wanted)


async def _first_after(js: Any, stream: str, floor: int, filters: list[str], look: int = 500) -> str:
    """The first message after ``floor`` that the consumer's filters take, as subject and excerpt."""
    for seq in range(floor + 1, floor + 1 + look):
        try:
            msg = await js.get_msg(stream, seq)
        except Exception as exc:  # noqa: BLE001 - deleted, aged out or past the end: say so, do not fail
            return f"#{seq}: {type(exc).__name__}"
        if any(subject_matches(msg.subject, f) for f in filters):
            return f"#{seq} {msg.subject}: {(msg.data or b'')[:300]!r}"
    return f"none of #{floor + 1}..#{floor + look} matches {filters}"


async def stream_bodies(stack: StackClient, stream_base: str) -> list[tuple[str, Any]]:
    """(subject, decoded JSON or None) for every message a stream holds, read by an ephemeral consumer."""
    nc = await stack.bus()
    try:
        js = nc.jetstream(timeout=10)
        name = f"{PREFIX.upper()}_{stream_base}"
        try:
            info = await js.stream_info(name)
        except nats.js.errors.NotFoundError:
            return []
        out: list[tuple[str, Any]] = []
        if not info.state.messages:
            return out
        sub = await js.pull_subscribe(f"{PREFIX}.>", durable=None, stream=name)
        try:
            while len(out) < info.state.messages:
                try:
                    msgs = await sub.fetch(500, timeout=2.0)
                except TimeoutError:
                    break
                for m in msgs:
                    try:
                        body = json.loads(m.data)
                    except ValueError:
                        body = None
                    out.append((m.subject, body))
                    await m.ack()
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def stream_counts(stack: StackClient, bases: tuple[str, ...]) -> dict[str, int]:
    """How many messages each stream holds now (0 for a stream not declared)."""
    nc = await stack.bus()
    try:
        js = nc.jetstream(timeout=10)
        out = {}
        for base in bases:
            try:
                out[base] = (await js.stream_info(f"{PREFIX.upper()}_{base}")).state.messages
            except nats.js.errors.NotFoundError:
                out[base] = 0
        return out
    finally:
        await nc.close()


def _samples(subject: str, body: Any) -> list[tuple[str, dict[str, Any]]]:
    """Usage samples in a heartbeat (``usage``, older agents) or the records of a usage report
    (``teto.usage.<executor>``), with the executor that sent them."""
    if not isinstance(body, dict):
        return []
    executor = body.get("executor_id") or subject.rsplit(".", 1)[-1]
    found = []
    for sample in (body.get("usage"), body if "wall_seconds" in body else None, *(body.get("samples") or []),
                   *(body.get("records") or [])):
        if isinstance(sample, dict) and {"job_id", "epoch", "seq", "devices", "wall_seconds"} <= set(sample):
            found.append((str(sample.get("executor_id") or executor), sample))
    return found


def usage_sent(bodies: list[tuple[str, Any]], job_ids: set[str]) -> dict[str, float]:
    """GPU-seconds per job as the executors put them on the bus, each (job, epoch, executor, seq) once."""
    seen: dict[tuple[str, int, str, int], float] = {}
    for subject, body in bodies:
        for executor, s in _samples(subject, body):
            if s["job_id"] in job_ids:
                seen.setdefault((s["job_id"], s["epoch"], executor, s["seq"]),
                                gpu_seconds(s["devices"], s["wall_seconds"]))
    totals: dict[str, float] = defaultdict(float)
    for (job_id, *_), value in seen.items():
        totals[job_id] += value
    return dict(totals)


async def ledger_sums(stack: StackClient, job_ids: set[str]) -> dict[str, float]:
    rows = await stack.sql("SELECT job_id, sum(gpu_seconds) AS s FROM budget.ledger WHERE job_id = ANY($1::text[])"
                           " GROUP BY job_id", sorted(job_ids))
    return {r["job_id"]: r["s"] for r in rows}


async def ledger_mismatch(stack: StackClient, job_ids: set[str]) -> dict[str, tuple[float, float]]:
    """Jobs whose ledger sum differs from the usage sent: job -> (sent, ledger). Empty when they agree."""
    bodies = await stream_bodies(stack, "HB") + await stream_bodies(stack, "USAGE")
    sent = usage_sent(bodies, job_ids)
    booked = await ledger_sums(stack, job_ids)
    return {j: (sent.get(j, 0.0), booked.get(j, 0.0)) for j in job_ids
            if not math.isclose(sent.get(j, 0.0), booked.get(j, 0.0), rel_tol=1e-9, abs_tol=1e-6)}


def run_overlaps(runs: list[dict[str, Any]]) -> list[str]:
    """Evidence of one job running in two places, from the fault workload's lines; empty when none."""
    problems = [f"overlap at {r['t']:.3f} (pid {r['pid']}, epoch {r['epoch']})" for r in runs
                if r["event"] == "overlap"]
    by_epoch: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_epoch[r["epoch"]].append(r)
    for epoch, rs in by_epoch.items():
        if len({r["executor"] for r in rs}) > 1:
            problems.append(f"epoch {epoch} ran on {sorted({r['executor'] for r in rs})}")
    epochs = sorted(by_epoch)
    for a, b in zip(epochs, epochs[1:], strict=False):
        if max(r["t"] for r in by_epoch[a]) > min(r["t"] for r in by_epoch[b]):
            problems.append(f"epoch {a} still wrote after epoch {b} started")
    return problems


async def assert_no_double_runs(stack: StackClient, job_ids: set[str]) -> None:
    for job_id in sorted(job_ids):
        problems = run_overlaps(stack.runs(job_id))
        assert not problems, f"job {job_id} ran in two places: {problems}"
        leased = [e["epoch"] for e in await stack.events(job_id) if e["event"] == "leased"]
        assert leased == sorted(set(leased)), f"job {job_id} leased epochs out of order: {leased}"


async def _accepted_everywhere(stack: StackClient) -> list[str] | None:
    """Accepted submits missing as a job or from the audit log (None when none is missing)."""
    ids = [s.job_id for s in stack.accepted]
    jobs = {r["id"] for r in await stack.sql("SELECT id FROM queue.jobs WHERE id = ANY($1::text[])", ids)}
    audited = {r["command_id"] for r in await stack.sql(
        "SELECT DISTINCT command_id FROM audit.log WHERE command_id = ANY($1::text[])", ids)}
    missing = [i for i in ids if i not in jobs or i not in audited]
    return missing or None


async def _check(problems: list[str], what: str, check: Awaitable[Any]) -> None:
    """Run one invariant's check, keeping its failure (every broken invariant is reported, not the first)."""
    try:
        await check
    except AssertionError as exc:
        problems.append(f"{what}: {str(exc)[:6000]}")


async def _all_done(stack: StackClient, job_ids: set[str], timeout: float, expect: str) -> None:
    t0 = time.monotonic()
    for job_id in sorted(job_ids):
        job = await stack.wait_done(job_id, timeout=max(5.0, timeout - (time.monotonic() - t0)))
        assert job["state"] == expect, f"job {job_id} ended {job['state']}: {job.get('error') or job.get('reason')}"


async def _nothing_missing(stack: StackClient) -> None:
    async def check() -> bool:
        return await _accepted_everywhere(stack) is None
    try:
        await eventually(check, 20, "every accepted submit to be a job and audited", every=0.5)
    except AssertionError:
        raise AssertionError(f"accepted but missing (job or audit): {await _accepted_everywhere(stack)}") from None


async def _unless_unanswered(read: Awaitable[Any]) -> Any:
    """A JetStream read that got no answer in time, or a 503 (a loaded cluster, leaders being elected: the
    transient errors of libs/runtime/bus.py), is "not yet", to be asked again, not a broken invariant; None then."""
    try:
        return await read
    except bus.TRANSIENT_JS_ERRORS:
        return None


async def _ledger_agrees(stack: StackClient, job_ids: set[str]) -> None:
    async def check() -> bool:
        return await _unless_unanswered(ledger_mismatch(stack, job_ids)) == {}
    try:
        await eventually(check, 20, "the ledger to equal the usage sent", every=1.0)
    except AssertionError:
        mismatch = await _unless_unanswered(ledger_mismatch(stack, job_ids))
        raise AssertionError(f"job: (sent, ledger) {mismatch}") from None


async def _audit_verifies(stack: StackClient) -> None:
    # The audit service answers verify (it holds the key); a replica restarted by the fault may still be subscribing.
    async def answered() -> Any:
        r = await stack.http("GET", "/v1/audit/verify")
        return r if r.status_code != 503 else None
    r = await eventually(answered, 30, "the audit service to answer verify", every=1.0)
    assert r.status_code == 200 and r.json()["ok"], f"{r.status_code} {r.text}"


async def _consumers_settle(stack: StackClient) -> None:
    async def check() -> bool:
        states = await _unless_unanswered(durable_consumers(stack))
        return states is not None and all(c.settled for c in states)
    try:
        await eventually(check, 30, "every durable consumer to settle", every=1.0)
    except AssertionError:
        stuck = [c for c in await _unless_unanswered(durable_consumers(stack)) or [] if not c.settled]
        raise AssertionError(f"left redelivering or behind: {stuck}") from None


async def _live_executors_signalling(stack: StackClient) -> None:
    """Health's view of every executor still running shows it heartbeating (not a false ``no_signal``)."""
    async def check() -> list[str] | None:
        r = await stack.http("GET", "/v1/executors")
        entries = {e["executor_id"]: e for e in r.json()} if r.status_code == 200 else {}
        silent = [i for i in stack.executor_ids() if (entries.get(i) or {}).get("signal") == "no_signal"
                  or i not in entries]
        return None if silent else ["ok"]
    try:
        await eventually(check, 15, "live executors to show a signal", every=0.5)
    except AssertionError:
        r = await stack.http("GET", "/v1/executors")
        raise AssertionError(f"executors shown silent though alive: "
                             f"{[(e['executor_id'], e.get('signal')) for e in r.json()]}") from None


async def settle(stack: StackClient, job_ids: set[str], *, timeout: float = 90,
                 expect: str = "succeeded") -> float:
    """Wait until every invariant holds (seconds taken); fail listing every one that does not."""
    t0 = time.monotonic()
    problems: list[str] = []
    await _check(problems, "every job ends", _all_done(stack, job_ids, timeout, expect))
    await _check(problems, "no accepted command lost", _nothing_missing(stack))
    await _check(problems, "no job in two places", assert_no_double_runs(stack, job_ids))
    await _check(problems, "ledger == usage sent", _ledger_agrees(stack, job_ids))
    await _check(problems, "audit chain verifies", _audit_verifies(stack))
    await _check(problems, "no consumer redelivering", _consumers_settle(stack))
    await _check(problems, "live executors not shown silent", _live_executors_signalling(stack))
    assert not problems, "invariants broken:\n- " + "\n- ".join(problems)
    return time.monotonic() - t0
