"""Organisations' consumption for the queue's budget reservations (tenancy): ``teto.rpc.budget.orgs`` answers,
for the organisations asked, the GPU-seconds their jobs were charged since a time (the start of their budget
period; a charge counts when its stretch ended), and each named job's consumption in all."""

from __future__ import annotations

import asyncpg
from faststream import Context

from libs.contracts.budget import OrgBudgetReply, OrgBudgetRequest
from libs.contracts.subjects import Subjects
from libs.runtime.edge_reply import Responder

from .settings import BudgetSettings


async def org_status(pool: asyncpg.Pool, req: OrgBudgetRequest) -> OrgBudgetReply:
    async with pool.acquire() as conn:
        orgs = await conn.fetch(
            "SELECT j.org, sum(l.gpu_seconds) AS consumed FROM budget.ledger l JOIN budget.jobs j USING (job_id)"
            " WHERE j.org = ANY($1::text[]) AND coalesce(l.ended_at, l.recorded_at) >= $2 GROUP BY j.org",
            req.orgs, req.since)
        jobs = await conn.fetch("SELECT job_id, consumed_seconds FROM budget.jobs WHERE job_id = ANY($1::text[])",
                                req.jobs)
    return OrgBudgetReply(org_consumed={r["org"]: float(r["consumed"]) for r in orgs},
                          job_consumed={r["job_id"]: float(r["consumed_seconds"]) for r in jobs})


async def answer(req: OrgBudgetRequest, pool: asyncpg.Pool = Context()) -> OrgBudgetReply:
    return await org_status(pool, req)


def responder(subjects: Subjects, settings: BudgetSettings) -> Responder:
    return Responder(subjects.rpc_budget_orgs, settings.rpc_queue_group, OrgBudgetRequest.decode, answer,
                     lambda reason: OrgBudgetReply())
