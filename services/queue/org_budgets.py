"""Organisations' period budgets at the queue's edges (the budget service owns consumption; the rules are
``tenancy/budget.py``): what the budget service says each budgeted organisation consumed this period and what
its jobs consumed, asked over ``teto.rpc.budget.orgs`` with no row lock held (``ask``: by a placement pass once
it holds the placement lock and has chosen its candidates, before it locks their rows; or before a requeue
command is decided); the accounts a placement pass reserves against, built from those answers (``accounts``);
and the requeue command's check of a new ceiling against its organisation's remaining budget
(``requeue_refusal``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from libs.contracts.budget import OrgBudgetReply, OrgBudgetRequest
from libs.contracts.jobs import JobState
from libs.runtime.service import Runtime

from . import store
from .domain.ceiling import REQUEUE_MARGIN_SECONDS
from .domain.lifecycle import Refusal
from .tenancy import budget as budgets
from .tenancy.model import Organisation
from .tenancy_edge import organisations

log = logging.getLogger(__name__)
T = store.T

UNANSWERED = ("organisation budget: the budget service did not answer; jobs of organisations with a budget "
              "wait until it does")
UNAVAILABLE = "budget service unavailable"  # the gateway answers 503: nothing changed, ask again later


@dataclass(frozen=True)
class Consumption:
    """The budget service's answers for the organisations asked (``orgs``): GPU-seconds charged since each
    one's period began, and each job's consumption in all. ``answered`` False: no answer, nothing known."""

    answered: bool = True
    orgs: frozenset[str] = frozenset()
    org_consumed: Mapping[str, float] = field(default_factory=dict)
    job_consumed: Mapping[str, float] = field(default_factory=dict)

    def known(self, org: str) -> bool:
        return self.answered and org in self.orgs


def budgeted(orgs: Mapping[str, Organisation]) -> dict[str, Organisation]:
    return {n: o for n, o in orgs.items() if o.budget_gpu_seconds is not None}


async def ask(runtime: Runtime, conn: asyncpg.Connection | asyncpg.Pool, orgs: Mapping[str, Organisation],
              now: datetime, timeout: float, *, jobs: Iterable[str] = ()) -> Consumption:
    """Ask the budget service, holding no row lock (its answer may take ``timeout``), about the budgeted
    organisations of ``orgs``: their consumption this period, that of their running (and admitting) jobs, whose
    reservations are their remaining ceilings, and that of ``jobs`` (queued jobs that ran before: what they
    still need is their ceiling less it)."""
    chosen = budgeted(orgs)
    if not chosen:
        return Consumption()
    rows = await running_ceilings(conn, chosen)
    asked = sorted({*(r["id"] for r in rows), *jobs})
    by_since: dict[datetime, list[str]] = {}
    for org in chosen.values():
        by_since.setdefault(budgets.period_start(org.period, now), []).append(org.name)
    org_consumed: dict[str, float] = {}
    job_consumed: dict[str, float] = {}
    try:
        for since, names in by_since.items():
            msg = await runtime.nc.request(runtime.subjects.rpc_budget_orgs,
                                           OrgBudgetRequest(orgs=names, since=since, jobs=asked).encode(),
                                           timeout=timeout)
            reply = OrgBudgetReply.decode(msg.data)
            org_consumed.update(reply.org_consumed)
            job_consumed.update(reply.job_consumed)
    except Exception as exc:  # noqa: BLE001 - no responders, timeout, contract: the same answer, never a guess
        log.warning("budget status of organisations unavailable: %r", exc)
        return Consumption(answered=False)
    return Consumption(True, frozenset(chosen), org_consumed, job_consumed)


def build_accounts(orgs: Mapping[str, Organisation], consumption: Consumption, running: Iterable[Mapping],
                   queued: Iterable) -> tuple[dict[str, budgets.BudgetAccount], dict[str, float], set[str]]:  # noqa: ANN001
    """Each budgeted organisation's account, each queued job's need (``queued``: its ``id``, ``org`` and
    ``gpu_ceiling_seconds``), and the budgeted organisations the answers do not cover (their jobs wait). ``running``: rows ``id, org, ceiling`` of running and admitting jobs.
    ``reservations`` hold the remaining ceiling (ceiling - consumed) of each running job, so consumed + reserved
    is everything its jobs may use; a queued job needs its remaining ceiling. A job the answers do not name
    (it started or was queued again after the question) counts as having consumed nothing: its whole ceiling
    is reserved or needed, never less than it may use."""
    chosen = {n: o for n, o in budgeted(orgs).items() if consumption.known(n)}
    unanswered = set(budgeted(orgs)) - set(chosen)
    used = consumption.job_consumed
    reserved: dict[str, dict[str, float]] = {n: {} for n in chosen}
    for r in running:
        if r["org"] in reserved:
            reserved[r["org"]][r["id"]] = max(0.0, (r["ceiling"] or 0.0) - used.get(r["id"], 0.0))
    accounts = {n: budgets.BudgetAccount(n, o.budget_gpu_seconds, consumption.org_consumed.get(n, 0.0), reserved[n])
                for n, o in chosen.items()}
    needs = {j.id: max(0.0, j.gpu_ceiling_seconds - used.get(j.id, 0.0)) for j in queued if j.org in chosen}
    return accounts, needs, unanswered


async def running_ceilings(conn: asyncpg.Connection | asyncpg.Pool, orgs: Iterable[str]) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT id, org, (spec->>'gpu_ceiling_seconds')::float8 AS ceiling FROM {T}.jobs"
                            " WHERE state IN ('running', 'admitting') AND org = ANY($1::text[])", list(orgs))


async def accounts(conn: asyncpg.Connection, orgs: Mapping[str, Organisation], consumption: Consumption,
                   queued: list) -> tuple[dict[str, budgets.BudgetAccount], dict[str, float], set[str]]:  # noqa: ANN001
    """``build_accounts`` on the running jobs as the placement pass sees them (inside its transaction); without
    a budgeted organisation there is nothing to read."""
    chosen = budgeted(orgs)
    return build_accounts(orgs, consumption, await running_ceilings(conn, chosen) if chosen else [], queued)


async def requeue_refusal(runtime: Runtime, pool: asyncpg.Pool, job_id: str, new_ceiling: float,
                          consumed: float, now: datetime, timeout: float) -> Refusal | None:
    """A requeue's new ceiling checked against its organisation's budget at command time: refused (with the
    organisation, what is left and what is asked) when its remaining part (new ceiling - consumed) exceeds what
    the organisation has left this period after the other running jobs' reservations; refused as unavailable
    when the budget service does not answer. None: no budget, or it fits (admission still reserves it)."""
    async with pool.acquire() as conn:
        job = await store.load_job(conn, job_id)
        if job is None or job.state is not JobState.INTERRUPTED or new_ceiling < consumed + REQUEUE_MARGIN_SECONDS:
            return None  # the lifecycle refuses it, with its own reason
        org = (await organisations(conn)).get(job.org)
    if org is None or org.budget_gpu_seconds is None:
        return None
    consumption = await ask(runtime, pool, {org.name: org}, now, timeout, jobs=[job_id])
    if not consumption.known(org.name):
        return Refusal(UNAVAILABLE, {"org": org.name})
    found, _, _ = build_accounts({org.name: org}, consumption, await running_ceilings(pool, [org.name]), [])
    asked = max(0.0, new_ceiling - consumed)
    refused = budgets.requeue_refusal(found[org.name], job_id, asked)
    if refused is None:
        return None
    return Refusal(refused.reason, {"org": org.name, "period": org.period, **refused.numbers,
                                    "given_seconds": new_ceiling, "consumed_seconds": consumed})

