"""The health service's commands: on-demand check runs, drain and undrain, and clearing a group's
systemic-failure alert. Each is applied once (``processed_commands`` de-duplicates; a command seen again is
answered again) and answered on ``teto.outcome.<kind>.<command_id>`` in the same transaction.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from libs.contracts.commands import ClearGroupAlert, CommandOutcome, DrainNode, RunHealthCheck, UndrainNode
from libs.contracts.nodes import ALL_TESTS, NodeState
from libs.runtime import commands as once

from . import guards
from . import nodes as store
from .domain import breaker
from .domain import nodes as lc
from .domain.provisioning import Request, requests_for

if TYPE_CHECKING:
    from .checks import Checks

log = logging.getLogger(__name__)
SERVICE = "health"
HealthCommand = RunHealthCheck | DrainNode | UndrainNode | ClearGroupAlert


async def apply(checks: Checks, cmd: HealthCommand) -> CommandOutcome:
    now = checks.runtime.clock.now()
    after: list[Request] = []  # the provisioner's part, once committed (a drain reaches Slurm, say)
    async with checks.runtime.pool.acquire() as conn, conn.transaction():
        async def decide() -> CommandOutcome:
            if isinstance(cmd, RunHealthCheck):
                accepted, reason, detail = await _run_command(checks, conn, cmd, now)
            elif isinstance(cmd, ClearGroupAlert):
                accepted, reason, detail = await _clear_command(checks, conn, cmd, now)
            else:
                accepted, reason, detail = await _drain_command(checks, conn, cmd, now, after)
            return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=accepted, reason=reason,
                                  detail=detail, by=SERVICE)

        answer = await once.decide_once(conn, store.SCHEMA, checks.runtime.subjects, cmd, decide)
    checks.kick()
    for request in after:
        await checks.provision(request)
    return answer.outcome


async def _run_command(checks: Checks, conn: asyncpg.Connection, cmd: RunHealthCheck,
                       now: datetime) -> tuple[bool, str | None, dict[str, Any]]:
    if bool(cmd.group) == bool(cmd.nodes):
        return False, "name a group or a list of nodes (not both)", {}
    if cmd.group:
        rows = await conn.fetch("SELECT * FROM health.nodes WHERE group_name = $1 ORDER BY node_id FOR UPDATE",
                                cmd.group)
    else:
        rows = await conn.fetch("SELECT * FROM health.nodes WHERE node_id = ANY($1::text[]) ORDER BY node_id"
                                " FOR UPDATE", cmd.nodes)
        unknown = sorted(set(cmd.nodes) - {r["node_id"] for r in rows})
        if unknown:
            return False, f"node(s) not found: {', '.join(unknown)}", {"unknown": unknown}
    targets = [r for r in rows if r["state"] == NodeState.READY and not r["cordoned"]]
    skipped = {r["node_id"]: (f"cordoned for run {r['run_id']}" if r["cordoned"] else r["state"])
               for r in rows if r not in targets}
    if not targets:
        return False, "no ready node to check", {"skipped": skipped, "group": cmd.group}
    tests = cmd.tests or list(ALL_TESTS)
    await checks.new_run(conn, cmd.run_id, "on_demand", cmd.group, cmd.actor, tests, cmd.force, now)
    busy_rows = {r["executor_id"] for r in await conn.fetch(
        "SELECT executor_id FROM health.executors WHERE executor_id = ANY($1::text[]) AND job_id IS NOT NULL",
        [r["executor_id"] for r in targets])}
    cordoned = []
    for row in targets:
        busy = row["executor_id"] in busy_rows and not cmd.force
        t = lc.decide(store.node_of(row), lc.CheckRequested(cmd.run_id, busy), now, checks.policy)
        if isinstance(t, lc.Transition) and t.changed:
            await store.save(conn, checks.runtime.subjects, t, now, seq=row["event_seq"])
            cordoned.append(row["node_id"])
        await conn.execute("INSERT INTO health.check_run_nodes (run_id, node_id, status) VALUES ($1, $2,"
                           " 'waiting')", cmd.run_id, row["node_id"])
    log.info("check run %s on %d node(s) (%d cordoned until their job ends)", cmd.run_id, len(targets),
             len(cordoned))
    return True, None, {"run_id": cmd.run_id, "nodes": [r["node_id"] for r in targets], "cordoned": cordoned,
                        "skipped": skipped}


async def _drain_command(checks: Checks, conn: asyncpg.Connection, cmd: DrainNode | UndrainNode,
                         now: datetime, after: list[Request]) -> tuple[bool, str | None, dict[str, Any]]:
    node, row = await store.load(conn, cmd.node_id)
    fact = lc.Drain(cmd.reason) if isinstance(cmd, DrainNode) else lc.Undrain()
    t = lc.decide(node, fact, now, checks.policy)
    if isinstance(t, lc.Refusal):
        return False, t.reason, {"node_id": cmd.node_id}
    if t.changed:
        schedule = any(isinstance(e, lc.ScheduleChecks) for e in t.effects)
        await store.save(conn, checks.runtime.subjects, t, now, seq=row["event_seq"], needs_check=schedule)
        after += requests_for(t, hostname=row["hostname"], slurm_job_id=row["slurm_job_id"])
    return True, None, {"node_id": cmd.node_id, "state": t.node.state.value}


async def _clear_command(checks: Checks, conn: asyncpg.Connection, cmd: ClearGroupAlert,
                         now: datetime) -> tuple[bool, str | None, dict[str, Any]]:
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM health.nodes WHERE group_name = $1)", cmd.group):
        return False, f"group not found: {cmd.group}", {"group": cmd.group}
    guard = await guards.load(conn, cmd.group)
    d = breaker.decide(guard, breaker.Clear(cmd.actor), now, checks.settings.breaker)
    if isinstance(d, breaker.Refusal):
        return False, d.reason, {"group": cmd.group}
    await guards.save(conn, d.guard, cleared_by=cmd.actor)
    released = await guards.apply_to_group(conn, checks.runtime.subjects, cmd.group, lc.Release(), now)
    log.warning("group %s: systemic-failure alert cleared by %s (%s); released %s", cmd.group, cmd.actor,
                cmd.reason, ", ".join(released) or "no node")
    return True, None, {"group": cmd.group, "released": released, "cleared": guard.alert.as_dict()
                        if guard.alert else None}
