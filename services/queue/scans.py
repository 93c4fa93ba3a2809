"""The queue's reads that find work due: a placement pass's candidates and free executors, leases past their
deadline, gangs past their ready deadline or their back-off (the loops of ``scheduler.py`` and ``gangs.py``).

Rows are read as ``store`` reads them (``store.job_from_row``); the ones a loop will change are row-locked with
``SKIP LOCKED``, so replicas never wait on each other. Every function takes a connection the caller holds inside
a transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from libs.contracts.nodes import RULED_OUT_STATES

from .domain.facts import Job
from .store import SELECT_JOB, T, job_from_row


@dataclass(frozen=True)
class Queued:
    """A queued job as a placement pass plans it: the columns planning reads (its spec's shape and ceiling, not the
    whole spec decoded); the pass reads the whole job only for those it grants (``jobs_by_id``)."""

    id: str
    org: str
    project: str
    created_at: datetime
    updated_at: datetime
    priority: int
    lease_epoch: int
    workers: int
    gpus_per_worker: int
    gpu_ceiling_seconds: float
    environment: str | None = None  # the Python environment it names (placement: only nodes offering it)


_QUEUED = (f"SELECT id, org, project, created_at, updated_at, priority, lease_epoch,"
           " COALESCE((spec->>'workers')::int, 1) AS workers,"
           " COALESCE((spec->>'gpus_per_worker')::int, 0) AS gpus_per_worker,"
           " (spec->>'gpu_ceiling_seconds')::float8 AS gpu_ceiling_seconds, spec->>'environment' AS environment"
           f" FROM {T}.jobs WHERE id = ANY($1::text[]) AND state = 'queued' ORDER BY created_at, id"
           " FOR UPDATE SKIP LOCKED")


async def queued_candidates(conn: asyncpg.Connection, ids: Sequence[str]) -> list[Queued]:
    """These queued jobs (a placement pass's candidates) in arrival order, row-locked, as ``Queued`` rows; rows
    another transaction holds are skipped, not waited on, and a job no longer queued is left out."""
    return [Queued(**r) for r in await conn.fetch(_QUEUED, list(ids))]


async def jobs_by_id(conn: asyncpg.Connection, ids: Sequence[str]) -> dict[str, Job]:
    """These jobs whole, by id (rows the caller's transaction already holds)."""
    if not ids:
        return {}
    return {r["id"]: job_from_row(r) for r in await conn.fetch(f"{SELECT_JOB} WHERE id = ANY($1::text[])",
                                                               list(ids))}


# Only nodes that passed their checks (health's node events): ready and not cordoned, and judged for the agent
# start the executor's heartbeats are from (an executor restarted with its stable id, by `teto up` or a reboot, is
# checked again before it takes work: its node's "ready" was about its previous start, and the "joining" that
# says so may arrive after its first heartbeat). A row without a boot id (a release before it) is not compared.
# Without that requirement ($2 true) a node not yet judged (joining, checking) may take work too, but never one
# the health service or an operator has ruled out ($3: those states). Executor alias ``e``.
SCHEDULABLE_NODE = (
    f"(EXISTS (SELECT 1 FROM {T}.nodes n WHERE n.node_id = e.node_id AND n.schedulable"
    "   AND n.executor_id = e.executor_id"
    "   AND (n.boot_id IS NULL OR e.boot_id IS NULL OR n.boot_id = e.boot_id))"
    f"  OR ($2 AND NOT EXISTS (SELECT 1 FROM {T}.nodes n WHERE n.node_id = e.node_id"
    "   AND n.state = ANY($3::text[]))))")


# The executor (alias ``e``) is held by no job running or forming. A NOT IN over the held executors, which
# PostgreSQL evaluates as one hashed set whatever rows it estimates around it (while the set fits in hash_mem:
# 8 MB by default, well over 100,000 executor ids): as NOT EXISTS (or a join) it chose, for the prepared
# statement, a nested loop comparing every executor with every running job's workers (23 ms at 1,000 free
# executors and 200 running jobs, against 1.4). No NULL can be in the set (NOT IN would then hold nowhere).
NOT_HELD = (f"e.executor_id NOT IN (SELECT w.id FROM {T}.jobs j, unnest(j.workers) AS w(id)"
            " WHERE j.state IN ('running', 'admitting') AND w.id IS NOT NULL)")


# "Any queued" is the first row of the queued jobs' own index, not EXISTS: for EXISTS the planner may scan the
# table from its start, which holds the finished jobs (4 ms at 20,000 of them, on every wake).
QUEUED_AND_FREE = (
    f"SELECT (SELECT id FROM {T}.jobs WHERE state = 'queued' ORDER BY created_at, id LIMIT 1) IS NOT NULL AS queued,"
    f" (SELECT count(*) FROM (SELECT 1 FROM {T}.executors e WHERE e.accepting AND e.job_id IS NULL"
    "   AND e.last_seen >= clock_timestamp() - make_interval(secs => $1)"
    f"  AND {SCHEDULABLE_NODE} AND {NOT_HELD} LIMIT $4) f) AS free")


async def queued_and_free(conn: asyncpg.Connection, silent_after: float, *, require_checked: bool = True,
                          most: int = 1) -> tuple[bool, int]:
    """(any job queued, how many executors are free for one, counted up to ``most``), in one round trip. Free
    as ``tenancy_edge.schedulable_nodes`` says it: heard from within ``silent_after`` seconds, on a schedulable
    node, accepting, reporting no job and holding none per the jobs table."""
    row = await conn.fetchrow(QUEUED_AND_FREE, silent_after, not require_checked,
                              sorted(s.value for s in RULED_OUT_STATES), most)
    return row["queued"], row["free"]


async def queued_jobs_placed_before(conn: asyncpg.Connection, ids: Sequence[str]) -> list[Job]:
    """Those of these queued jobs that ran before (the only ones with consumption), unlocked: read before the
    pass so the budget is asked with no row held."""
    rows = await conn.fetch(f"{SELECT_JOB} WHERE id = ANY($1::text[]) AND state = 'queued' AND lease_epoch > 0"
                            " ORDER BY created_at, id", list(ids))
    return [job_from_row(r) for r in rows]


async def expired_leases(conn: asyncpg.Connection, now: datetime, limit: int = 500) -> list[Job]:
    rows = await conn.fetch(f"{SELECT_JOB} WHERE state = 'running' AND lease_expires_at < $1"
                            " ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED", now, limit)
    return [job_from_row(r) for r in rows]


# -- gangs ------------------------------------------------------------------------------------------------

async def admitting_count(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(f"SELECT count(*) FROM {T}.jobs WHERE state = 'admitting'")


async def ready_timeouts(conn: asyncpg.Connection, now: datetime, limit: int = 500) -> list[Job]:
    """Admitting gangs past their ready deadline, row-locked."""
    rows = await conn.fetch(f"{SELECT_JOB} WHERE state = 'admitting' AND ready_deadline <= $1"
                            " ORDER BY ready_deadline LIMIT $2 FOR UPDATE SKIP LOCKED", now, limit)
    return [job_from_row(r) for r in rows]


async def backoffs_due(conn: asyncpg.Connection, now: datetime, limit: int = 500) -> list[Job]:
    rows = await conn.fetch(f"{SELECT_JOB} WHERE state = 'backoff' AND next_admission_at <= $1"
                            " ORDER BY next_admission_at LIMIT $2 FOR UPDATE SKIP LOCKED", now, limit)
    return [job_from_row(r) for r in rows]


async def rendezvous_in_use(conn: asyncpg.Connection) -> set[str]:
    """host:port of every gang now forming or running (a new gang must not meet on the same port)."""
    rows = await conn.fetch(f"SELECT rendezvous FROM {T}.jobs WHERE state IN ('admitting', 'running')"
                            " AND rendezvous IS NOT NULL")
    return {r["rendezvous"] for r in rows}


async def executor_addresses(conn: asyncpg.Connection, executor_ids: Sequence[str]) -> dict[str, str | None]:
    rows = await conn.fetch(f"SELECT executor_id, address FROM {T}.executors WHERE executor_id = ANY($1::text[])",
                            list(executor_ids))
    return {r["executor_id"]: r["address"] for r in rows}
