"""The budget service's tables (schema ``budget``): the append-only ledger, ceilings and per-job accounts.

Every change to an account is made under its row lock (``FOR UPDATE``, jobs locked in id order so two
replicas never deadlock), in the same transaction as the ledger rows that caused it and the events it emits.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import ValidationError

from libs.contracts.budget import BudgetEvent, BudgetEventKind
from libs.contracts.envelope import Envelope
from libs.contracts.jobs import TERMINAL_STATES, JobEvent, JobEventKind, JobSpec
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import StepReport, UsageSample
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime.fencing import StaleEpoch, is_stale

from .domain import ledger, usage
from .domain.ledger import Account, Decision, FirstCheckpointWarning, StepStats
from .domain.usage import Charge, Reconciliation

log = logging.getLogger(__name__)

SCHEMA = "budget"
CEILING_REASON = "gpu_ceiling"


@dataclass
class Effects:
    """What a transaction did, for the caller's counters and the tests."""

    events: list[tuple[str, Envelope]] = field(default_factory=list)
    stale: list[StaleEpoch] = field(default_factory=list)  # messages ignored for an old lease epoch
    inserted: int = 0
    late: int = 0  # usage records of an old lease epoch, charged all the same
    duplicates: int = 0  # usage records already charged
    charged: float = 0.0  # GPU-seconds appended to the ledger
    overshoot: float = 0.0  # growth of the jobs' overshoot (charged past a ceiling)


async def lock_jobs(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, asyncpg.Record]:
    ids = sorted(set(job_ids))
    await conn.execute("INSERT INTO budget.jobs (job_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING", ids)
    rows = await conn.fetch("SELECT * FROM budget.jobs WHERE job_id = ANY($1::text[]) ORDER BY job_id FOR UPDATE",
                            ids)
    return {r["job_id"]: r for r in rows}


def account_of(row: asyncpg.Record) -> Account:
    return Account(ceiling=row["ceiling_seconds"], consumed=row["consumed_seconds"],
                   exhausted_for=row["exhausted_for_ceiling"], overshoot=row["overshoot_seconds"],
                   active=row["state"] not in TERMINAL_STATES)


def _exhausted(subjects: Subjects, job_id: str, acc: Account) -> tuple[str, BudgetEvent]:
    return subjects.budget(job_id, "exhausted"), BudgetEvent(
        job_id=job_id, event=BudgetEventKind.EXHAUSTED, ceiling_seconds=acc.ceiling, consumed_seconds=acc.consumed,
        reason=CEILING_REASON, detail={"overshoot_seconds": max(0.0, acc.consumed - acc.ceiling)})


def _stored(acc: Account) -> tuple:
    """The account's figures ``_save_account`` writes."""
    return (acc.ceiling, acc.consumed, acc.exhausted_for, acc.overshoot)


async def _save_account(conn: asyncpg.Connection, job_id: str, d: Decision, subjects: Subjects,
                        effects: Effects) -> None:
    acc = d.account
    await conn.execute(
        "UPDATE budget.jobs SET ceiling_seconds = $2, consumed_seconds = $3, exhausted_for_ceiling = $4,"
        " overshoot_seconds = $5, updated_at = now() WHERE job_id = $1",
        job_id, acc.ceiling, acc.consumed, acc.exhausted_for, acc.overshoot)
    if d.exhausted:
        effects.events.append(_exhausted(subjects, job_id, acc))


def charge_of(executor_id: str, record: UsageRecord | UsageSample) -> Charge:
    """A usage record (or a sample from a heartbeat of an agent that predates usage reports) as a ledger row."""
    return Charge(job_id=record.job_id, executor_id=executor_id, epoch=record.epoch, seq=record.seq,
                  devices=record.devices, wall_seconds=record.wall_seconds,
                  started_at=getattr(record, "started_at", None), ended_at=getattr(record, "ended_at", None),
                  last=getattr(record, "last", False))


def charges_of(reports: list[UsageReport]) -> list[Charge]:
    return [charge_of(r.executor_id, rec) for r in reports for rec in r.records]


async def _charged(conn: asyncpg.Connection, batch: list[Charge]) -> dict[tuple[str, str, int, int], Charge]:
    rows = await conn.fetch(
        """SELECT l.job_id, l.executor_id, l.epoch, l.seq, l.devices, l.wall_seconds FROM budget.ledger l
           JOIN unnest($1::text[], $2::text[], $3::int[], $4::int[]) AS k(job_id, executor_id, epoch, seq)
             USING (job_id, executor_id, epoch, seq)""",
        [c.job_id for c in batch], [c.executor_id for c in batch], [c.epoch for c in batch], [c.seq for c in batch])
    return {(r["job_id"], r["executor_id"], r["epoch"], r["seq"]): Charge(
        r["job_id"], r["executor_id"], r["epoch"], r["seq"], r["devices"], r["wall_seconds"]) for r in rows}


async def record_usage(conn: asyncpg.Connection, batch: list[Charge], subjects: Subjects) -> Effects:
    """Append usage records to the ledger and charge their jobs, each (job, executor, epoch, seq) once.

    A record of an old lease epoch is charged too (counted in ``late``): the worker really ran. The job rows
    are locked first, so two replicas charging the same job serialise and the second sees the first's rows.
    """
    effects = Effects()
    if not batch:
        return effects
    rows = await lock_jobs(conn, [c.job_id for c in batch])
    plan = usage.plan_charges(batch, await _charged(conn, batch), {j: r["epoch"] for j, r in rows.items()})
    effects.late, effects.duplicates = plan.late, plan.duplicates
    for c in plan.conflicts:
        log.warning("usage record %s sent again with other figures (%s devices x %ss): the first one stays charged",
                    c.key, c.devices, c.wall_seconds)
    fresh = plan.fresh
    if not fresh:
        return effects
    inserted = await conn.fetch(
        """INSERT INTO budget.ledger (job_id, epoch, executor_id, seq, devices, wall_seconds, gpu_seconds,
                                      started_at, ended_at, last)
           SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::int[], $5::int[], $6::float8[],
                                $7::float8[], $8::timestamptz[], $9::timestamptz[], $10::bool[])
           ON CONFLICT (job_id, epoch, executor_id, seq) DO NOTHING
           RETURNING job_id, epoch, gpu_seconds""",
        [c.job_id for c in fresh], [c.epoch for c in fresh], [c.executor_id for c in fresh], [c.seq for c in fresh],
        [c.devices for c in fresh], [c.wall_seconds for c in fresh], [c.gpu_seconds for c in fresh],
        [c.started_at for c in fresh], [c.ended_at for c in fresh], [c.last for c in fresh])
    effects.inserted = len(inserted)
    added: dict[str, float] = {}
    epochs: dict[str, int] = {}
    for r in inserted:
        added[r["job_id"]] = added.get(r["job_id"], 0.0) + r["gpu_seconds"]
        epochs[r["job_id"]] = max(epochs.get(r["job_id"], 0), r["epoch"])
    effects.charged = sum(added.values())
    decisions = {job_id: ledger.on_usage(account_of(rows[job_id]), added[job_id]) for job_id in sorted(added)}
    await _save_charged(conn, decisions, epochs)
    for job_id, d in decisions.items():
        effects.overshoot += max(0.0, d.account.overshoot - account_of(rows[job_id]).overshoot)
        if d.exhausted:
            effects.events.append(_exhausted(subjects, job_id, d.account))
    return effects


async def _save_charged(conn: asyncpg.Connection, decisions: dict[str, Decision], epochs: dict[str, int]) -> None:
    """Every charged job's account and lease epoch in one statement (a batch touches many jobs: one round trip)."""
    ids = list(decisions)
    accs = [decisions[j].account for j in ids]
    await conn.execute(
        """UPDATE budget.jobs AS j SET ceiling_seconds = u.ceiling, consumed_seconds = u.consumed,
                  exhausted_for_ceiling = u.exhausted_for, overshoot_seconds = u.overshoot,
                  epoch = GREATEST(j.epoch, u.epoch), updated_at = now()
           FROM unnest($1::text[], $2::float8[], $3::float8[], $4::float8[], $5::float8[], $6::int[])
                AS u(job_id, ceiling, consumed, exhausted_for, overshoot, epoch)
           WHERE j.job_id = u.job_id""",
        ids, [a.ceiling for a in accs], [a.consumed for a in accs], [a.exhausted_for for a in accs],
        [a.overshoot for a in accs], [epochs[j] for j in ids])


async def reconcile(conn: asyncpg.Connection | asyncpg.Pool, job_ids: list[str] | None = None) -> list[Reconciliation]:
    """Every job's (or the named jobs') running total against the sum of its ledger rows, with the records
    missing inside each run and the runs not closed yet."""
    runs = await conn.fetch(
        """SELECT job_id, max(seq) AS highest, count(*) AS n, bool_or(last) AS closed FROM budget.ledger
           WHERE $1::text[] IS NULL OR job_id = ANY($1::text[]) GROUP BY job_id, executor_id, epoch""", job_ids)
    missing: dict[str, int] = {}
    open_runs: dict[str, int] = {}
    for r in runs:
        missing[r["job_id"]] = missing.get(r["job_id"], 0) + usage.missing_in_run(r["highest"], r["n"])
        open_runs[r["job_id"]] = open_runs.get(r["job_id"], 0) + (not r["closed"])
    rows = await conn.fetch(
        """SELECT COALESCE(j.job_id, l.job_id) AS job_id, COALESCE(j.consumed_seconds, 0) AS consumed,
                  COALESCE(l.total, 0) AS total, COALESCE(l.n, 0) AS n
           FROM (SELECT * FROM budget.jobs WHERE $1::text[] IS NULL OR job_id = ANY($1::text[])) j
           FULL JOIN (SELECT job_id, sum(gpu_seconds) AS total, count(*) AS n FROM budget.ledger
                      WHERE $1::text[] IS NULL OR job_id = ANY($1::text[]) GROUP BY job_id) l USING (job_id)
           ORDER BY 1""", job_ids)
    return [Reconciliation(r["job_id"], r["consumed"], r["total"], r["n"], missing.get(r["job_id"], 0),
                           open_runs.get(r["job_id"], 0)) for r in rows]


def _warning_event(subjects: Subjects, job_id: str, w: FirstCheckpointWarning,
                   consumed: float) -> tuple[str, BudgetEvent]:
    numbers = {k: float(v) for k, v in w.as_dict().items() if isinstance(v, int | float)}
    return subjects.budget(job_id, "warning"), BudgetEvent(
        job_id=job_id, event=BudgetEventKind.WARNING, ceiling_seconds=w.ceiling_seconds, consumed_seconds=consumed,
        reason=w.reason, detail=numbers)


def _spec_of(detail: dict[str, Any]) -> JobSpec | None:
    try:
        return JobSpec.model_validate(detail.get("spec") or {})
    except ValidationError as exc:
        log.warning("submitted event without a readable spec: %s", exc)
        return None


async def apply_job_events(conn: asyncpg.Connection, events: list[JobEvent], subjects: Subjects) -> Effects:
    """A batch of job events: every job locked once, in id order, then each event in (job, seq) order."""
    total = Effects()
    await lock_jobs(conn, [ev.job_id for ev in events])
    for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
        total.events += (await apply_job_event(conn, ev, subjects, locked=True)).events
    return total


async def apply_job_event(conn: asyncpg.Connection, ev: JobEvent, subjects: Subjects, *,
                          locked: bool = False) -> Effects:
    """One job event (``locked``: the caller holds the job's row lock already, see ``apply_job_events``)."""
    effects = Effects()
    if locked:
        row = await conn.fetchrow("SELECT * FROM budget.jobs WHERE job_id = $1", ev.job_id)
    else:
        row = (await lock_jobs(conn, [ev.job_id]))[ev.job_id]
    before = account_of(row)
    decision = Decision(before, False)
    if ev.seq > row["event_seq"]:
        await conn.execute(
            "UPDATE budget.jobs SET state = $2, event_seq = $3, epoch = GREATEST(epoch, $4), updated_at = now(),"
            " running_since = CASE WHEN $5::bool THEN $6::timestamptz ELSE running_since END WHERE job_id = $1",
            ev.job_id, str(ev.state), ev.seq, ev.epoch or 0,
            ledger.starts_run(str(ev.state), ev.previous_state and str(ev.previous_state)), ev.time)
        if ev.state in TERMINAL_STATES:
            decision = Decision(ledger.on_terminal(decision.account), False)

    ceiling, actor, spec = None, None, None
    if ev.event == JobEventKind.SUBMITTED:
        spec = _spec_of(ev.detail)
        ceiling, actor = (spec.gpu_ceiling_seconds if spec else None), ev.detail.get("owner")
    elif ev.event == JobEventKind.REQUEUED and ev.detail.get("gpu_ceiling_seconds") is not None:
        ceiling, actor = float(ev.detail["gpu_ceiling_seconds"]), ev.detail.get("actor")
    if ceiling is not None:
        # Idempotent by (job, event seq); the current ceiling is the one set by the latest event, whatever
        # order redeliveries come in.
        await conn.execute(
            "INSERT INTO budget.ceilings (job_id, event_seq, ceiling_seconds, actor, reason, consumed_seconds, set_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            ev.job_id, ev.seq, ceiling, actor, str(ev.event), decision.account.consumed, ev.time)
        current = await conn.fetchval("SELECT ceiling_seconds FROM budget.ceilings WHERE job_id = $1"
                                      " ORDER BY event_seq DESC LIMIT 1", ev.job_id)
        decision = ledger.on_ceiling(decision.account, current)
    if decision.exhausted or _stored(decision.account) != _stored(before):  # most events change no account
        await _save_account(conn, ev.job_id, decision, subjects, effects)

    if spec is not None:
        devices = ledger.gang_devices(spec.workers, spec.gpus_per_worker)
        await conn.execute(
            "UPDATE budget.jobs SET owner = COALESCE(owner, $2), devices = $3, checkpoint_every_steps = $4,"
            " estimated_step_seconds = $5, org = COALESCE($6, org) WHERE job_id = $1",
            ev.job_id, actor, devices, spec.checkpoint_every_steps, spec.estimated_step_seconds, ev.detail.get("org"))
        if row["warning"] is None:
            w = ledger.first_checkpoint_warning(spec.checkpoint_every_steps, spec.estimated_step_seconds, devices,
                                                decision.account.ceiling, "estimate")
            if w is not None:
                await _store_warning(conn, ev.job_id, w, decision.account.consumed, subjects, effects)
    return effects


async def _store_warning(conn: asyncpg.Connection, job_id: str, w: FirstCheckpointWarning, consumed: float,
                         subjects: Subjects, effects: Effects) -> None:
    await conn.execute("UPDATE budget.jobs SET warning = $2::jsonb WHERE job_id = $1", job_id, json.dumps(w.as_dict()))
    effects.events.append(_warning_event(subjects, job_id, w, consumed))


async def record_steps(conn: asyncpg.Connection, reports: list[StepReport], subjects: Subjects,
                       now: datetime) -> Effects:
    """Measure step time for the checkpoint ETA, and warn as soon as a measured step time says the first
    checkpoint will not fit in the ceiling (unless a warning was already given)."""
    effects = Effects()
    rows = await lock_jobs(conn, [r.job_id for r in reports])
    stats = {j: StepStats(r["last_step"], r["mean_step_seconds"], r["measured_steps"]) for j, r in rows.items()}
    for rep in sorted(reports, key=lambda r: (r.job_id, r.time)):
        if is_stale(rep.epoch, rows[rep.job_id]["epoch"]):
            effects.stale.append(StaleEpoch(rep.executor_id, rep.job_id, rep.epoch, rows[rep.job_id]["epoch"],
                                            "step report"))
            continue
        stats[rep.job_id] = ledger.on_step(stats[rep.job_id], rep.step, rep.step_seconds)
    for job_id, row in rows.items():
        st = stats[job_id]
        every = row["checkpoint_every_steps"]
        eta = ledger.next_checkpoint_eta(st.last_step, every or 0, st.mean_step_seconds)
        await conn.execute(
            "UPDATE budget.jobs SET last_step = $2, mean_step_seconds = $3, measured_steps = $4,"
            " next_checkpoint_eta_seconds = $5, step_reported_at = $6 WHERE job_id = $1",
            job_id, st.last_step, st.mean_step_seconds, st.measured_steps, eta, now)
        if row["warning"] is None and every and st.last_step is not None and st.last_step < every:
            w = ledger.first_checkpoint_warning(every, st.mean_step_seconds, row["devices"] or 1,
                                                row["ceiling_seconds"], "measured")
            if w is not None:
                await _store_warning(conn, job_id, w, row["consumed_seconds"], subjects, effects)
    return effects


async def status(pool: asyncpg.Pool, job_id: str) -> tuple[bool, float | None, float]:
    row = await pool.fetchrow("SELECT ceiling_seconds, consumed_seconds FROM budget.jobs WHERE job_id = $1", job_id)
    if row is None:
        return False, None, 0.0
    return True, row["ceiling_seconds"], row["consumed_seconds"]
