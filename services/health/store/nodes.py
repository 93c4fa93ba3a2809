"""The node rows: nodes in and out of ``health.nodes``, and a transition written with its ``NodeEvent``s and the
directives it causes (reboot) in the outbox, in the caller's transaction; the reads that pick nodes (a group,
its live peers, the samples of its median, an on-demand run's targets). The lifecycle decides
(domain/nodes.py); the sweeps here (``mark_gone``, ``apply_to_group``) only apply its answer to each row.

Every function takes a connection the caller holds inside a transaction; nothing here commits on its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from libs.contracts.envelope import Envelope
from libs.contracts.nodes import NodeEvent, NodeState, RebootNode
from libs.contracts.subjects import Subjects
from libs.runtime import outbox

from . import SCHEMA
from ..domain import liveness
from ..domain.nodes import Hold, Node, Reboot, Release, Silent, Transition, Unaddressable, decide

log = logging.getLogger(__name__)


def node_of(row: asyncpg.Record) -> Node:
    return Node(node_id=row["node_id"], group=row["group_name"], executor_id=row["executor_id"],
                state=NodeState(row["state"]), reboots=row["reboots"], run_id=row["run_id"],
                cordoned=row["cordoned"], reason=row["reason"], boot_id=row["boot_id"], since=row["since"],
                held=row["held"])


async def load(conn: asyncpg.Connection, node_id: str) -> tuple[Node | None, asyncpg.Record | None]:
    row = await conn.fetchrow("SELECT * FROM health.nodes WHERE node_id = $1 FOR UPDATE", node_id)
    return (None, None) if row is None else (node_of(row), row)


async def save(conn: asyncpg.Connection, subjects: Subjects, t: Transition, now: datetime, *,
               seq: int, extra: dict[str, Any] | None = None, messages: Iterable[tuple[str, Envelope]] = (),
               needs_check: bool | None = None) -> list[NodeEvent]:
    """Store the node after a transition (``seq``: its last event number so far) with its events, the reboot
    directive its effects ask for, and ``messages``; ``extra`` sets other columns (address, figures, ...)."""
    n = t.node
    events = [NodeEvent(node_id=n.node_id, seq=seq + i + 1, event=e.kind, state=e.state, previous_state=e.previous,
                        executor_id=n.executor_id, group=n.group, schedulable=n.schedulable,
                        reason=e.reason or n.why_not_schedulable, run_id=n.run_id or e.detail.get("run_id"),
                        reboots=n.reboots, detail=e.detail, boot_id=n.boot_id, time=now)
              for i, e in enumerate(t.events)]
    cols: dict[str, Any] = {"group_name": n.group, "executor_id": n.executor_id, "state": n.state.value,
                            "reason": n.reason, "reboots": n.reboots, "run_id": n.run_id, "cordoned": n.cordoned,
                            "boot_id": n.boot_id, "since": n.since, "event_seq": seq + len(events), "held": n.held}
    if needs_check is not None:
        cols["needs_check"] = needs_check
    for key, value in (extra or {}).items():
        cols[key] = json.dumps(value) if key in ("gpus", "figures") else value
    names = list(cols)
    casts = {"gpus": "::jsonb", "figures": "::jsonb"}
    placeholders = ", ".join(f"${i}{casts.get(c, '')}" for i, c in enumerate(names, 2))
    await conn.execute(
        f"INSERT INTO health.nodes (node_id, {', '.join(names)}) VALUES ($1, {placeholders})"
        f" ON CONFLICT (node_id) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in names)}, updated_at = now()",
        n.node_id, *cols.values())
    out: list[tuple[str, Envelope]] = [(subjects.node(n.node_id, ev.event.value), ev) for ev in events]
    for effect in t.effects:
        if isinstance(effect, Reboot) and n.executor_id:
            out.append((subjects.agent(n.executor_id, "reboot"),
                        RebootNode(node_id=n.node_id, executor_id=n.executor_id, reason=effect.reason,
                                   reboots=effect.reboots)))
    await outbox.add(conn, SCHEMA, [*out, *messages])
    return events


async def mark_gone(conn: asyncpg.Connection, subjects: Subjects, now: datetime, gone_after: float) -> list[str]:
    """Nodes whose agent has been silent for ``gone_after`` seconds (no heartbeat, no registration) are marked
    gone (their run, if any, fails at its deadline). SKIP LOCKED: a node another transaction holds is looked at
    next tick."""
    cutoff = now - timedelta(seconds=gone_after)
    rows = await conn.fetch(
        "SELECT n.*, e.registered_at AS e_registered_at, e.last_heartbeat AS e_last_heartbeat FROM health.nodes n"
        " LEFT JOIN health.executors e ON e.executor_id = n.executor_id"
        " WHERE n.state NOT IN ('replaced', 'drained', 'gone')"
        " AND GREATEST(e.registered_at, e.last_heartbeat, n.registered_at) <= $1"
        " ORDER BY n.node_id FOR UPDATE OF n SKIP LOCKED", cutoff)
    gone = []
    for row in rows:
        registered = liveness.last_heard(row["e_registered_at"], row["registered_at"])
        if not liveness.silent(registered, row["e_last_heartbeat"], now, timedelta(seconds=gone_after)):
            continue
        t = decide(node_of(row), Silent(gone_after), now)
        if isinstance(t, Transition) and t.changed:
            await save(conn, subjects, t, now, seq=row["event_seq"], needs_check=False)
            gone.append(row["node_id"])
            log.warning("node %s (executor %s) is gone: its agent has been silent for %gs", row["node_id"],
                        row["executor_id"], gone_after)
    return gone


async def live_peers(conn: asyncpg.Connection, group: str, node_id: str, now: datetime,
                     within: timedelta) -> list[asyncpg.Record]:
    """The group's other nodes (joining, checking, ready, with an address) whose agents are alive now."""
    rows = await conn.fetch(
        "SELECT n.node_id, n.address, n.registered_at, e.registered_at AS e_registered_at, e.last_heartbeat"
        " FROM health.nodes n LEFT JOIN health.executors e ON e.executor_id = n.executor_id"
        " WHERE n.group_name = $1 AND n.node_id <> $2 AND n.address IS NOT NULL"
        " AND n.state IN ('joining', 'checking', 'ready') ORDER BY n.node_id", group, node_id)
    return [r for r in rows if liveness.alive(liveness.last_heard(r["registered_at"], r["e_registered_at"]),
                                              r["last_heartbeat"], now, within)]


async def median_samples(conn: asyncpg.Connection, node_id: str, test: str, now: datetime,
                         rule: liveness.SampleRule) -> list[dict[str, float]]:
    """``test``'s figures on the other nodes of ``node_id``'s group that may set its median now."""
    rows = await conn.fetch(
        "SELECT n.state, n.figures -> $2 AS f, n.last_check_at, n.figures_suite, n.registered_at,"
        " e.registered_at AS e_registered_at, e.last_heartbeat FROM health.nodes n"
        " LEFT JOIN health.executors e ON e.executor_id = n.executor_id"
        " WHERE n.group_name = (SELECT group_name FROM health.nodes WHERE node_id = $1) AND n.node_id <> $1"
        " AND n.state = 'ready' AND n.figures ? $2", node_id, test)
    return [json.loads(r["f"]) for r in rows
            if liveness.median_sample(NodeState(r["state"]), liveness.last_heard(r["registered_at"],
                                                                                 r["e_registered_at"]),
                                      r["last_heartbeat"], r["last_check_at"], r["figures_suite"], now, rule)]


def figures_after_pass(node: asyncpg.Record, passed: list[asyncpg.Record]) -> dict[str, Any]:
    """The node's figures once a run passed: this run's passing tests over the earlier ones (an on-demand run
    may check a few tests only), unless the suite version changed, when the earlier ones are dropped (another
    yardstick)."""
    suite = next((r["suite_version"] for r in passed if r["suite_version"] is not None), node["figures_suite"])
    earlier = json.loads(node["figures"]) if suite == node["figures_suite"] else {}
    return {"figures": {**earlier, **{r["test"]: json.loads(r["f"]) for r in passed}}, "figures_suite": suite}


async def flag_unaddressable(conn: asyncpg.Connection, subjects: Subjects, node_id: str, reason: str,
                             now: datetime) -> None:
    """Fail a node no directive can reach (Unaddressable), with its node event if even that can be addressed."""
    try:
        async with conn.transaction():
            node, row = await load(conn, node_id)
            t = decide(node, Unaddressable(reason[:1500]), now)
            if isinstance(t, Transition) and t.changed:
                await save(conn, subjects, t, now, seq=row["event_seq"])
    except Exception:  # noqa: BLE001 - its node id is no subject token either: keep the state, no event
        await conn.execute("UPDATE health.nodes SET state = 'failed', reason = $2, run_id = NULL, needs_check = false,"
                           " updated_at = now() WHERE node_id = $1", node_id, reason[:1500])


async def apply_to_group(conn: asyncpg.Connection, subjects: Subjects, group: str, fact: Hold | Release,
                         now: datetime, *, but: str | None = None) -> list[str]:
    """Hold or release every node of the group (``but`` one the caller is moving itself); returns the nodes
    that changed (their events are in the outbox, ``schedulable`` telling placement what to do)."""
    changed = []
    ids = [r["node_id"] for r in await conn.fetch("SELECT node_id FROM health.nodes WHERE group_name = $1"
                                                  " AND node_id IS DISTINCT FROM $2 ORDER BY node_id", group, but)]
    for node_id in ids:
        node, row = await load(conn, node_id)
        t = decide(node, fact, now)
        if isinstance(t, Transition) and t.changed:
            await save(conn, subjects, t, now, seq=row["event_seq"], needs_check=True if t.schedules_checks else None)
            changed.append(node_id)
    return changed


async def group_exists(conn: asyncpg.Connection, group: str) -> bool:
    return await conn.fetchval("SELECT EXISTS (SELECT 1 FROM health.nodes WHERE group_name = $1)", group)


async def lock_group(conn: asyncpg.Connection, group: str) -> list[asyncpg.Record]:
    """The group's nodes, locked, in id order (the lock order)."""
    return await conn.fetch("SELECT * FROM health.nodes WHERE group_name = $1 ORDER BY node_id FOR UPDATE", group)


async def lock_nodes(conn: asyncpg.Connection, node_ids: list[str]) -> list[asyncpg.Record]:
    """The named nodes that exist, locked, in id order."""
    return await conn.fetch("SELECT * FROM health.nodes WHERE node_id = ANY($1::text[]) ORDER BY node_id"
                            " FOR UPDATE", node_ids)


async def busy_executors(conn: asyncpg.Connection, executor_ids: list[str | None]) -> set[str]:
    """Those of the executors that run a job, per their heartbeats."""
    return {r["executor_id"] for r in await conn.fetch(
        "SELECT executor_id FROM health.executors WHERE executor_id = ANY($1::text[]) AND job_id IS NOT NULL",
        executor_ids)}


async def owner(conn: asyncpg.Connection, node_id: str) -> str | None:
    """The executor the node is bound to (None: no such node, or none yet)."""
    return await conn.fetchval("SELECT executor_id FROM health.nodes WHERE node_id = $1", node_id)


# Each node's executor and when that executor was last heard from (a registration, or a heartbeat).
_BOUND = """
SELECT n.node_id, n.executor_id, GREATEST(e.last_heartbeat, e.registered_at) AS last_heard
FROM health.nodes n LEFT JOIN health.executors e ON e.executor_id = n.executor_id
WHERE n.node_id = ANY($1::text[])"""


async def bindings(conn: asyncpg.Connection, node_ids: list[str]) -> dict[str, tuple[str | None, datetime | None]]:
    """Each existing node's executor and when it was last heard from."""
    return {r["node_id"]: (r["executor_id"], r["last_heard"]) for r in await conn.fetch(_BOUND, node_ids)}


async def node(conn: asyncpg.Connection, node_id: str) -> Node:
    """The node as it stands (unlocked)."""
    return node_of(await conn.fetchrow("SELECT * FROM health.nodes WHERE node_id = $1", node_id))


async def joining(conn: asyncpg.Connection) -> list[tuple[str, datetime]]:
    """Each joining node due for checks as (group, since), unlocked: locking every joining node each tick made
    every registration wait for the check loop (issue 12)."""
    return [(r["group_name"], r["since"]) for r in await conn.fetch(
        "SELECT group_name, since FROM health.nodes WHERE needs_check AND state = 'joining'")]


async def lock_joining(conn: asyncpg.Connection, group: str) -> list[asyncpg.Record]:
    """The group's joining nodes due for checks, locked, in id order."""
    return await conn.fetch("SELECT * FROM health.nodes WHERE needs_check AND state = 'joining' AND group_name = $1"
                            " ORDER BY node_id FOR UPDATE", group)


async def checks_scheduled(conn: asyncpg.Connection, node_ids: list[str]) -> None:
    """The nodes are in a run now: no longer due for one."""
    await conn.execute("UPDATE health.nodes SET needs_check = false WHERE node_id = ANY($1::text[])", node_ids)
