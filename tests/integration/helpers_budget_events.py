"""The budget's job events applied one at a time, a statement each, as the service did before it folded a batch
in memory (services/budget/jobevents.py): the reference the batch is checked against, row for row."""

from __future__ import annotations

import json

import asyncpg

from libs.contracts.jobs import TERMINAL_STATES, JobEvent, JobEventKind
from libs.contracts.subjects import Subjects
from services.budget import store
from services.budget.domain import ledger
from services.budget.domain.ledger import Decision
from services.budget.jobevents import _spec_of


async def apply_one(conn: asyncpg.Connection, ev: JobEvent, subjects: Subjects) -> store.Effects:
    effects = store.Effects()
    row = (await store.lock_jobs(conn, [ev.job_id]))[ev.job_id]
    before = store.account_of(row)
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
        await conn.execute(
            "INSERT INTO budget.ceilings (job_id, event_seq, ceiling_seconds, actor, reason, consumed_seconds, set_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            ev.job_id, ev.seq, ceiling, actor, str(ev.event), decision.account.consumed, ev.time)
        current = await conn.fetchval("SELECT ceiling_seconds FROM budget.ceilings WHERE job_id = $1"
                                      " ORDER BY event_seq DESC LIMIT 1", ev.job_id)
        decision = ledger.on_ceiling(decision.account, current)
    acc = decision.account
    stored = (acc.ceiling, acc.consumed, acc.exhausted_for, acc.overshoot)
    if decision.exhausted or stored != (before.ceiling, before.consumed, before.exhausted_for, before.overshoot):
        await conn.execute(
            "UPDATE budget.jobs SET ceiling_seconds = $2, consumed_seconds = $3, exhausted_for_ceiling = $4,"
            " overshoot_seconds = $5, updated_at = now() WHERE job_id = $1", ev.job_id, *stored)
        if decision.exhausted:
            effects.events.append(store.exhausted_event(subjects, ev.job_id, acc))
    if spec is not None:
        devices = ledger.gang_devices(spec.workers, spec.gpus_per_worker)
        await conn.execute(
            "UPDATE budget.jobs SET owner = COALESCE(owner, $2), devices = $3, checkpoint_every_steps = $4,"
            " estimated_step_seconds = $5, org = COALESCE($6, org) WHERE job_id = $1",
            ev.job_id, actor, devices, spec.checkpoint_every_steps, spec.estimated_step_seconds, ev.detail.get("org"))
        if row["warning"] is None:
            w = ledger.first_checkpoint_warning(spec.checkpoint_every_steps, spec.estimated_step_seconds, devices,
                                                acc.ceiling, "estimate")
            if w is not None:
                await conn.execute("UPDATE budget.jobs SET warning = $2::jsonb WHERE job_id = $1", ev.job_id,
                                   json.dumps(w.as_dict()))
                effects.events.append(store.warning_event(subjects, ev.job_id, w, acc.consumed))
    return effects
