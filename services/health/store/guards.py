"""The replacement breaker's rows: a group's guard in and out of ``health.group_guards``, in the caller's
transaction (a group held or released node by node: nodes.py ``apply_to_group``).

The rules are in domain/breaker.py; nothing here decides. Locks: a verdict holds the failing node, then the
guard row, then the group's other nodes by id; a clear takes the guard, then the nodes. The two can meet in a
deadlock in principle (a clear racing a verdict in the same group): PostgreSQL aborts one transaction and its
message is redelivered, nothing half-applied.
"""

from __future__ import annotations

import json
from datetime import datetime

import asyncpg

from ..domain import breaker


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
