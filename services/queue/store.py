"""The queue's PostgreSQL edge: jobs in and out of rows, transitions written with their events and outbox
messages in one transaction, command de-duplication, executor snapshots from heartbeats.

Every function takes a connection the caller holds inside a transaction; nothing here commits on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from libs.contracts.envelope import Envelope
from libs.contracts.jobs import JobEvent, JobSpec, JobState
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import StepReport
from libs.runtime import outbox, tracing, wake
from libs.runtime.fencing import StaleEpoch

from .domain.facts import GangWorker, Job, Transition, evolve, made
from .domain.wakes import PLACEMENT, queues_a_job

SCHEMA = "queue"
T = f'"{SCHEMA}"'

_JOB_COLUMNS = ("id", "name", "owner", "state", "spec", "attempts", "attempt_number", "lease_epoch", "executor_id",
                "workers", "lease_expires_at", "last_step", "total_steps", "step_seconds", "step_samples",
                "last_checkpoint", "reason", "error", "stop_requested", "ceiling_history", "event_seq",
                "created_at", "updated_at", "gang", "rendezvous", "ready_deadline", "admitted_at", "backoff_count",
                "next_admission_at", "on_node_failure", "org", "project", "priority", "node_group", "devices")
_JSON_COLUMNS = {"spec", "attempts", "last_checkpoint", "ceiling_history", "gang"}
SELECT_JOB = f"SELECT {', '.join(_JOB_COLUMNS)} FROM {T}.jobs"


def _loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def job_from_row(row: asyncpg.Record) -> Job:
    return made(dict(
        id=row["id"], name=row["name"], owner=row["owner"], state=JobState(row["state"]),
        spec=JobSpec.model_validate_json(row["spec"]), attempts=_loads(row["attempts"]),
        attempt_number=row["attempt_number"], lease_epoch=row["lease_epoch"], executor_id=row["executor_id"],
        workers=tuple(row["workers"]), lease_expires_at=row["lease_expires_at"], last_step=row["last_step"],
        total_steps=row["total_steps"], step_seconds=row["step_seconds"], step_samples=row["step_samples"],
        last_checkpoint=_loads(row["last_checkpoint"]), reason=row["reason"], error=row["error"],
        stop_requested=row["stop_requested"], ceiling_history=tuple(_loads(row["ceiling_history"])),
        event_seq=row["event_seq"], created_at=row["created_at"], updated_at=row["updated_at"],
        gang=gang_from_json(_loads(row["gang"])), rendezvous=row["rendezvous"], ready_deadline=row["ready_deadline"],
        admitted_at=row["admitted_at"], backoff_count=row["backoff_count"],
        next_admission_at=row["next_admission_at"], on_node_failure=row["on_node_failure"],
        org=row["org"], project=row["project"], priority=row["priority"], node_group=row["node_group"],
        devices=row["devices"],
    ))


def gang_from_json(items: list[dict[str, Any]] | None) -> tuple[GangWorker, ...]:
    def when(value: str | None) -> datetime | None:
        return None if value is None else datetime.fromisoformat(value)

    return tuple(GangWorker(i["executor_id"], when(i.get("lease_expires_at")), when(i.get("ready_at")), i.get("ended"))
                 for i in items or ())


def gang_to_json(gang: tuple[GangWorker, ...]) -> str:
    return json.dumps([{"executor_id": w.executor_id, "ended": w.ended,
                        "lease_expires_at": w.lease_expires_at.isoformat() if w.lease_expires_at else None,
                        "ready_at": w.ready_at.isoformat() if w.ready_at else None} for w in gang])


def _job_values(job: Job) -> list[Any]:
    values = {
        **{c: getattr(job, c) for c in _JOB_COLUMNS},
        "state": job.state.value,
        "spec": job.spec.model_dump_json(),
        "attempts": json.dumps(job.attempts),
        "workers": list(job.workers),
        "last_checkpoint": None if job.last_checkpoint is None else json.dumps(job.last_checkpoint),
        "ceiling_history": json.dumps(list(job.ceiling_history)),
        "gang": gang_to_json(job.gang),
    }
    return [values[c] for c in _JOB_COLUMNS]


_PLACEHOLDERS = ", ".join(f"${i}::jsonb" if c in _JSON_COLUMNS else f"${i}" for i, c in enumerate(_JOB_COLUMNS, 1))
_INSERT_JOB = f"INSERT INTO {T}.jobs ({', '.join(_JOB_COLUMNS)}) VALUES ({_PLACEHOLDERS})"
_UPSERT_JOB = (
    f"{_INSERT_JOB} ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _JOB_COLUMNS if c not in ("id", "created_at"))
)


async def load_job(conn: asyncpg.Connection, job_id: str, *, lock: bool = False) -> Job | None:
    row = await conn.fetchrow(f"{SELECT_JOB} WHERE id = $1{' FOR UPDATE' if lock else ''}", job_id)
    return None if row is None else job_from_row(row)


async def load_jobs(conn: asyncpg.Connection, job_ids: Sequence[str], *, lock: bool = False) -> dict[str, Job]:
    """The jobs of these ids that exist (locked in id order, so two batches never wait on each other in a cycle)."""
    rows = await conn.fetch(f"{SELECT_JOB} WHERE id = ANY($1::text[]) ORDER BY id{' FOR UPDATE' if lock else ''}",
                            list(job_ids))
    return {r["id"]: job_from_row(r) for r in rows}


@dataclass(frozen=True)
class Staged:
    """A transition ready to store: the job as it will be stored, its numbered events, its outbox rows (with the
    trace context current when it was staged)."""

    job: Job
    events: list[JobEvent]
    outbox: list[outbox.OutboxRow]


def stage(subjects: Subjects, transition: Transition, now: datetime,
          messages: Iterable[tuple[str, Envelope]] = (), *, trusted: bool = False) -> Staged:
    """Number the transition's events and make its outbox rows (its events, then ``messages``); nothing written.
    ``trusted``: the events' values are the queue's own (a grant's), made without validating them again."""
    job = transition.job
    events: list[JobEvent] = []
    job_event = JobEvent.trusted if trusted else JobEvent
    for draft in transition.events:
        events.append(job_event(job_id=job.id, seq=job.event_seq + len(events) + 1, event=draft.event,
                               state=draft.state, previous_state=draft.previous_state, reason=draft.reason,
                               epoch=draft.epoch, executor_id=draft.executor_id, detail=draft.detail, time=now))
    out = [(subjects.job_event(e.job_id, e.event.value), e) for e in events]
    return Staged(evolve(job, event_seq=job.event_seq + len(events)), events, outbox.rows_of([*out, *messages]))


async def write(conn: asyncpg.Connection, subjects: Subjects, transition: Transition, now: datetime,
                messages: Iterable[tuple[str, Envelope]] = (), *, new: bool = False) -> list[JobEvent]:
    """Store the job after a transition, number and store its events, and queue them with ``messages`` in the
    outbox, all in the caller's transaction: the job, its history and what is announced never disagree.

    ``new``: the job must not exist yet (a plain insert, so two submits racing on one job id cannot both win)."""
    staged = stage(subjects, transition, now, messages)
    await write_staged(conn, subjects, [staged], new=new)
    if new:
        await remember_trace(conn, staged.job.id, tracing.carrier())
    return staged.events


async def write_staged(conn: asyncpg.Connection, subjects: Subjects, staged: Sequence[Staged], *,
                       new: bool = False) -> None:
    """Store staged transitions in three pipelined statements whatever their number: the jobs (a job staged
    twice, as by two reports of one batch, written once as last staged), their events, their outbox rows in the
    order staged (each job's events before its messages, as ``write``)."""
    if not staged:
        return
    last = {s.job.id: s.job for s in staged}
    await conn.executemany(_INSERT_JOB if new else _UPSERT_JOB, [_job_values(job) for job in last.values()])
    await _write_events(conn, subjects, staged)


_EVENT_TYPES = ("text", "int", "text", "text", "text", "text", "int", "text", "text", "timestamptz", "text")


def _insert_events_sql(first: int) -> str:
    """The events of many transitions in one INSERT (arrays, a column each), its parameters numbered from
    ``first``."""
    arrays = ", ".join(f"${first + i}::{t}[]" for i, t in enumerate(_EVENT_TYPES))
    return (f"INSERT INTO {T}.job_events (job_id, seq, event, state, previous_state, reason, epoch, executor_id,"
            f" detail, time, msg_id) SELECT j, s, e, st, ps, r, ep, ex, d::jsonb, t, m FROM unnest({arrays})"
            " AS e(j, s, e, st, ps, r, ep, ex, d, t, m)")


def events_statement(events: Sequence[JobEvent], rows: list[outbox.OutboxRow],
                     wake_channel: str | None) -> tuple[str, list[Any]] | None:
    """One statement (and its parameters) that stores ``events``, queues the outbox ``rows`` in their order and,
    with a ``wake_channel``, wakes its listener at commit: each part a data-modifying CTE, so what took three
    round trips in every transition's transaction takes one. None when there is nothing to do. Pure."""
    parts, args = [], []
    if events:
        parts.append(f"events AS ({_insert_events_sql(len(args) + 1)})")
        args += [list(c) for c in zip(*((e.job_id, e.seq, e.event.value, e.state.value,
                                         e.previous_state and e.previous_state.value, e.reason, e.epoch,
                                         e.executor_id, json.dumps(e.detail), e.time, e.id) for e in events),
                                      strict=True)]
    if rows:
        parts.append(f"queued AS ({outbox.insert_rows_sql(SCHEMA, len(args) + 1)})")
        args += outbox.row_arrays(rows)
    if not parts and wake_channel is None:
        return None
    with_ = f"WITH {', '.join(parts)} " if parts else ""
    if wake_channel is None:
        return f"{with_}SELECT 1", args
    return f"{with_}SELECT pg_notify(${len(args) + 1}, '')", [*args, wake_channel]


async def _write_events(conn: asyncpg.Connection, subjects: Subjects, staged: Sequence[Staged]) -> None:
    """The staged transitions' events, then their outbox rows (each job's events before its messages), and the
    placement's wake-up when one queues a job (it runs as soon as this commits, not at its next tick): one
    statement (``events_statement``)."""
    events = [e for s in staged for e in s.events]
    found = events_statement(events, [r for s in staged for r in s.outbox],
                             wake.channel(subjects.prefix, PLACEMENT) if queues_a_job(events) else None)
    if found is not None:
        sql, args = found
        await conn.execute(sql, *args)


# What a grant changes of a queued job (``lifecycle.on_granted``, ``gang.on_granted``); a placement pass writes
# only these (``write_grants``), with the node group and devices its organisation's quota counts, not the
# whole row (the spec, the history) as ``write`` does.
_GRANT_COLUMNS = ("state", "lease_epoch", "executor_id", "workers", "lease_expires_at", "attempt_number", "reason",
                  "stop_requested", "updated_at", "event_seq", "gang", "rendezvous", "ready_deadline", "admitted_at",
                  "next_admission_at", "on_node_failure")
_GRANT_TYPES = {"state": "text", "lease_epoch": "int", "executor_id": "text", "workers": "text",
                "lease_expires_at": "timestamptz", "attempt_number": "int", "reason": "text",
                "stop_requested": "text", "updated_at": "timestamptz", "event_seq": "int", "gang": "text",
                "rendezvous": "text", "ready_deadline": "timestamptz", "admitted_at": "timestamptz",
                "next_admission_at": "timestamptz", "on_node_failure": "text"}
# One statement for a pass's grants: a column each as an array ($1 the ids, then the grant's columns, the node
# group and devices); workers as a JSON list (an array of arrays would be flattened), the gang as JSON. The jobs
# are found by primary key (rows the pass holds locked).
_WRITE_GRANTS = (f"UPDATE {T}.jobs j SET "
                 + ", ".join("workers = ARRAY(SELECT w FROM jsonb_array_elements_text(g.workers::jsonb)"
                             " WITH ORDINALITY AS x(w, n) ORDER BY n)" if c == "workers"
                             else f"{c} = g.{c}{'::jsonb' if c in _JSON_COLUMNS else ''}" for c in _GRANT_COLUMNS)
                 + ", node_group = g.node_group, devices = g.devices, waiting = NULL FROM unnest($1::text[], "
                 + ", ".join(f"${i}::{_GRANT_TYPES[c]}[]" for i, c in enumerate(_GRANT_COLUMNS, 2))
                 + f", ${len(_GRANT_COLUMNS) + 2}::text[], ${len(_GRANT_COLUMNS) + 3}::int[])"
                 + f" AS g(id, {', '.join(_GRANT_COLUMNS)}, node_group, devices)"
                 + " WHERE j.id = g.id")


_NOT_GRANTED = tuple(c for c in _JOB_COLUMNS if c not in _GRANT_COLUMNS)


def only_granted(before: Job, after: Job) -> bool:
    """Whether ``after`` differs from ``before`` in a grant's columns alone (``write_grants`` writes no other).
    A transition copies the fields it leaves alone (``evolve``): the same objects, compared by identity first."""
    was, now = before.__dict__, after.__dict__
    return all(was[c] is now[c] or was[c] == now[c] for c in _NOT_GRANTED)


async def write_grants(conn: asyncpg.Connection, subjects: Subjects,
                       grants: Sequence[tuple[Staged, str, int]]) -> None:
    """Store a placement pass's staged grants (distinct jobs, each changed by ``only_granted`` columns), each with
    the node group and devices its organisation's quota now counts, and its waiting reason cleared: three
    statements whatever their number (the jobs, their events, their outbox rows), each of arrays."""
    if not grants:
        return
    rows = [(s.job.id, *_grant_values(s.job), group, devices) for s, group, devices in grants]
    await conn.execute(_WRITE_GRANTS, *(list(c) for c in zip(*rows, strict=True)))
    await _write_events(conn, subjects, [s for s, _, _ in grants])


def _grant_values(job: Job) -> list[Any]:
    """The values of the grant's columns, as ``_job_values`` makes them but the workers as a JSON list (one element
    of ``_WRITE_GRANTS``' text array); the spec and history not serialised."""
    values = {c: getattr(job, c) for c in _GRANT_COLUMNS}
    values.update(state=job.state.value, workers=json.dumps(job.workers), gang=gang_to_json(job.gang))
    return [values[c] for c in _GRANT_COLUMNS]


async def remember_trace(conn: asyncpg.Connection, job_id: str, context: dict[str, str]) -> None:
    """Keep the trace a job was submitted under, for its grants to continue (nothing when untraced)."""
    await remember_traces(conn, [(job_id, context)])


async def remember_traces(conn: asyncpg.Connection, contexts: Sequence[tuple[str, dict[str, str]]]) -> None:
    """``remember_trace`` for many jobs in one pipelined statement (the untraced ones are left out)."""
    rows = [(job_id, c["traceparent"][:256], (c.get("tracestate") or None) and c["tracestate"][:512])
            for job_id, c in contexts if c.get("traceparent")]
    if rows:
        await conn.executemany(f"INSERT INTO {T}.job_traces (job_id, traceparent, tracestate) VALUES ($1, $2, $3)"
                               " ON CONFLICT (job_id) DO NOTHING", rows)


async def traces_of(conn: asyncpg.Connection, job_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """The submit's trace context of each job that has one."""
    rows = await conn.fetch(f"SELECT job_id, traceparent, tracestate FROM {T}.job_traces"
                            " WHERE job_id = ANY($1::text[])", list(job_ids))
    return {r["job_id"]: {k: r[k] for k in ("traceparent", "tracestate") if r[k]} for r in rows}


async def note_stale(conn: asyncpg.Connection, stale: StaleEpoch, now: datetime) -> None:
    """Count a message ignored for its old lease epoch against the executor that sent it."""
    await conn.execute(
        f"INSERT INTO {T}.stale_messages AS s (executor_id, count, last_job_id, last_epoch, last_reason, first_at,"
        " last_at) VALUES ($1, 1, $2, $3, $4, $5, $5) ON CONFLICT (executor_id) DO UPDATE SET count = s.count + 1,"
        " last_job_id = EXCLUDED.last_job_id, last_epoch = EXCLUDED.last_epoch, last_reason = EXCLUDED.last_reason,"
        " last_at = EXCLUDED.last_at", stale.executor_id, stale.job_id, stale.epoch, stale.reason[:500], now)


async def save_lease(conn: asyncpg.Connection, job: Job) -> None:
    """A renewal touches only the expiry (and a gang's per-worker leases): cheaper than a full write, and it
    races nothing else."""
    await conn.execute(f"UPDATE {T}.jobs SET lease_expires_at = $2, gang = $3::jsonb WHERE id = $1", job.id,
                       job.lease_expires_at, gang_to_json(job.gang))


# -- commands ---------------------------------------------------------------------------------------------

async def answered(conn: asyncpg.Connection, command_id: str) -> dict[str, Any] | None:
    """The stored outcome of a command already processed, or None."""
    return _loads(await conn.fetchval(f"SELECT outcome FROM {T}.processed_commands WHERE command_id = $1",
                                      command_id))


async def db_now(conn: asyncpg.Connection) -> datetime:
    """The database's clock, the one clock of lease deadlines, their expiry and executors' freshness: replicas'
    wall clocks may disagree by minutes, and a lease set by one and judged by another must mean the same time.
    ``clock_timestamp()``, not ``now()``: a transaction that waited on a lock must not judge with a stale time."""
    return await conn.fetchval("SELECT clock_timestamp()")


# -- nodes (the health service's node events) ---------------------------------------------------------------

async def apply_node_event(conn: asyncpg.Connection, node_id: str, executor_id: str | None, group: str, state: str,
                           schedulable: bool, reason: str | None, seq: int, *, boot_id: str | None = None) -> None:
    """Keep the latest node event per node (an older, redelivered one does not overwrite a newer one), with the
    agent start it is about (``boot_id``: placement's ``SCHEDULABLE_NODE`` matches it with the heartbeats')."""
    await conn.execute(
        f"INSERT INTO {T}.nodes AS n (node_id, executor_id, group_name, state, schedulable, reason, seq, boot_id)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (node_id) DO UPDATE SET"
        " executor_id = EXCLUDED.executor_id, group_name = EXCLUDED.group_name, state = EXCLUDED.state,"
        " schedulable = EXCLUDED.schedulable, reason = EXCLUDED.reason, seq = EXCLUDED.seq,"
        " boot_id = EXCLUDED.boot_id, updated_at = now() WHERE n.seq < EXCLUDED.seq",
        node_id, executor_id, group, state, schedulable, reason, seq, boot_id)


# -- gangs and steps ----------------------------------------------------------------------------------------

async def running_gangs_of(conn: asyncpg.Connection, executor_id: str) -> list[str]:
    rows = await conn.fetch(f"SELECT id FROM {T}.jobs WHERE state = 'running' AND cardinality(workers) > 1"
                            " AND $1 = ANY(workers)", executor_id)
    return [r["id"] for r in rows]


async def record_steps(conn: asyncpg.Connection, reports: Sequence[StepReport]) -> None:
    """Accepted step reports into their jobs' step history, one pipelined statement (a redelivery stored once)."""
    if reports:
        await conn.executemany(
            "INSERT INTO queue.job_steps (job_id, epoch, step, loss, step_seconds, metrics, time)"
            " VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7) ON CONFLICT DO NOTHING",
            [(r.job_id, r.epoch, r.step, r.loss, r.step_seconds, json.dumps(r.metrics), r.time) for r in reports])


async def jobs_by_state(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, int]:
    rows = await conn.fetch(f"SELECT state, count(*) AS n FROM {T}.jobs GROUP BY state")
    return {r["state"]: r["n"] for r in rows}
