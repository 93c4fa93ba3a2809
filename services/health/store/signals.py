"""The signal evaluator's reads and writes (evaluator.py decides): the executors and jobs whose signal can have
changed, and a pass's changed signals with their events, all in the evaluator's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from libs.contracts.envelope import Envelope
from libs.runtime import outbox

from . import SCHEMA
from ..domain.signals import SIGNAL_APPLIES

APPLIES = sorted(str(s) for s in SIGNAL_APPLIES)  # the job states a signal applies in

# A pass writes every changed signal of a table in one statement, each row only if the inputs it was judged on
# are still those in the table (a heartbeat that landed meanwhile is judged by the next pass). One UPDATE a row
# held the pass's row locks for a round trip per change: with thousands of executors changing at once (a fleet
# registering, a broker outage ending) a pass took tens of seconds and the heartbeat writes queued behind it.
SET_JOB_SIGNALS = """
UPDATE health.jobs AS j SET signal = u.signal, signal_since = u.since, thresholds = u.thresholds::jsonb
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::timestamptz[], $6::timestamptz[],
            $7::text[]) AS u(job_id, signal, since, thresholds, contact, step_changed_at, state)
WHERE j.job_id = u.job_id AND j.last_contact_at IS NOT DISTINCT FROM u.contact
  AND j.step_changed_at IS NOT DISTINCT FROM u.step_changed_at AND j.state IS NOT DISTINCT FROM u.state
RETURNING j.job_id
"""
SET_EXECUTOR_SIGNALS = """
UPDATE health.executors AS e SET signal = u.signal, signal_since = u.since, thresholds = u.thresholds::jsonb
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::timestamptz[], $6::timestamptz[])
     AS u(executor_id, signal, since, thresholds, contact, step_changed_at)
WHERE e.executor_id = u.executor_id AND e.last_heartbeat IS NOT DISTINCT FROM u.contact
  AND e.step_changed_at IS NOT DISTINCT FROM u.step_changed_at
RETURNING e.executor_id
"""


# The rows whose verdict can differ from their stored signal (``job_signal``, judged by the evaluator on what
# these return): a superset, each bound taken 1 ms wide the lenient way, so PostgreSQL's interval arithmetic can
# never leave out a row Python would change. A steady fleet returns nothing: a pass reads the executors and jobs going
# silent, coming back or standing still, not all 10,000 of them, and judges only those. ``contact`` is the
# row's last heartbeat (executors) or contact (jobs).
def _liveness_due(a: str, contact: str) -> str:
    standing = (f"{a}.phase = 'training' AND {a}.step IS NOT NULL AND {a}.step_changed_at < {{still}}::timestamptz"
                f" AND ({a}.progress_interval_seconds IS NULL OR {a}.step_changed_at < {{now}}::timestamptz"
                f" - {a}.progress_interval_seconds * interval '2 seconds')")
    silent = f"{a}.{contact} IS NULL OR {a}.{contact} < $2::timestamptz"
    return f"""CASE {a}.signal
    WHEN 'no_signal' THEN {a}.{contact} >= $1::timestamptz
    WHEN 'ok' THEN {silent} OR ({standing.format(still="$3", now="$4")})
    WHEN 'stuck' THEN {silent} OR NOT coalesce({standing.format(still="$5", now="$6")}, false)
    ELSE true END"""


DUE_EXECUTORS = f"SELECT * FROM health.executors e WHERE {_liveness_due('e', 'last_heartbeat')} ORDER BY e.executor_id"
# A job's signal applies only while it runs (``SIGNAL_APPLIES``; a job no event has described yet is judged on
# its contacts alone): any other job is due only while it still carries a signal, to clear it.
DUE_JOBS = f"""SELECT * FROM health.jobs j
WHERE CASE WHEN j.state IS NULL OR j.state = ANY($7::text[]) THEN {_liveness_due('j', 'last_contact_at')}
           ELSE j.signal IS NOT NULL END
ORDER BY j.job_id"""


async def due_jobs(conn: asyncpg.Connection, bounds: Sequence[datetime]) -> list[asyncpg.Record]:
    """The jobs whose signal can have changed (``DUE_JOBS``; ``bounds``: domain/signals.py ``due_bounds``), in key
    order: the lock order (see ``store.rounds``)."""
    return await conn.fetch(DUE_JOBS, *bounds, APPLIES)


async def due_executors(conn: asyncpg.Connection, bounds: Sequence[datetime]) -> list[asyncpg.Record]:
    """The executors whose signal can have changed (``DUE_EXECUTORS``), in key order."""
    return await conn.fetch(DUE_EXECUTORS, *bounds)


async def set_job_signals(conn: asyncpg.Connection, rows: list[tuple]) -> set[str]:
    """Rows ``(job_id, signal, since, thresholds, contact, step_changed_at, state)``; the job ids written."""
    return await _set_signals(conn, "jobs", "job_id", SET_JOB_SIGNALS, rows)


async def set_executor_signals(conn: asyncpg.Connection, rows: list[tuple]) -> set[str]:
    """Rows ``(executor_id, signal, since, thresholds, contact, step_changed_at)``; the executor ids written."""
    return await _set_signals(conn, "executors", "executor_id", SET_EXECUTOR_SIGNALS, rows)


async def add_events(conn: asyncpg.Connection, events: list[tuple[str, Envelope]]) -> None:
    """The pass's SignalChanged events, into the outbox in the pass's transaction."""
    await outbox.add(conn, SCHEMA, events)


async def _set_signals(conn: asyncpg.Connection, table: str, key: str, update: str, rows: list[tuple]) -> set[str]:
    """Write a pass's changed signals of one table (rows in key order, key first); the keys actually written.
    The rows are locked first in key order, as the heartbeat writes take them (see ``store.rounds``): the
    UPDATE's own join would lock them in whatever order its plan reads them."""
    if not rows:
        return set()
    await conn.execute(f"SELECT 1 FROM health.{table} WHERE {key} = ANY($1::text[]) ORDER BY {key} FOR UPDATE",
                       [r[0] for r in rows])
    return {r[0] for r in await conn.fetch(update, *(list(column) for column in zip(*rows)))}
