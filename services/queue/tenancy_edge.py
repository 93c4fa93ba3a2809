"""Tenancy at the queue's edges: the organisations, projects and cohorts tables (single writer: the ``set_org``,
``set_project`` and ``set_cohort`` commands, audited like every command), the submit check (the job's
organisation and project must exist, read for a whole batch), and what a placement pass needs of them: a
``tenancy.placement_types.Snapshot`` of organisations, cohorts, schedulable nodes (free or busy) and the running
jobs' devices per organisation and node group. The waiting reason of each queued job is written back by the pass. Budgets: ``org_budgets``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import asyncpg

from libs.contracts.commands import CommandOutcome, SetCohort, SetOrganisation, SetProject
from libs.contracts.nodes import RULED_OUT_STATES
from libs.contracts.jobs import RunLimits
from libs.contracts.tenancy import CohortSpec, OrgSpec
from libs.runtime.fencing import StaleCounter
from libs.runtime.service import Runtime
from libs.runtime.unit import Units

from . import scans, store
from .domain.preemption import PREEMPTED
from .domain.submits import Target
from .tenancy.placement_types import Node, Wait
from .tenancy.beyond import beyond_pass
from .tenancy.model import Cohort, GroupQuota, Organisation, Running
from .tenancy.orgs import Organisations, read as read_organisations

log = logging.getLogger(__name__)
SERVICE = "queue"
T = store.T


def organisation(name: str, spec: OrgSpec) -> Organisation:
    quotas = None if spec.quotas is None else {
        g: GroupQuota(q.nominal, q.borrowing_limit, q.lending_limit) for g, q in spec.quotas.items()}
    return Organisation(name, cohort=spec.cohort, weight=spec.weight, quotas=quotas,
                        budget_gpu_seconds=spec.budget_gpu_seconds, period=spec.period,
                        checkpoint_quota_bytes=spec.checkpoint_quota_bytes)


async def organisations(conn: asyncpg.Connection | asyncpg.Pool) -> Organisations:
    """Every organisation, each read on its own: one the contract refuses now is in ``broken``, not raised
    (tenancy/orgs.py), so its bad data never stops the others' placement."""
    rows = await conn.fetch(f"SELECT name, spec FROM {T}.orgs")
    orgs = read_organisations(((r["name"], r["spec"]) for r in rows), organisation)
    for name, reason in sorted(orgs.broken.items()):
        if (name, reason) not in _told:  # once, not every pass
            _told.add((name, reason))
            log.error("organisation %s is set aside until its settings are fixed: %s", name, reason)
    return orgs


_told: set[tuple[str, str]] = set()


async def cohorts(conn: asyncpg.Connection) -> dict[str, Cohort]:
    rows = await conn.fetch(f"SELECT name, preemption FROM {T}.cohorts")
    return {r["name"]: Cohort(r["name"], CohortSpec(preemption=r["preemption"]).preemption) for r in rows}


async def submit_targets(conn: asyncpg.Connection, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Target]:
    """Whether each (organisation, project) a batch of submits names exists: one statement for the batch (the
    rule is ``domain.submits.target_refusal``)."""
    wanted = sorted(set(pairs))
    if not wanted:
        return {}
    rows = await conn.fetch(
        f"SELECT w.org, w.project, EXISTS (SELECT 1 FROM {T}.orgs o WHERE o.name = w.org) AS org_exists,"
        f" EXISTS (SELECT 1 FROM {T}.projects p WHERE p.org = w.org AND p.name = w.project) AS project_exists,"
        f" (SELECT o.spec->'run_limits' FROM {T}.orgs o WHERE o.name = w.org)::text AS run_limits"
        " FROM unnest($1::text[], $2::text[]) AS w(org, project)", [o for o, _ in wanted], [p for _, p in wanted])
    return {(r["org"], r["project"]): Target(r["org_exists"], r["project_exists"], _run_limits(r["run_limits"]))
            for r in rows}


def _run_limits(text: str | None) -> RunLimits | None:
    """An organisation's stored run limits (validated when they were set; ``null`` or absent: none)."""
    return RunLimits.model_validate_json(text) if text and text != "null" else None


SCHEDULABLE_NODES = ("SELECT e.executor_id, e.gpus, e.group_name, e.environments,"
                     f" e.accepting AND e.job_id IS NULL AND {scans.NOT_HELD} AS free"
                     f" FROM {T}.executors e WHERE e.last_seen >= $1 AND {scans.SCHEDULABLE_NODE}"
                     " ORDER BY e.executor_id")


async def schedulable_nodes(conn: asyncpg.Connection, now: datetime, silent_after: float, *,
                            require_checked: bool = True) -> list[Node]:
    """Every executor placement may use, busy or free, with its node group: the fleet's capacity per group.
    Free: accepting, reporting no job, and holding none per the jobs table (authoritative: a heartbeat sent
    before a grant lags it; the reported job covers the other lag, a cancelled job whose process is stopping).
    With the Python environments each offers (a job naming one goes only where it is offered)."""
    rows = await conn.fetch(
        SCHEDULABLE_NODES, now - timedelta(seconds=silent_after), not require_checked, sorted(s.value for s in RULED_OUT_STATES))
    return [Node(r["executor_id"], r["group_name"], r["gpus"], r["free"], frozenset(r["environments"]))
            for r in rows]


async def running(conn: asyncpg.Connection) -> list[Running]:
    """Jobs holding nodes, with what they hold against their organisation's quota (runs granted before tenancy
    have no node group and count for nobody)."""
    rows = await conn.fetch(f"SELECT id, state, org, node_group, devices, priority, admitted_at, updated_at, workers,"
                            " stop_requested"
                            f" FROM {T}.jobs WHERE state IN ('running', 'admitting') AND node_group IS NOT NULL")
    return [Running(r["id"], r["org"], r["node_group"], r["devices"], r["priority"],
                    r["admitted_at"] or r["updated_at"], tuple(r["workers"]),
                    preemptible=r["state"] == "running",
                    stopping=r["stop_requested"] == PREEMPTED) for r in rows]


# Each organisation's first ``limit`` queued jobs in its own admission order (``tenancy.candidates.within_org``):
# the ``limit`` lowest share-deficit keys never take more than ``limit`` of one organisation, and an
# organisation's keys grow along that order, so these rows hold the whole choice. The organisations with queued
# jobs are found by a skip scan of the same index (one probe each), not by reading every queued row. The choice
# itself (``tenancy.candidates.choose``: each job keyed by its organisation's held devices plus its own and those
# before it, over the weight; the ``limit`` lowest keys, ties older then id) is made here too, by a window sum
# over those rows, so a pass reads ``limit`` ids, not ``limit`` rows per organisation to choose from in Python.
# Those rows come from the index alone (``jobs_queued_org`` carries ``asked_devices``: migration 056).
# Ids compare as Python compares them (code points: ``COLLATE "C"``). $1: limit; $2, $3: weights by organisation.
CANDIDATES = f"""
WITH RECURSIVE queued_orgs(org) AS (
    (SELECT org FROM {T}.jobs WHERE state = 'queued' ORDER BY org LIMIT 1)
    UNION ALL
    SELECT (SELECT j.org FROM {T}.jobs j WHERE j.state = 'queued' AND j.org > q.org ORDER BY j.org LIMIT 1)
    FROM queued_orgs q WHERE q.org IS NOT NULL
), firsts AS (
    SELECT c.* FROM queued_orgs q CROSS JOIN LATERAL (
        SELECT id, org, created_at, priority, asked_devices AS devices
        FROM {T}.jobs WHERE state = 'queued' AND org = q.org
        ORDER BY priority DESC, created_at, id LIMIT $1) c
    WHERE q.org IS NOT NULL
), held AS (
    SELECT org, COALESCE(sum(devices), 0)::int AS devices FROM {T}.jobs
    WHERE state IN ('running', 'admitting') GROUP BY org
), keyed AS (
    SELECT f.id, f.created_at,
           (COALESCE(h.devices, 0) + sum(f.devices) OVER (PARTITION BY f.org
                ORDER BY f.priority DESC, f.created_at, f.id COLLATE "C" ROWS UNBOUNDED PRECEDING))::float8
           / COALESCE(w.weight, 1.0) AS share_key
    FROM firsts f LEFT JOIN held h ON h.org = f.org
    LEFT JOIN unnest($2::text[], $3::float8[]) AS w(org, weight) ON w.org = f.org
)
SELECT id FROM keyed ORDER BY share_key, created_at, id COLLATE "C" LIMIT $1"""


async def candidates(conn: asyncpg.Connection | asyncpg.Pool, orgs: Mapping[str, Organisation],
                     limit: int) -> list[str]:
    """The ids of the queued jobs a placement pass considers, at most ``limit``, chosen by share deficit
    (``tenancy.candidates.choose``, made by the statement) on what each organisation holds now; read unlocked
    (the pass locks the rows)."""
    if limit <= 0:
        return []
    rows = await conn.fetch(CANDIDATES, limit, list(orgs), [o.weight for o in orgs.values()])
    return [r["id"] for r in rows]


# How far down the candidates' order the jobs beyond a whole pass are given a reason (every queued job, on any
# queue this side of the bound; the order is one statement, the writes only where a position moved).
BEYOND_LIMIT = 100_000


async def waits_beyond(conn: asyncpg.Connection, orgs: Mapping[str, Organisation],
                       considered: list[str]) -> list[Wait]:
    """The reasons of the queued jobs a whole pass did not consider (``tenancy.beyond``): behind every job
    before them in the candidates' order. Read on the pass's connection, after its planning."""
    order = await candidates(conn, orgs, BEYOND_LIMIT)
    seen = set(considered)
    rest = [job_id for job_id in order if job_id not in seen]
    if not rest:
        return []
    rows = await conn.fetch(f"SELECT id, waiting->>'code' AS code, waiting->'numbers'->>'ahead' AS ahead"
                            f" FROM {T}.jobs WHERE id = ANY($1::text[])", rest)
    stored = {r["id"]: int(r["ahead"]) for r in rows
              if r["code"] == "behind" and r["ahead"] is not None and r["ahead"].isdigit()}
    return beyond_pass(order, considered, stored)


async def note_waits(conn: asyncpg.Connection, waits: Iterable[Wait], now: datetime) -> None:
    """Each queued job's reason for waiting, for its view (one statement for the whole pass)."""
    rows = [(w.job_id, json.dumps({"code": w.code.value, "reason": w.reason, "numbers": w.numbers,
                                   "group": w.group, "at": now.isoformat()})) for w in waits]
    if rows:
        await conn.execute(
            f"UPDATE {T}.jobs j SET waiting = w.waiting::jsonb FROM unnest($1::text[], $2::text[]) AS w(id, waiting)"
            " WHERE j.id = w.id AND j.state = 'queued'", [r[0] for r in rows], [r[1] for r in rows])


async def note_run(conn: asyncpg.Connection, placed: Mapping[str, tuple[str, int]]) -> None:
    """The node group and devices of each job just granted (what its organisation's quota counts)."""
    if placed:
        await conn.execute(
            f"UPDATE {T}.jobs j SET node_group = p.g, devices = p.d, waiting = NULL"
            " FROM unnest($1::text[], $2::text[], $3::int[]) AS p(id, g, d) WHERE j.id = p.id"
            " AND j.state IN ('running', 'admitting')",  # what a grant makes: the index of those, no seq scan
            list(placed), [g for g, _ in placed.values()], [d for _, d in placed.values()])


# -- the admins' commands ---------------------------------------------------------------------------------

class Tenancy:
    def __init__(self, runtime: Runtime, units: Units | None = None) -> None:
        self.runtime = runtime
        self.units = units or Units(runtime.pool, store.SCHEMA, runtime.subjects, StaleCounter("queue"))

    async def _once(self, cmd, act) -> CommandOutcome:  # noqa: ANN001 - any of the three commands
        now = self.runtime.clock.now()
        async with self.units.begin() as unit:
            conn = unit.conn

            async def decide() -> CommandOutcome:
                refused = await act(conn, now)
                if refused is not None:
                    return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=False, by=SERVICE,
                                          reason=refused)
                log.info("%s by %s: %s", cmd.KIND, cmd.actor, cmd.model_dump(mode="json", exclude={"actor"}))
                return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=True, by=SERVICE,
                                      detail={k: v for k, v in cmd.model_dump(mode="json").items()
                                              if k in ("name", "org", "spec")})

            return (await unit.once(cmd, decide)).outcome

    async def set_org(self, cmd: SetOrganisation) -> CommandOutcome:
        async def act(conn: asyncpg.Connection, now: datetime) -> str | None:
            await conn.execute(
                f"INSERT INTO {T}.orgs (name, spec, updated_by, updated_at) VALUES ($1, $2::jsonb, $3, $4)"
                " ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, updated_by = EXCLUDED.updated_by,"
                " updated_at = EXCLUDED.updated_at", cmd.name, cmd.spec.model_dump_json(), cmd.actor, now)
            # Every organisation has a default project, so a token of it can submit at once.
            await conn.execute(
                f"INSERT INTO {T}.projects (org, name, spec, updated_by, updated_at)"
                " VALUES ($1, 'default', '{}'::jsonb, $2, $3) ON CONFLICT DO NOTHING", cmd.name, cmd.actor, now)
            return None
        return await self._once(cmd, act)

    async def set_project(self, cmd: SetProject) -> CommandOutcome:
        async def act(conn: asyncpg.Connection, now: datetime) -> str | None:
            if not await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {T}.orgs WHERE name = $1)", cmd.org):
                return f"organisation {cmd.org} does not exist"
            await conn.execute(
                f"INSERT INTO {T}.projects (org, name, spec, updated_by, updated_at) VALUES ($1, $2, $3::jsonb, $4, $5)"
                " ON CONFLICT (org, name) DO UPDATE SET spec = EXCLUDED.spec, updated_by = EXCLUDED.updated_by,"
                " updated_at = EXCLUDED.updated_at", cmd.org, cmd.name, cmd.spec.model_dump_json(), cmd.actor, now)
            return None
        return await self._once(cmd, act)

    async def set_cohort(self, cmd: SetCohort) -> CommandOutcome:
        async def act(conn: asyncpg.Connection, now: datetime) -> str | None:
            await conn.execute(
                f"INSERT INTO {T}.cohorts (name, preemption, updated_by, updated_at) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (name) DO UPDATE SET preemption = EXCLUDED.preemption,"
                " updated_by = EXCLUDED.updated_by, updated_at = EXCLUDED.updated_at",
                cmd.name, cmd.spec.preemption.value, cmd.actor, now)
            return None
        return await self._once(cmd, act)
