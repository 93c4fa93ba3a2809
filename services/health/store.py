"""The health service's tables (schema ``health``): executors and jobs as heartbeats, registrations and job
events describe them, and the signals the evaluator derives, written with their events in one transaction."""

from __future__ import annotations

import json
import logging
from dataclasses import astuple, dataclass, field
from datetime import datetime, timedelta

import asyncpg

from libs.contracts.jobs import TERMINAL_STATES, JobEvent, JobState
from libs.contracts.nodes import NodeRegistered, Signal, SignalChanged
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime import outbox
from libs.runtime.fencing import StaleEpoch, is_stale

from .domain.contact import Beat, Contact, fold
from .domain.tracking import Event, JobRow, fold_events
from .domain.signals import SignalReading, Thresholds, executor_signal, job_signal

log = logging.getLogger(__name__)

SCHEMA = "health"
_TERMINAL = sorted(str(s) for s in TERMINAL_STATES)

# The heartbeat columns of each table, as ``Contact`` lays them out (services/health/domain/contact.py).
# Only what the fold compares: the other columns a heartbeat sets are overwritten whole, never read.
_EXECUTOR_CONTACT = ("SELECT executor_id, last_heartbeat, step, phase, job_id, epoch, step_changed_at"
                     " FROM health.executors WHERE executor_id = ANY($1::text[])")
_JOB_CONTACT = ("SELECT job_id, last_contact_at, step, phase, epoch, step_changed_at"
                " FROM health.jobs WHERE job_id = ANY($1::text[])")

_WRITE_EXECUTORS = """
UPDATE health.executors AS e SET node_id = u.node_id, group_name = u.group_name, gpus = u.gpus::jsonb,
    accepting = u.accepting, phase = u.phase, step = u.step, job_id = u.job_id, epoch = u.epoch,
    last_heartbeat = u.last_heartbeat, step_changed_at = u.step_changed_at,
    heartbeat_interval_seconds = u.heartbeat_interval_seconds, progress_interval_seconds = u.progress_interval_seconds,
    updated_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::text[], $5::text[], $6::int[], $7::timestamptz[],
            $8::text[], $9::text[], $10::text[], $11::bool[], $12::float8[], $13::float8[])
     AS u(executor_id, last_heartbeat, step, phase, job_id, epoch, step_changed_at, node_id, group_name, gpus,
          accepting, heartbeat_interval_seconds, progress_interval_seconds)
WHERE e.executor_id = u.executor_id
"""
_WRITE_JOBS = """
UPDATE health.jobs AS j SET last_contact_at = u.last_contact_at, step = u.step, phase = u.phase, epoch = u.epoch,
    step_changed_at = u.step_changed_at, executor_id = u.executor_id,
    progress_interval_seconds = u.progress_interval_seconds, updated_at = now()
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::text[], $5::int[], $6::timestamptz[], $7::text[],
            $8::float8[]) AS u(job_id, last_contact_at, step, phase, epoch, step_changed_at, executor_id,
                               progress_interval_seconds)
WHERE j.job_id = u.job_id
"""


async def lock_rows(conn: asyncpg.Connection, table: str, key: str, ids: list[str]) -> set[str]:
    """Create the rows a batch names that do not exist yet, and lock every one of them, in key order: one
    statement (ON CONFLICT DO UPDATE locks a conflicting row even when its WHERE says not to update it). Every
    writer of these tables takes its row locks in key order (the evaluator, the job events), so two of them can
    never wait on each other in a cycle (a deadlock aborted the evaluator's pass under load). The keys it created
    (bare rows, to be written by the caller in the same transaction)."""
    return {r[0] for r in await conn.fetch(
        f"INSERT INTO health.{table} ({key}) SELECT k FROM unnest($1::text[]) AS k ORDER BY k"
        f" ON CONFLICT ({key}) DO UPDATE SET {key} = EXCLUDED.{key} WHERE false RETURNING {key}", sorted(set(ids)))}


def executor_beats(beats: list[Heartbeat], now: datetime) -> dict[str, list[Beat]]:
    """Each executor's heartbeats as they land on its row, oldest first (stream order within one send time).
    The send time is used, clamped to now against a fast executor clock, so heartbeats that waited in the
    stream while this service was down are not mistaken for fresh ones."""
    out: dict[str, list[Beat]] = {}
    for b in sorted(beats, key=lambda b: b.sent_at):
        out.setdefault(b.executor_id, []).append(Beat(
            at=min(b.sent_at, now), epoch=0, progress=(b.step, str(b.phase), b.job_id, b.epoch),
            columns=(b.node_id, b.group, _gpus(b), b.accepting,
                     b.interval_seconds, b.progress_interval_seconds)))
    return out


def _gpus(b: Heartbeat) -> str:
    return json.dumps([g.model_dump(mode="json") for g in b.gpus]) if b.gpus else "[]"  # most send none


def job_beats_of(beats: list[Heartbeat], now: datetime) -> dict[str, list[Beat]]:
    """Each job's heartbeats as they land on its contact, oldest first (see ``executor_beats``)."""
    out: dict[str, list[Beat]] = {}
    for b in sorted(beats, key=lambda b: b.sent_at):
        if b.job_id:
            out.setdefault(b.job_id, []).append(Beat(
                at=min(b.sent_at, now), epoch=b.epoch or 0, progress=(b.step, str(b.phase), b.epoch or 0),
                columns=(b.executor_id, b.progress_interval_seconds)))
    return out


def _executor_contact(r: asyncpg.Record) -> Contact:
    return Contact(at=r["last_heartbeat"], epoch=0, progress=(r["step"], r["phase"], r["job_id"], r["epoch"]),
                   step_changed_at=r["step_changed_at"], columns=())


def _job_contact(r: asyncpg.Record) -> Contact:
    return Contact(at=r["last_contact_at"], epoch=r["epoch"], progress=(r["step"], r["phase"], r["epoch"]),
                   step_changed_at=r["step_changed_at"], columns=())


def folded(rows: dict[str, Contact], beats: dict[str, list[Beat]], *, fenced: bool) -> list[tuple[str, Contact]]:
    """Each row a batch changed, as its heartbeats left it applied one by one, in key order."""
    out = []
    for key in sorted(beats):
        before = rows.get(key)
        after = fold(before, beats[key], fenced=fenced)
        if after is not None and after is not before:
            out.append((key, after))
    return out


async def job_contacts(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, Contact]:
    """Lock the jobs (see ``lock_rows``) and read their contacts: the epochs the batch is fenced by."""
    await lock_rows(conn, "jobs", "job_id", job_ids)
    return {r["job_id"]: _job_contact(r) for r in await conn.fetch(_JOB_CONTACT, job_ids)}


def split_stale(beats: list[Heartbeat], jobs: dict[str, Contact]) -> tuple[list[Heartbeat], list[StaleEpoch]]:
    """The heartbeats that may reach their jobs, and the facts of those about an older epoch than their job's."""
    fresh, stale = [], []
    for b in beats:
        current = jobs[b.job_id].epoch if b.job_id else 0
        if b.job_id and is_stale(b.epoch or 0, current):
            stale.append(StaleEpoch(b.executor_id, b.job_id, b.epoch, current, "heartbeat"))
        else:
            fresh.append(b)
    return fresh, stale


async def record_heartbeats(conn: asyncpg.Connection, beats: list[Heartbeat], jobs: dict[str, Contact],
                            job_beats: list[Heartbeat], now: datetime) -> None:
    """Store ``job_beats`` (those not about a stale epoch) on their jobs (locked by ``job_contacts``), then every
    heartbeat on its executor: jobs before executors, as the evaluator writes them. One statement per table and
    batch, whatever the number of heartbeats: each row's heartbeats are folded first, exactly as writing them
    one by one in send order would have left it (services/health/domain/contact.py)."""
    changed_jobs = folded(jobs, job_beats_of(job_beats, now), fenced=True)
    if changed_jobs:
        await conn.execute(_WRITE_JOBS, *_columns([
            (k, c.at, c.progress[0], c.progress[1], c.epoch, c.step_changed_at, *c.columns) for k, c in changed_jobs]))
    by_executor = executor_beats(beats, now)
    await lock_rows(conn, "executors", "executor_id", list(by_executor))
    rows = {r["executor_id"]: _executor_contact(r) for r in await conn.fetch(_EXECUTOR_CONTACT, sorted(by_executor))}
    changed = folded(rows, by_executor, fenced=False)
    if changed:
        await conn.execute(_WRITE_EXECUTORS, *_columns([(k, c.at, *c.progress, c.step_changed_at, *c.columns)
                                                        for k, c in changed]))


def _columns(rows: list[tuple]) -> list[list]:
    return [list(column) for column in zip(*rows)]


async def note_stale(conn: asyncpg.Connection, stale: list[StaleEpoch], now: datetime) -> None:
    """Count heartbeats ignored for their old epoch against their executors."""
    await conn.executemany(
        """INSERT INTO health.stale_heartbeats AS s (executor_id, count, last_job_id, last_epoch, current_epoch,
               first_at, last_at) VALUES ($1, 1, $2, $3, $4, $5, $5)
           ON CONFLICT (executor_id) DO UPDATE SET count = s.count + 1, last_job_id = EXCLUDED.last_job_id,
               last_epoch = EXCLUDED.last_epoch, current_epoch = EXCLUDED.current_epoch, last_at = EXCLUDED.last_at""",
        [(s.executor_id, s.job_id, s.epoch, s.current, now) for s in stale])


async def record_registration(conn: asyncpg.Connection, reg: NodeRegistered) -> None:
    await conn.execute(
        """INSERT INTO health.executors (executor_id, node_id, group_name, gpus, registered_at)
           VALUES ($1, $2, $3, $4::jsonb, $5)
           ON CONFLICT (executor_id) DO UPDATE SET node_id = EXCLUDED.node_id, group_name = EXCLUDED.group_name,
               gpus = EXCLUDED.gpus, registered_at = EXCLUDED.registered_at, updated_at = now()""",
        reg.executor_id, reg.node_id, reg.group, json.dumps([g.model_dump(mode="json") for g in reg.gpus]),
        reg.time,
    )


_JOB_ROW = ("SELECT job_id, state, event_seq, epoch, executor_id, last_contact_at, step_changed_at, phase, step"
            " FROM health.jobs WHERE job_id = ANY($1::text[])")
_WRITE_JOB_EVENTS = """
UPDATE health.jobs AS j SET state = u.state, event_seq = u.event_seq, epoch = u.epoch, executor_id = u.executor_id,
    last_contact_at = u.last_contact_at, step_changed_at = u.step_changed_at, phase = u.phase, step = u.step,
    updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::text[], $6::timestamptz[], $7::timestamptz[],
            $8::text[], $9::bigint[])
     AS u(job_id, state, event_seq, epoch, executor_id, last_contact_at, step_changed_at, phase, step)
WHERE j.job_id = u.job_id
"""


async def apply_job_events(conn: asyncpg.Connection, events: list[JobEvent]) -> int:
    """Track the jobs' states (services/health/domain/tracking.py): the jobs locked in key order, each job's
    events folded in sequence order, every changed job written in one statement. The number of jobs written."""
    by_job: dict[str, list[Event]] = {}
    for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
        by_job.setdefault(ev.job_id, []).append(Event(str(ev.state), ev.seq, ev.epoch, ev.executor_id, ev.time))
    created = await lock_rows(conn, "jobs", "job_id", list(by_job))
    rows = {r["job_id"]: JobRow(*list(r)[1:]) for r in await conn.fetch(_JOB_ROW, sorted(by_job))
            if r["job_id"] not in created}
    changed = []
    for job_id in sorted(by_job):
        before = rows.get(job_id)
        after = fold_events(before, by_job[job_id])
        if after is not None and after is not before:
            changed.append((job_id, *astuple(after)))
    if changed:
        await conn.execute(_WRITE_JOB_EVENTS, *_columns(changed))
    return len(changed)


# A pass writes every changed signal of a table in one statement, each row only if the inputs it was judged on
# are still those in the table (a heartbeat that landed meanwhile is judged by the next pass). One UPDATE a row
# held the pass's row locks for a round trip per change: with thousands of executors changing at once (a fleet
# registering, a broker outage ending) a pass took tens of seconds and the heartbeat writes queued behind it.
_SET_JOB_SIGNALS = """
UPDATE health.jobs AS j SET signal = u.signal, signal_since = u.since, thresholds = u.thresholds::jsonb
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::timestamptz[], $6::timestamptz[],
            $7::text[]) AS u(job_id, signal, since, thresholds, contact, step_changed_at, state)
WHERE j.job_id = u.job_id AND j.last_contact_at IS NOT DISTINCT FROM u.contact
  AND j.step_changed_at IS NOT DISTINCT FROM u.step_changed_at AND j.state IS NOT DISTINCT FROM u.state
RETURNING j.job_id
"""
_SET_EXECUTOR_SIGNALS = """
UPDATE health.executors AS e SET signal = u.signal, signal_since = u.since, thresholds = u.thresholds::jsonb
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::timestamptz[], $6::timestamptz[])
     AS u(executor_id, signal, since, thresholds, contact, step_changed_at)
WHERE e.executor_id = u.executor_id AND e.last_heartbeat IS NOT DISTINCT FROM u.contact
  AND e.step_changed_at IS NOT DISTINCT FROM u.step_changed_at
RETURNING e.executor_id
"""


# The executors whose verdict can differ from their stored signal (``executor_signal``, judged in Python on what
# this returns): a superset, each bound taken 1 ms wide the lenient way, so PostgreSQL's interval arithmetic can
# never leave out a row Python would change. A steady fleet returns nothing: a pass reads the executors going
# silent, coming back or standing still, not all 10,000 of them, and judges only those.
_DUE_EXECUTORS = """
SELECT * FROM health.executors e
WHERE CASE e.signal
    WHEN 'no_signal' THEN e.last_heartbeat >= $1::timestamptz
    WHEN 'ok' THEN e.last_heartbeat IS NULL OR e.last_heartbeat < $2::timestamptz
        OR (e.phase = 'training' AND e.step IS NOT NULL AND e.step_changed_at < $3::timestamptz
            AND (e.progress_interval_seconds IS NULL
                 OR e.step_changed_at < $4::timestamptz - e.progress_interval_seconds * interval '2 seconds'))
    WHEN 'stuck' THEN e.last_heartbeat IS NULL OR e.last_heartbeat < $2::timestamptz
        OR NOT coalesce(e.phase = 'training' AND e.step IS NOT NULL AND e.step_changed_at < $5::timestamptz
                        AND (e.progress_interval_seconds IS NULL
                             OR e.step_changed_at < $6::timestamptz - e.progress_interval_seconds * interval '2 seconds'), false)
    ELSE true END
ORDER BY e.executor_id
"""


def due_bounds(now: datetime, th: Thresholds) -> tuple[datetime, ...]:
    """``_DUE_EXECUTORS``'s parameters: the instants its tests compare with, each 1 ms wide the lenient way (the
    stuck threshold is the larger of ``stuck_after`` and two progress intervals: both must have passed)."""
    slack, timeout, still = timedelta(milliseconds=1), timedelta(seconds=th.signal_timeout_seconds), \
        timedelta(seconds=th.stuck_after_seconds)
    return (now - timeout - slack, now - timeout + slack, now - still + slack, now + slack, now - still - slack,
            now - slack)


async def _set_signals(conn: asyncpg.Connection, table: str, key: str, update: str, rows: list[tuple]) -> set[str]:
    """Write a pass's changed signals of one table (rows in key order, key first); the keys actually written.
    The rows are locked first in key order, as the heartbeat writes take them (see ``lock_rows``): the
    UPDATE's own join would lock them in whatever order its plan reads them."""
    if not rows:
        return set()
    await conn.execute(f"SELECT 1 FROM health.{table} WHERE {key} = ANY($1::text[]) ORDER BY {key} FOR UPDATE",
                       [r[0] for r in rows])
    return {r[0] for r in await conn.fetch(update, *(list(column) for column in zip(*rows)))}


@dataclass
class Evaluation:
    executors_changed: int = 0
    jobs_changed: int = 0
    changes: list[tuple[str, str]] = field(default_factory=list)  # (job | executor, new signal or "none")


def _phase(value: str | None) -> Phase | None:
    return Phase(value) if value in Phase.__members__.values() else None


def _state(value: str | None) -> JobState | None:
    return JobState(value) if value in JobState.__members__.values() else None


def _reading_of(row: asyncpg.Record, contact: str, state: JobState | None, now: datetime, th: Thresholds,
                judge=job_signal) -> SignalReading:
    # A step that was never reported has no "last change": such a workload has no progress signal.
    step_changed = row["step_changed_at"] if row["step"] is not None else None
    return judge(state, row[contact], step_changed, _phase(row["phase"]), now, th,
                 progress_interval_seconds=row["progress_interval_seconds"])


async def evaluate(pool: asyncpg.Pool, subjects: Subjects, th: Thresholds, now: datetime) -> Evaluation:
    """Re-derive every signal that can have changed (every job's; the executors ``_DUE_EXECUTORS`` returns);
    write the changed ones, with a SignalChanged event per job, in one transaction.

    Each write is conditional on the inputs read (contact time, step time, state) being unchanged, so a
    heartbeat that lands between the read and the write is never overwritten with a verdict made without it;
    the next pass judges it.
    """
    result = Evaluation()
    async with pool.acquire() as conn, conn.transaction():
        jobs = await conn.fetch(
            "SELECT * FROM health.jobs WHERE state IS NULL OR state <> ALL($1::text[]) OR signal IS NOT NULL"
            " ORDER BY job_id",  # lock order: see lock_rows
            _TERMINAL,
        )
        job_state = {r["job_id"]: _state(r["state"]) for r in jobs}
        changed_jobs = []
        for row in jobs:
            reading = _reading_of(row, "last_contact_at", job_state[row["job_id"]], now, th)
            if reading.signal != _signal(row["signal"]):
                changed_jobs.append((row, reading, reading.since or now))
        written = await _set_signals(conn, "jobs", "job_id", _SET_JOB_SIGNALS, [
            (row["job_id"], reading.signal and str(reading.signal), since, _thresholds(reading),
             row["last_contact_at"], row["step_changed_at"], row["state"]) for row, reading, since in changed_jobs])
        events = []
        for row, reading, since in changed_jobs:
            if row["job_id"] in written:
                result.jobs_changed += 1
                result.changes.append(("job", str(reading.signal or "none")))
                events.append((subjects.job_event(row["job_id"], "signal"), SignalChanged(
                    job_id=row["job_id"], executor_id=row["executor_id"], signal=reading.signal,
                    previous=_signal(row["signal"]), since=since,
                    seconds_since_heartbeat=reading.seconds_since_heartbeat,
                    seconds_since_step_change=reading.seconds_since_step_change,
                    no_signal_after_seconds=reading.no_signal_after, stuck_after_seconds=reading.stuck_after,
                )))
        await outbox.add(conn, SCHEMA, events)

        changed_executors = []
        for row in await conn.fetch(_DUE_EXECUTORS, *due_bounds(now, th)):
            state = job_state.get(row["job_id"]) if row["job_id"] else None
            reading = _reading_of(row, "last_heartbeat", state, now, th, judge=executor_signal)
            if reading.signal != _signal(row["signal"]):
                changed_executors.append((row["executor_id"], reading.signal and str(reading.signal),
                                          reading.since or now, _thresholds(reading), row["last_heartbeat"],
                                          row["step_changed_at"]))
        written = await _set_signals(conn, "executors", "executor_id", _SET_EXECUTOR_SIGNALS, changed_executors)
        result.executors_changed = len(written)
        result.changes += [("executor", str(signal or "none")) for key, signal, *_ in changed_executors
                           if key in written]
    return result


def _signal(value: str | None) -> Signal | None:
    return Signal(value) if value else None


def _thresholds(reading: SignalReading) -> str:
    return json.dumps({"no_signal_after_seconds": reading.no_signal_after,
                       "stuck_after_seconds": reading.stuck_after})
