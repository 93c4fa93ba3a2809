"""The replacement breaker's edge: a group's guard in and out of ``health.group_guards``, and a group held or
released (every node's transition written with its events, in the caller's transaction).

The rules are in domain/breaker.py; nothing here decides. Locks: a verdict holds the failing node, then the
guard row, then the group's other nodes by id; a clear takes the guard, then the nodes. The two can meet in a
deadlock in principle (a clear racing a verdict in the same group): PostgreSQL aborts one transaction and its
message is redelivered, nothing half-applied.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

import asyncpg

from libs.contracts.subjects import Subjects

from . import nodes as store
from .domain import breaker
from .domain import nodes as lc

log = logging.getLogger(__name__)


def _alert_of(value: str | None) -> breaker.Alert | None:
    if value is None:
        return None
    a = json.loads(value)
    return breaker.Alert(a["reason"], datetime.fromisoformat(a["since"]), frozenset(a.get("tests") or ()),
                         tuple(a.get("nodes") or ()))


async def load(conn: asyncpg.Connection, group: str) -> breaker.Guard:
    """The group's guard, locked for this transaction (made on first use)."""
    await conn.execute("INSERT INTO health.group_guards (group_name) VALUES ($1) ON CONFLICT DO NOTHING", group)
    row = await conn.fetchrow("SELECT * FROM health.group_guards WHERE group_name = $1 FOR UPDATE", group)
    reps = tuple(breaker.Replacement(r["node_id"], datetime.fromisoformat(r["at"]), frozenset(r["tests"]))
                 for r in json.loads(row["replacements"]))
    return breaker.Guard(group, reps, _alert_of(row["alert"]), row["cleared_at"])


async def save(conn: asyncpg.Connection, guard: breaker.Guard, *, cleared_by: str | None = None) -> None:
    reps = [{"node_id": r.node_id, "at": r.at.isoformat(), "tests": sorted(r.tests)} for r in guard.replacements]
    await conn.execute(
        "UPDATE health.group_guards SET replacements = $2::jsonb, alert = $3::jsonb, cleared_at = $4,"
        " cleared_by = COALESCE($5, cleared_by), updated_at = now() WHERE group_name = $1", guard.group,
        json.dumps(reps), json.dumps(guard.alert.as_dict()) if guard.alert else None, guard.cleared_at, cleared_by)


async def alert(conn: asyncpg.Connection, group: str) -> breaker.Alert | None:
    return _alert_of(await conn.fetchval("SELECT alert FROM health.group_guards WHERE group_name = $1", group))


async def apply_to_group(conn: asyncpg.Connection, subjects: Subjects, group: str, fact: lc.Hold | lc.Release,
                         now: datetime, *, but: str | None = None) -> list[str]:
    """Hold or release every node of the group (``but`` one the caller is moving itself); returns the nodes
    that changed (their events are in the outbox, ``schedulable`` telling placement what to do)."""
    changed = []
    ids = [r["node_id"] for r in await conn.fetch("SELECT node_id FROM health.nodes WHERE group_name = $1"
                                                  " AND node_id IS DISTINCT FROM $2 ORDER BY node_id", group, but)]
    for node_id in ids:
        node, row = await store.load(conn, node_id)
        t = lc.decide(node, fact, now)
        if isinstance(t, lc.Transition) and t.changed:
            schedule = any(isinstance(e, lc.ScheduleChecks) for e in t.effects)
            await store.save(conn, subjects, t, now, seq=row["event_seq"], needs_check=True if schedule else None)
            changed.append(node_id)
    return changed
