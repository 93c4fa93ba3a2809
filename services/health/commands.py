"""The health service's commands: on-demand check runs, drain and undrain, and clearing a group's
systemic-failure alert. Each is applied once (``processed_commands`` de-duplicates; a command seen again is
answered again) and answered on ``teto.outcome.<kind>.<command_id>`` in the same transaction. What each
command does to a node is the lifecycle's (domain/nodes.py), which nodes an on-demand run takes is
domain/runs.py's, the rows the store's. The caller (checks.py) kicks the relay and carries out the provisioner's part once the answer is committed.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import asyncpg

from libs.contracts.commands import ClearGroupAlert, CommandOutcome, DrainNode, RunHealthCheck, UndrainNode
from libs.contracts.nodes import ALL_TESTS
from libs.runtime import commands as once
from libs.runtime.service import Runtime

from . import store
from .domain import breaker, runs
from .domain import nodes as lc
from .domain.provisioning import Request, requests_for
from .store import check_runs, guards, nodes

log = logging.getLogger(__name__)
SERVICE = "health"
HealthCommand = RunHealthCheck | DrainNode | UndrainNode | ClearGroupAlert


async def apply(runtime: Runtime, policy: lc.Policy, guard_policy: breaker.Policy,
                cmd: HealthCommand) -> tuple[CommandOutcome, list[Request]]:
    """Apply ``cmd`` once and answer it, in one transaction; returns the answer and the provisioner's requests
    to carry out once committed (a drain reaches Slurm, say)."""
    now = runtime.clock.now()
    after: list[Request] = []
    async with runtime.pool.acquire() as conn, conn.transaction():
        async def decide() -> CommandOutcome:
            if isinstance(cmd, RunHealthCheck):
                accepted, reason, detail = await _run_command(runtime, policy, conn, cmd, now)
            elif isinstance(cmd, ClearGroupAlert):
                accepted, reason, detail = await _clear_command(runtime, guard_policy, conn, cmd, now)
            else:
                accepted, reason, detail = await _drain_command(runtime, policy, conn, cmd, now, after)
            return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=accepted, reason=reason,
                                  detail=detail, by=SERVICE)

        answer = await once.decide_once(conn, store.SCHEMA, runtime.subjects, cmd, decide)
    return answer.outcome, after


async def _run_command(runtime: Runtime, policy: lc.Policy, conn: asyncpg.Connection, cmd: RunHealthCheck,
                       now: datetime) -> tuple[bool, str | None, dict[str, Any]]:
    if bool(cmd.group) == bool(cmd.nodes):
        return False, "name a group or a list of nodes (not both)", {}
    if cmd.group:
        rows = await nodes.lock_group(conn, cmd.group)
    else:
        rows = await nodes.lock_nodes(conn, cmd.nodes)
        unknown = sorted(set(cmd.nodes) - {r["node_id"] for r in rows})
        if unknown:
            return False, f"node(s) not found: {', '.join(unknown)}", {"unknown": unknown}
    by_id = {r["node_id"]: r for r in rows}
    chosen, skipped = runs.on_demand_targets([nodes.node_of(r) for r in rows])
    targets = [by_id[n.node_id] for n in chosen]
    if not targets:
        return False, "no ready node to check", {"skipped": skipped, "group": cmd.group}
    tests = cmd.tests or list(ALL_TESTS)
    await check_runs.new_run(conn, cmd.run_id, "on_demand", cmd.group, cmd.actor, tests, cmd.force, now)
    busy_executors = await nodes.busy_executors(conn, [r["executor_id"] for r in targets])
    cordoned = []
    for row in targets:
        busy = runs.waits_for_job(row["executor_id"], busy_executors, force=cmd.force)
        t = lc.decide(nodes.node_of(row), lc.CheckRequested(cmd.run_id, busy), now, policy)
        if isinstance(t, lc.Transition) and t.changed:
            await nodes.save(conn, runtime.subjects, t, now, seq=row["event_seq"])
            cordoned.append(row["node_id"])
        await check_runs.add_members(conn, cmd.run_id, [row["node_id"]])
    log.info("check run %s on %d node(s) (%d cordoned until their job ends)", cmd.run_id, len(targets),
             len(cordoned))
    return True, None, {"run_id": cmd.run_id, "nodes": [r["node_id"] for r in targets], "cordoned": cordoned,
                        "skipped": skipped}


async def _drain_command(runtime: Runtime, policy: lc.Policy, conn: asyncpg.Connection,
                         cmd: DrainNode | UndrainNode, now: datetime,
                         after: list[Request]) -> tuple[bool, str | None, dict[str, Any]]:
    node, row = await nodes.load(conn, cmd.node_id)
    fact = lc.Drain(cmd.reason) if isinstance(cmd, DrainNode) else lc.Undrain()
    t = lc.decide(node, fact, now, policy)
    if isinstance(t, lc.Refusal):
        return False, t.reason, {"node_id": cmd.node_id}
    if t.changed:
        await nodes.save(conn, runtime.subjects, t, now, seq=row["event_seq"], needs_check=t.schedules_checks)
        after += requests_for(t, hostname=row["hostname"], slurm_job_id=row["slurm_job_id"])
    return True, None, {"node_id": cmd.node_id, "state": t.node.state.value}


async def _clear_command(runtime: Runtime, guard_policy: breaker.Policy, conn: asyncpg.Connection,
                         cmd: ClearGroupAlert, now: datetime) -> tuple[bool, str | None, dict[str, Any]]:
    if not await nodes.group_exists(conn, cmd.group):
        return False, f"group not found: {cmd.group}", {"group": cmd.group}
    guard = await guards.load(conn, cmd.group)
    d = breaker.decide(guard, breaker.Clear(cmd.actor), now, guard_policy)
    if isinstance(d, breaker.Refusal):
        return False, d.reason, {"group": cmd.group}
    await guards.save(conn, d.guard, cleared_by=cmd.actor)
    released = await nodes.apply_to_group(conn, runtime.subjects, cmd.group, lc.Release(), now)
    log.warning("group %s: systemic-failure alert cleared by %s (%s); released %s", cmd.group, cmd.actor,
                cmd.reason, ", ".join(released) or "no node")
    return True, None, {"group": cmd.group, "released": released, "cleared": guard.alert.as_dict()
                        if guard.alert else None}
