"""The health service's store (schema ``health``), one package: this module holds the schema's name and the
tables heartbeats, registrations and job events write (executors and jobs, as the handlers store them);
``signals`` the evaluator's reads and writes of the same tables, ``nodes`` the node rows, ``guards`` the groups'
replacement breakers, ``runs`` the check runs. Every function takes a connection the caller holds; nothing here
decides (the rules are in ../domain/)."""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime

import asyncpg

from libs.contracts.jobs import JobEvent
from libs.contracts.nodes import NodeRegistered
from libs.contracts.telemetry import Heartbeat
from libs.runtime.fencing import StaleEpoch, is_stale

log = logging.getLogger(__name__)

SCHEMA = "health"
EVALUATOR = "evaluator"  # the signal evaluator's wake channel name (libs/runtime/wake.py): stored heartbeats wake it

# One heartbeat's upsert, for every row of a round at once (``rounds``): the heartbeat's send time becomes the
# row's last contact, and restarts the stuck clock when the step, the phase, the job or its epoch changed. A
# heartbeat older than the row's last one (late, or out of order) is ignored, and for a job one about an older
# lease epoch than the job's (a race with job events; the handler has already counted those it could see).
_UPSERT_EXECUTORS = """
INSERT INTO health.executors AS e (executor_id, node_id, group_name, gpus, accepting, phase, step, job_id, epoch,
    last_heartbeat, step_changed_at, heartbeat_interval_seconds, progress_interval_seconds, updated_at)
SELECT u.executor_id, u.node_id, u.group_name, u.gpus::jsonb, u.accepting, u.phase, u.step, u.job_id, u.epoch,
    u.sent_at, u.sent_at, u.heartbeat_interval_seconds, u.progress_interval_seconds, now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::text[], $7::bigint[], $8::text[],
            $9::int[], $10::timestamptz[], $11::float8[], $12::float8[])
     AS u(executor_id, node_id, group_name, gpus, accepting, phase, step, job_id, epoch, sent_at,
          heartbeat_interval_seconds, progress_interval_seconds)
ORDER BY u.executor_id
ON CONFLICT (executor_id) DO UPDATE SET
    node_id = EXCLUDED.node_id, group_name = EXCLUDED.group_name, gpus = EXCLUDED.gpus,
    accepting = EXCLUDED.accepting, phase = EXCLUDED.phase, step = EXCLUDED.step, job_id = EXCLUDED.job_id,
    epoch = EXCLUDED.epoch, last_heartbeat = EXCLUDED.last_heartbeat,
    step_changed_at = CASE
        WHEN e.step IS DISTINCT FROM EXCLUDED.step OR e.phase IS DISTINCT FROM EXCLUDED.phase
          OR e.job_id IS DISTINCT FROM EXCLUDED.job_id OR e.epoch IS DISTINCT FROM EXCLUDED.epoch
          OR e.step_changed_at IS NULL
        THEN EXCLUDED.last_heartbeat ELSE e.step_changed_at END,
    heartbeat_interval_seconds = EXCLUDED.heartbeat_interval_seconds,
    progress_interval_seconds = EXCLUDED.progress_interval_seconds, updated_at = now()
WHERE e.last_heartbeat IS NULL OR EXCLUDED.last_heartbeat >= e.last_heartbeat
"""
_UPSERT_JOB_CONTACTS = """
INSERT INTO health.jobs AS j (job_id, epoch, executor_id, last_contact_at, phase, step, step_changed_at,
    progress_interval_seconds, updated_at)
SELECT u.job_id, u.epoch, u.executor_id, u.sent_at, u.phase, u.step, u.sent_at, u.progress_interval_seconds, now()
FROM unnest($1::text[], $2::int[], $3::text[], $4::timestamptz[], $5::text[], $6::bigint[], $7::float8[])
     AS u(job_id, epoch, executor_id, sent_at, phase, step, progress_interval_seconds)
ORDER BY u.job_id
ON CONFLICT (job_id) DO UPDATE SET
    epoch = EXCLUDED.epoch, executor_id = EXCLUDED.executor_id, last_contact_at = EXCLUDED.last_contact_at,
    phase = EXCLUDED.phase, step = EXCLUDED.step,
    step_changed_at = CASE
        WHEN j.step IS DISTINCT FROM EXCLUDED.step OR j.phase IS DISTINCT FROM EXCLUDED.phase
          OR j.epoch IS DISTINCT FROM EXCLUDED.epoch OR j.step_changed_at IS NULL
        THEN EXCLUDED.last_contact_at ELSE j.step_changed_at END,
    progress_interval_seconds = EXCLUDED.progress_interval_seconds, updated_at = now()
WHERE EXCLUDED.epoch >= j.epoch AND (j.last_contact_at IS NULL OR EXCLUDED.last_contact_at >= j.last_contact_at)
"""


def rounds(rows: list[tuple]) -> list[list[tuple]]:
    """Rows (key first; each key's in the order they must be applied) split so that no key is twice in a round:
    round k holds the k-th row of every key. One upsert cannot touch a row twice, and a row's updates must land
    in order, as one statement per row applied them: written round by round they do. The first round names every
    key, so it takes all the batch's row locks, in key order (its ORDER BY), as the evaluator takes them: two
    writers never wait on each other in a cycle (a deadlock aborted the evaluator's pass under load). Later
    rounds touch only rows already held. A fleet's batch is one round (one heartbeat per executor)."""
    out: list[list[tuple]] = []
    seen: dict[object, int] = {}
    for row in rows:
        k = seen.get(row[0], 0)
        seen[row[0]] = k + 1
        if k == len(out):
            out.append([])
        out[k].append(row)
    return out


async def job_epochs(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, int]:
    rows = await conn.fetch("SELECT job_id, epoch FROM health.jobs WHERE job_id = ANY($1::text[])", job_ids)
    return {r["job_id"]: r["epoch"] for r in rows}


def split_stale(beats: list[Heartbeat], epochs: dict[str, int]) -> tuple[list[Heartbeat], list[StaleEpoch]]:
    """The heartbeats that may reach their jobs, and the facts of those about an older epoch than their job's."""
    fresh, stale = [], []
    for b in beats:
        current = epochs.get(b.job_id, 0) if b.job_id else 0
        if b.job_id and is_stale(b.epoch or 0, current):
            stale.append(StaleEpoch(b.executor_id, b.job_id, b.epoch, current, "heartbeat"))
        else:
            fresh.append(b)
    return fresh, stale


def executor_rows(beats: list[Heartbeat], now: datetime) -> list[tuple]:
    """The executor upserts of a batch, oldest first (stream order within one send time). The heartbeat's own
    send time is used, clamped to now against a fast executor clock, so heartbeats that waited in the stream
    while this service was down are not mistaken for fresh ones."""
    return [(b.executor_id, b.node_id, b.group, _gpus(b), b.accepting, str(b.phase), b.step, b.job_id, b.epoch,
             min(b.sent_at, now), b.interval_seconds, b.progress_interval_seconds)
            for b in sorted(beats, key=lambda b: b.sent_at)]


def job_rows(job_beats: list[Heartbeat], now: datetime) -> list[tuple]:
    """The job contacts of a batch, oldest first (see ``executor_rows``); only heartbeats about a job."""
    return [(b.job_id, b.epoch or 0, b.executor_id, min(b.sent_at, now), str(b.phase), b.step,
             b.progress_interval_seconds) for b in sorted(job_beats, key=lambda b: b.sent_at) if b.job_id]


def _gpus(b: Heartbeat) -> str:
    return json.dumps([g.model_dump(mode="json") for g in b.gpus]) if b.gpus else "[]"  # most send none


async def record_heartbeats(conn: asyncpg.Connection, beats: list[Heartbeat], job_beats: list[Heartbeat],
                            now: datetime) -> None:
    """Store ``job_beats`` (those not about a stale epoch) on their jobs, then every heartbeat on its executor:
    jobs before executors, as the evaluator writes them. One statement per table and round (``rounds``: one
    round unless an executor sent several heartbeats in the batch), each row's heartbeats applied in send order
    exactly as one upsert per heartbeat did."""
    for part in rounds(job_rows(job_beats, now)):
        await conn.execute(_UPSERT_JOB_CONTACTS, *_columns(part))
    for part in rounds(executor_rows(beats, now)):
        await conn.execute(_UPSERT_EXECUTORS, *_columns(part))


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


def registration_rows(regs: list[NodeRegistered]) -> list[tuple]:
    """A batch's registrations as executor rows in key order (the lock order: see ``rounds``), each executor's
    in stream order, so its last registration is applied last."""
    return [(r.executor_id, r.node_id, r.group, json.dumps([g.model_dump(mode="json") for g in r.gpus]), r.time)
            for r in sorted(regs, key=lambda r: r.executor_id)]


async def record_registrations(conn: asyncpg.Connection, regs: list[NodeRegistered]) -> None:
    await conn.executemany(
        """INSERT INTO health.executors (executor_id, node_id, group_name, gpus, registered_at)
           VALUES ($1, $2, $3, $4::jsonb, $5)
           ON CONFLICT (executor_id) DO UPDATE SET node_id = EXCLUDED.node_id, group_name = EXCLUDED.group_name,
               gpus = EXCLUDED.gpus, registered_at = EXCLUDED.registered_at, updated_at = now()""",
        registration_rows(regs))


# One job event's upsert, for every job of a round at once (``rounds``). A new lease epoch resets the job's
# contact to the event: the new executor has one signal timeout to send its first heartbeat, and the old
# executor's numbers no longer describe it. An event at or below the job's last one is a redelivery: ignored.
_UPSERT_JOB_EVENTS = """
INSERT INTO health.jobs AS j (job_id, state, event_seq, epoch, executor_id, last_contact_at, step_changed_at)
SELECT u.job_id, u.state, u.seq, COALESCE(u.epoch, 0), u.executor_id, u.time, u.time
FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::text[], $6::timestamptz[])
     AS u(job_id, state, seq, epoch, executor_id, time)
ORDER BY u.job_id
ON CONFLICT (job_id) DO UPDATE SET
    state = EXCLUDED.state, event_seq = EXCLUDED.event_seq,
    epoch = GREATEST(j.epoch, EXCLUDED.epoch),
    executor_id = COALESCE(EXCLUDED.executor_id, j.executor_id),
    last_contact_at = CASE WHEN EXCLUDED.epoch > j.epoch THEN EXCLUDED.last_contact_at ELSE j.last_contact_at END,
    step_changed_at = CASE WHEN EXCLUDED.epoch > j.epoch THEN EXCLUDED.step_changed_at ELSE j.step_changed_at END,
    phase = CASE WHEN EXCLUDED.epoch > j.epoch THEN NULL ELSE j.phase END,
    step = CASE WHEN EXCLUDED.epoch > j.epoch THEN NULL ELSE j.step END,
    updated_at = now()
WHERE EXCLUDED.event_seq > j.event_seq
"""


async def apply_job_events(conn: asyncpg.Connection, events: list[JobEvent]) -> None:
    """Track the jobs' states: each job's events in sequence order, one statement per round (``rounds``), all in
    one transaction. A batch of one round (every job once: events arrive one at a time as jobs move) is a single
    statement, atomic on its own: sent without BEGIN and COMMIT, one round trip where there were three."""
    rows = [(ev.job_id, str(ev.state), ev.seq, ev.epoch, ev.executor_id, ev.time)
            for ev in sorted(events, key=lambda e: e.seq)]
    parts = rounds(rows)
    alone = len(parts) == 1 or conn.is_in_transaction()
    async with contextlib.nullcontext() if alone else conn.transaction():
        for part in parts:
            await conn.execute(_UPSERT_JOB_EVENTS, *_columns(part))
