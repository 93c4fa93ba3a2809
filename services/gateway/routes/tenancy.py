"""Organisations, projects, cohorts (``policy:admin`` to change; read by anyone) and the usage report.

Changes are the queue's commands ``set_org``, ``set_project`` and ``set_cohort`` (audited like every command);
an accepted change answers with the row now in force, read back from the queue's public views. ``GET /v1/usage``
reads the budget's ledger (``budget.ledger_public``, and ``budget.usage_public`` for the runs interrupted), the
queue's jobs and events, and reports GPU time and jobs per organisation, project or user (services/gateway/domain/usage.py); ``format=csv`` gives CSV.
Usage is scoped like jobs (scoping.usage_owner): without ``read:all`` a principal sees its own jobs' usage only.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse

from libs.contracts.bounds import ID_PATTERN
from libs.contracts.commands import Command, SetCohort, SetOrganisation, SetProject
from libs.contracts.tenancy import CohortSpec, OrgSpec, ProjectSpec

from ..auth import Permission, Principal, require
from ..domain import usage as usages
from ..errors import ApiError
from ..orgs import usage_org
from ..scoping import usage_owner
from . import COMMAND_KEY, commands_of, reads_of

_REFUSALS = {202: {"description": "Accepted for processing; no outcome yet"}, 409: {"description": "Refused"}}


async def _send(request: Request, cmd: Command, view: str, where: str, *args: Any) -> JSONResponse:
    sent = await commands_of(request).send(cmd)
    out = sent.outcome
    if out is None:
        return JSONResponse({"command_id": sent.command_id, "status": "pending"}, status_code=202)
    if not out.accepted:
        raise ApiError(409, "refused", out.reason or "refused", command_id=sent.command_id, by=out.by)
    rows = await reads_of(request).public(view, f"SELECT * FROM {view} WHERE {where}", *args)
    return JSONResponse(jsonable_encoder(rows[0] if rows else {}), status_code=200)


def register(app: FastAPI) -> None:

    @app.get("/v1/orgs", tags=["tenancy"], summary="Organisations with their quotas, and their projects")
    async def list_orgs(request: Request, _: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        reads = reads_of(request)
        return jsonable_encoder({
            "orgs": await reads.public("queue.orgs_public", "SELECT * FROM queue.orgs_public ORDER BY name"),
            "projects": await reads.public("queue.projects_public",
                                           "SELECT * FROM queue.projects_public ORDER BY org, name"),
            "cohorts": await reads.public("queue.cohorts_public", "SELECT * FROM queue.cohorts_public ORDER BY name")})

    @app.put("/v1/orgs/{name}", tags=["tenancy"], summary="Create or replace an organisation",
             openapi_extra={COMMAND_KEY: "set_org"}, responses=_REFUSALS)
    async def put_org(request: Request, body: OrgSpec, name: str = Path(pattern=ID_PATTERN),
                      principal: Principal = Depends(require(Permission.POLICY_ADMIN))) -> JSONResponse:
        cmd = SetOrganisation(actor=principal.actor, name=name, spec=body)
        return await _send(request, cmd, "queue.orgs_public", "name = $1", name)

    @app.put("/v1/orgs/{org}/projects/{name}", tags=["tenancy"], summary="Create or replace a project",
             openapi_extra={COMMAND_KEY: "set_project"}, responses=_REFUSALS)
    async def put_project(request: Request, body: ProjectSpec, org: str = Path(pattern=ID_PATTERN),
                          name: str = Path(pattern=ID_PATTERN),
                          principal: Principal = Depends(require(Permission.POLICY_ADMIN))) -> JSONResponse:
        cmd = SetProject(actor=principal.actor, org=org, name=name, spec=body)
        return await _send(request, cmd, "queue.projects_public", "org = $1 AND name = $2", org, name)

    @app.put("/v1/cohorts/{name}", tags=["tenancy"], summary="Create or replace a cohort's preemption policy",
             openapi_extra={COMMAND_KEY: "set_cohort"}, responses=_REFUSALS)
    async def put_cohort(request: Request, body: CohortSpec, name: str = Path(pattern=ID_PATTERN),
                         principal: Principal = Depends(require(Permission.POLICY_ADMIN))) -> JSONResponse:
        cmd = SetCohort(actor=principal.actor, name=name, spec=body)
        return await _send(request, cmd, "queue.cohorts_public", "name = $1", name)

    @app.get("/v1/usage", tags=["tenancy"], summary="GPU time and jobs per organisation, project or user")
    async def usage(request: Request, org: str | None = Query(None, pattern=ID_PATTERN),
                    period: str | None = Query(None, pattern=r"^\d{4}-\d{2}(-\d{2})?$",
                                               description="YYYY-MM or YYYY-MM-DD (UTC); default this month"),
                    group_by: usages.GroupBy = usages.GroupBy.ORG, format: str = Query("json", pattern="^(json|csv)$"),
                    principal: Principal = Depends(require(Permission.READ))) -> Any:
        scope = usage_org(principal, org)
        try:
            start, end = usages.period_window(period, datetime.now(UTC))
        except ValueError as exc:
            raise ApiError(422, "invalid", str(exc)) from None
        owner = usage_owner(principal)
        result = await usage_report(request, scope, start, end, group_by, owner=owner)
        if format == "csv":
            out = io.StringIO()
            csv.writer(out).writerows(usages.to_csv_rows(result))
            return PlainTextResponse(out.getvalue(), media_type="text/csv")
        return {**usages.as_json(result), "org": scope, "owner": owner}


async def usage_report(request: Request, org: str | None, start: datetime, end: datetime,
                       group_by: usages.GroupBy, *, owner: str | None) -> usages.UsageReport:
    """The report for one organisation (or all) and one owner (or all: ``scoping.usage_owner`` decides)."""
    reads = reads_of(request)
    charges = await reads.public("budget.ledger_public", "SELECT job_id, gpu_seconds, at FROM budget.ledger_public"
                                 " WHERE at >= $1 AND at < $2", start, end)
    ids = sorted({c["job_id"] for c in charges})
    jobs = await reads.public(
        "queue.jobs_public", "SELECT id, org, project, owner, state, attempts, spec, last_step FROM queue.jobs_public"
        " WHERE (id = ANY($1::text[]) OR (created_at >= $2 AND created_at < $3)) AND ($4::text IS NULL OR org = $4)"
        " AND ($5::text IS NULL OR owner = $5)", ids, start, end, org, owner)
    # Only a checkpoint's detail is needed (its time): a submitted event's detail holds the whole spec.
    events = await reads.public(
        "queue.job_events_public", "SELECT job_id, event, time, state, reason, epoch,"
        " CASE WHEN event = 'checkpointed' THEN detail END AS detail FROM queue.job_events_public"
        " WHERE job_id = ANY($1::text[]) ORDER BY job_id, seq", [j["id"] for j in jobs])
    by_job: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_job.setdefault(event["job_id"], []).append(event)
    # The usage samples of interrupted runs only: what the work lost to interruptions is counted from.
    interrupted = [job_id for job_id, evs in by_job.items() if usages.interrupted_runs(evs)]
    samples = await reads.public(
        "budget.usage_public", "SELECT job_id, epoch, gpu_seconds, started_at, ended_at, recorded_at"
        " FROM budget.usage_public WHERE job_id = ANY($1::text[]) ORDER BY job_id, epoch, executor_id, seq",
        interrupted) if interrupted else []
    runs: dict[str, list[dict[str, Any]]] = {}
    for sample in samples:
        runs.setdefault(sample["job_id"], []).append(sample)
    facts = [usages.job_facts(j, by_job.get(j["id"], []), runs.get(j["id"], []), start, end) for j in jobs]
    return usages.report([usages.Charge(c["job_id"], c["gpu_seconds"], c["at"]) for c in charges], facts, group_by,
                         start, end, org=org, owner=owner)
