"""What the queue knows of its executors: each one's latest heartbeat (placement's view of who is free) and the
ends of runs they report, which free them at once rather than at their next heartbeat."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from libs.contracts.telemetry import Phase

from .store import T


async def upsert_executors(conn: asyncpg.Connection, rows: Sequence[tuple]) -> None:
    """rows: (executor_id, node_id, group, gpus, accepting, job_id, epoch, phase, sent_at, last_seen, address,
    environments joined by newlines, boot_id), at most one per executor. A heartbeat older than the one stored
    (redelivered, reordered) does not overwrite it."""
    if not rows:
        return
    # One statement for the batch (a row per executor: the caller keeps each executor's newest heartbeat only).
    cols = list(zip(*rows, strict=True))
    await conn.execute(
        f"INSERT INTO {T}.executors AS e (executor_id, node_id, group_name, gpus, accepting, job_id, epoch, phase,"
        " sent_at, last_seen, address, environments, boot_id) SELECT u.e, u.n, u.g, u.gp, u.a, u.j, u.ep, u.ph, u.s,"
        " u.l, u.ad, string_to_array(u.envs, E'\\n'), u.b FROM unnest($1::text[], $2::text[], $3::text[], $4::int[],"
        " $5::bool[], $6::text[], $7::int[], $8::text[], $9::timestamptz[], $10::timestamptz[], $11::text[],"
        " $12::text[], $13::text[]) AS u(e, n, g, gp, a, j, ep, ph, s, l, ad, envs, b)"
        " ON CONFLICT (executor_id) DO UPDATE SET node_id = EXCLUDED.node_id, group_name = EXCLUDED.group_name,"
        " gpus = EXCLUDED.gpus, accepting = EXCLUDED.accepting, job_id = EXCLUDED.job_id, epoch = EXCLUDED.epoch,"
        " phase = EXCLUDED.phase, sent_at = EXCLUDED.sent_at, last_seen = EXCLUDED.last_seen,"
        " address = EXCLUDED.address, environments = EXCLUDED.environments, boot_id = EXCLUDED.boot_id"
        " WHERE e.sent_at <= EXCLUDED.sent_at",
        *(list(c) for c in cols),
    )


async def offered_environments(conn: asyncpg.Connection, wanted: Sequence[str]) -> frozenset[str]:
    """Which of ``wanted`` some executor the queue knows offers (its latest heartbeat says so)."""
    if not wanted:
        return frozenset()
    rows = await conn.fetch(f"SELECT DISTINCT x FROM {T}.executors e, unnest(e.environments) AS x"
                            " WHERE x = ANY($1::text[])", list(wanted))
    return frozenset(r["x"] for r in rows)


async def free_ended(conn: asyncpg.Connection, ended: Sequence[tuple[str, str, int, datetime, bool]]) -> int:
    """Executors that reported the end of the run their latest heartbeat names ((executor, job, epoch, report
    time) each) are idle and accepting from that report's time: the agent takes no new work until its report is
    acknowledged, and a grant that reaches it before it saw the acknowledgement waits for it (the agent's
    ``on_run``). Otherwise an executor whose heartbeat named a run stayed busy to placement until its next
    heartbeat, up to a whole interval (30 s by default) after its run ended. A heartbeat sent before the report
    (arriving late) does not overwrite this; a later one does. An executor whose report says it is leaving (the
    last element, true: its Slurm allocation ends, or it shuts down) is idle but not accepting: no grant should
    go to an agent on its way out. Returns how many were freed."""
    if not ended:
        return 0
    cols = list(zip(*ended, strict=True))
    return int((await conn.execute(
        f"UPDATE {T}.executors e SET job_id = NULL, epoch = NULL, accepting = NOT r.leaving, phase = $6, sent_at = r.t"
        " FROM unnest($1::text[], $2::text[], $3::int[], $4::timestamptz[], $5::bool[]) AS r(ex, j, ep, t, leaving)"
        " WHERE e.executor_id = r.ex AND e.job_id = r.j AND e.epoch = r.ep AND e.sent_at <= r.t",
        *(list(c) for c in cols), Phase.IDLE.value)).split()[-1])
