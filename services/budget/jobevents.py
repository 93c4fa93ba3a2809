"""The budget's job events, a batch at a time: every job of the batch locked and read once (with the latest row of
its ceiling history), the events folded in memory (domain/events.py), then the writes: the jobs that changed in
one ``UPDATE``, the ceiling history's new rows in one ``INSERT``, both in one statement when there are both (a
submission, a requeue). Two statements a batch of known jobs whatever its size (two more when some job is new),
where applying each event in turn took two to six.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import asyncpg
from pydantic import ValidationError

from libs.contracts.jobs import TERMINAL_STATES, JobEvent, JobEventKind, JobSpec
from libs.contracts.subjects import Subjects

from . import grants
from .domain.events import Exhausted, JobRow, fold
from .domain.grants import Grant, JobLease, grant_of, to_judge_again
from .store import Effects, exhausted_event, locked, record_usage, utc, warning_event

log = logging.getLogger(__name__)


def _spec_of(detail: dict[str, Any]) -> JobSpec | None:
    try:
        return JobSpec.model_validate(detail.get("spec") or {})
    except ValidationError as exc:
        log.warning("submitted event without a readable spec: %s", exc)
        return None


_LOCK = """
SELECT j.job_id, j.state, j.event_seq, j.epoch, j.running_since, j.ceiling_seconds, j.consumed_seconds,
       j.exhausted_for_ceiling, j.overshoot_seconds, j.owner, j.devices, j.checkpoint_every_steps,
       j.estimated_step_seconds, j.org, j.warning IS NOT NULL AS warned,
       c.event_seq AS ceiling_seq, c.ceiling_seconds AS ceiling_latest
FROM budget.jobs j
LEFT JOIN LATERAL (SELECT event_seq, ceiling_seconds FROM budget.ceilings WHERE job_id = j.job_id
                   ORDER BY event_seq DESC LIMIT 1) c ON true
WHERE j.job_id = ANY(ARRAY(SELECT json_array_elements_text($1::json)))
ORDER BY j.job_id FOR UPDATE OF j"""


async def _lock(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, JobRow]:
    """The batch's jobs (created when unknown), locked in id order as ``store.lock_jobs`` locks them."""
    return {j: JobRow(
        r["job_id"], r["state"], r["event_seq"], r["epoch"], r["running_since"], r["ceiling_seconds"],
        r["consumed_seconds"], r["exhausted_for_ceiling"], r["overshoot_seconds"], r["owner"], r["devices"],
        r["checkpoint_every_steps"], r["estimated_step_seconds"], r["org"], r["warned"], r["ceiling_seq"],
        r["ceiling_latest"]) for j, r in (await locked(conn, job_ids, _LOCK)).items()}


_WRITE_JOBS = """
UPDATE budget.jobs AS j SET state = u.state, event_seq = u.event_seq, epoch = u.epoch,
       running_since = u.running_since, ceiling_seconds = u.ceiling, consumed_seconds = u.consumed,
       exhausted_for_ceiling = u.exhausted_for, overshoot_seconds = u.overshoot, owner = u.owner,
       devices = u.devices, checkpoint_every_steps = u.every, estimated_step_seconds = u.step_seconds, org = u.org,
       warning = COALESCE(u.warning, j.warning), updated_at = CASE WHEN u.touched THEN now() ELSE j.updated_at END
FROM (SELECT r->>0 AS job_id, r->>1 AS state, (r->>2)::int AS event_seq, (r->>3)::int AS epoch,
             (r->>4)::timestamptz AS running_since, (r->>5)::float8 AS ceiling, (r->>6)::float8 AS consumed,
             (r->>7)::float8 AS exhausted_for, (r->>8)::float8 AS overshoot, r->>9 AS owner, (r->>10)::int AS devices,
             (r->>11)::int AS every, (r->>12)::float8 AS step_seconds, r->>13 AS org, (r->>14)::jsonb AS warning,
             (r->>15)::bool AS touched
      FROM jsonb_array_elements($1::jsonb) AS r) AS u
WHERE j.job_id = u.job_id"""

def _add_ceilings(param: str) -> str:
    """The ceiling history's new rows, from the JSON parameter ``param``."""
    return f"""INSERT INTO budget.ceilings (job_id, event_seq, ceiling_seconds, actor, reason, consumed_seconds, set_at)
SELECT r->>0, (r->>1)::int, (r->>2)::float8, r->>3, r->>4, (r->>5)::float8, (r->>6)::timestamptz
FROM jsonb_array_elements({param}::jsonb) AS r
ON CONFLICT DO NOTHING"""

# Both writes in one statement ($1: the jobs, $2: the ceiling rows): the tables are distinct, so neither part
# reads what the other writes.
_WRITE_BOTH = f"WITH ceilings AS ({_add_ceilings('$2')})\n{_WRITE_JOBS.strip()}"


def _grants(events: list[JobEvent], rows: dict[str, JobRow]) -> list[Grant]:
    """The grants of the batch's ``leased`` events: each worker named may charge its share of the job's devices."""
    return [grant_of(ev.job_id, ev.epoch, ev.detail.get("workers") or [ev.executor_id], rows[ev.job_id].devices,
                     ev.time)
            for ev in events if ev.event == JobEventKind.LEASED and ev.epoch and (ev.detail.get("workers")
                                                                                  or ev.executor_id)]


def _leases(rows: dict[str, JobRow]) -> dict[str, JobLease]:
    return {j: JobLease(r.epoch, r.state in TERMINAL_STATES) for j, r in rows.items()}


async def apply_job_events(conn: asyncpg.Connection, events: list[JobEvent], subjects: Subjects,
                           admission: grants.Admission | None = None) -> Effects:
    """A batch of job events, with the result of applying each in (job, seq) order (see domain/events.py).

    With ``admission`` (the service's path), the ``leased`` events' grants are kept and the usage held for the
    jobs whose epoch moved or that ended is judged again (domain/grants.py), in the same transaction."""
    effects = Effects()
    if not events:
        return effects
    rows = await _lock(conn, [ev.job_id for ev in events])
    before = _leases(rows)
    # Jobs leased before their submission reached the budget (a later batch committed first): their grants'
    # devices were not known (domain/grants.py, UNKNOWN_DEVICES).
    unsized = {j for j, r in rows.items() if r.devices is None and r.epoch > 0}
    done = fold(rows, events, _spec_of)
    ceilings = json.dumps([
        [c.job_id, c.event_seq, c.ceiling_seconds, c.actor, c.reason, c.consumed_seconds, utc(c.set_at)]
        for c in done.ceilings]) if done.ceilings else None
    changed = done.changed()
    jobs = json.dumps([
        [r.job_id, r.state, r.event_seq, r.epoch, utc(r.running_since), r.ceiling, r.consumed, r.exhausted_for,
         r.overshoot, r.owner, r.devices, r.checkpoint_every_steps, r.estimated_step_seconds, r.org,
         r.warning.as_dict() if r.warning is not None else None, r.touched] for r in changed]) if changed else None
    if ceilings is not None and jobs is not None:  # a submission or a requeue: one round trip for both tables
        await conn.execute(_WRITE_BOTH, jobs, ceilings)
    elif ceilings is not None:
        await conn.execute(_add_ceilings("$1"), ceilings)
    elif jobs is not None:
        await conn.execute(_WRITE_JOBS, jobs)
    for a in done.announced:
        effects.events.append(exhausted_event(subjects, a.job_id, a.account) if isinstance(a, Exhausted)
                              else warning_event(subjects, a.job_id, a.warning, a.consumed))
    if admission is not None:
        granted = _grants(events, rows)
        await grants.store_grants(conn, granted)
        sized = await grants.fill_devices(conn, {j: rows[j].devices for j in unsized if rows[j].devices is not None})
        held = await grants.held_for(conn, to_judge_again(before, _leases(rows),
                                                          [*(g.job_id for g in granted), *sized]))
        if held:
            charged = await record_usage(conn, held, subjects, admission)
            effects.events.extend(charged.events)
            effects.inserted, effects.charged, effects.overshoot = charged.inserted, charged.charged, charged.overshoot
            effects.late, effects.duplicates = charged.late, charged.duplicates
            effects.held, effects.refused = charged.held, charged.refused
    return effects
