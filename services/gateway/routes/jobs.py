"""Jobs and executors: submit, list, show, cancel, requeue, events; the executor list.

Reads come from the public views; changes are commands whose outcome the request awaits (see commands.py).
Who sees which job, idempotency keys and the command allow-list are scoping.py's rules; secret env values are
sealed (secret_env.py) before a submit leaves, and redacted in everything shown.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Depends, Header, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import Field

from libs.contracts.bounds import ID_PATTERN, INT32_MAX, Actor, Label, Reason
from libs.contracts.commands import CancelJob, Command, RequeueJob, SubmitJob
from libs.contracts.envelope import Model
from libs.contracts.jobs import CommandWorkload, JobSpec, JobState
from libs.contracts.nodes import Signal
from libs.contracts.secrets import redact

from ..auth import AuthError, Permission, Principal, require
from ..commands import Sent
from ..domain import paging, reported, steps
from ..domain.outcomes import command_view, prefers_async, status_for
from ..errors import ApiError, not_found
from ..orgs import acting_org, acting_project
from ..scoping import command_refusal, job_id_for_key, may_see, owner_filter
from ..secret_env import SecretRefused, seal_spec
from . import COMMAND_KEY, commands_of, existing_job, json_response, reads_of, scoped_fleet
from .logs import log_tail

_ID = re.compile(ID_PATTERN)
NEXT_CURSOR_HEADER = "X-Next-Cursor"


class CancelBody(Model):
    reason: Reason = Field("cancelled by operator", max_length=1000, description="Shown on the job and in the audit log")


class RequeueBody(Model):
    gpu_ceiling_seconds: float = Field(gt=0, le=10**9, description="The new TOTAL GPU-second ceiling")


async def _admit_spec(request: Request, principal: Principal, cmd: SubmitJob) -> SubmitJob:
    """The submit as it may leave: a ``command`` workload needs finetune:command and an allowed argv; its
    secret env values are sealed for this job. Each refusal is audited (api.py records AuthError 403)."""
    workload = cmd.spec.workload
    if isinstance(workload, CommandWorkload):
        if not principal.can(Permission.FINETUNE_COMMAND):
            perm = Permission.FINETUNE_COMMAND.value
            raise AuthError(403, f"role {principal.role.value!r} lacks permission {perm!r} (command workloads run "
                            "your own code on the nodes)", permission=perm, actor=principal.actor)
        refusal = command_refusal(workload.command, request.app.state.command_allow)
        if refusal is not None:
            raise AuthError(403, refusal, actor=principal.actor)
    try:
        spec = seal_spec(cmd.spec, job_id=cmd.job_id, key=request.app.state.secrets_key)
    except SecretRefused as exc:
        await commands_of(request).refuse("submit", principal.actor, str(exc))
        raise ApiError(422, "invalid", str(exc)) from None
    limit = request.app.state.max_body_bytes
    if spec is not cmd.spec and len(spec.model_dump_json()) > limit:
        # Ciphertext is about 4/3 of its plaintext: what fitted as a body may no longer fit on the bus.
        raise ApiError(413, "too_large", f"the spec with its secrets encrypted is larger than {limit} bytes",
                       limit_bytes=limit)
    return cmd.model_copy(update={"spec": spec})


async def _answer(request: Request, cmd: Command, job_id: str) -> Response:
    """Send a command, then answer with the job (accepted), the refusal, or 202 (no outcome in time)."""
    wait = not prefers_async(request.headers.get("prefer"))
    sent: Sent = await (commands_of(request).send(cmd) if wait else commands_of(request).enqueue(cmd))
    out = sent.outcome
    status = status_for(cmd.KIND, None if out is None else out.accepted, out and out.reason, out and out.detail)
    if out is None:  # durable in the command stream, not decided yet (asked not to wait, or no outcome in time)
        body = {"command_id": sent.command_id, "status": "pending", "job_id": job_id}
        headers = {"Location": f"/v1/commands/{sent.command_id}"}
        if not wait:
            headers["Preference-Applied"] = "respond-async"
        return JSONResponse(body, status_code=status, headers=headers)
    if not out.accepted:
        raise ApiError(status, "refused", out.reason or "refused", detail=jsonable_encoder(out.detail),
                       command_id=sent.command_id, job_id=job_id, by=out.by)
    # Read-your-writes: the owner commits before it publishes the outcome, so the view already has the change.
    job = await reads_of(request).get_job(job_id)
    if job is None:
        job = {"id": job_id, "command_id": sent.command_id, "status": "accepted"}
    return json_response(redact(job), status)


async def requeue_job(request: Request, job_id: str, principal: Principal, ceiling: float) -> Response:
    """Requeue with a new total ceiling, as ``POST /v1/jobs/{id}/requeue`` does (the panel's requeue form, which
    reads the typed number in the page's locale first, comes here too)."""
    await existing_job(request, job_id, principal, "requeue")
    cmd = RequeueJob(actor=principal.actor, job_id=job_id, gpu_ceiling_seconds=ceiling)
    return await _answer(request, cmd, job_id)


def register(app: FastAPI) -> None:

    @app.post("/v1/jobs", tags=["jobs"], status_code=201, summary="Submit a job (the owner is the token's actor)",
                 openapi_extra={COMMAND_KEY: "submit"},
                 responses={202: {"description": "Accepted for processing; no outcome yet"},
                            409: {"description": "Refused"}, 422: {"description": "Invalid spec"}})
    async def submit(request: Request, spec: JobSpec,
                     principal: Principal = Depends(require(Permission.FINETUNE_SUBMIT)),
                     idempotency_key: str | None = Header(None, pattern=ID_PATTERN,
                                                          description="Reuse to retry without submitting twice"),
                     org: str | None = Query(None, pattern=ID_PATTERN,
                                             description="Organisation (fleet-wide tokens only; default: the "
                                                         "token's)"),
                     prefer: str | None = Header(None, max_length=200, description=(
                         "`respond-async` (RFC 7240): answer 202 once the command is durable, without waiting for "
                         "its decision; read it at the `Location` given (`GET /v1/commands/{command_id}`)"))
                     ) -> JSONResponse:
        if principal.project is not None:
            spec = spec.model_copy(update={"project": acting_project(principal, spec.project)})
        cmd = SubmitJob(actor=principal.actor, spec=spec, org=acting_org(principal, org))
        if idempotency_key:
            # The same key by the same actor always names the same command and job, so a retried request acts
            # once; another actor's same key names another job (scoping.job_id_for_key).
            derived = job_id_for_key(principal.actor, idempotency_key)
            cmd = cmd.model_copy(update={"command_id": derived, "job_id": derived})
        cmd = await _admit_spec(request, principal, cmd)
        return await _answer(request, cmd, cmd.job_id)

    @app.get("/v1/jobs", tags=["jobs"], summary="Jobs, newest first; the next page's cursor is in X-Next-Cursor",
             responses={200: {"description": "A page of jobs", "headers": {NEXT_CURSOR_HEADER: {
                 "description": "Send as `cursor` (same filters) for the next page; absent on the last page",
                 "schema": {"type": "string"}}}}})
    async def list_jobs(request: Request, response: Response, state: JobState | None = None,
                        owner: Actor | None = Query(None), limit: int = Query(100, ge=1, le=1000),
                        name: Label | None = Query(None, description="Jobs whose name contains this (any case)"),
                        signal: Signal | None = Query(None, description="Jobs not finished with this signal"),
                        cursor: str | None = Query(None, max_length=paging.MAX_CURSOR_CHARS,
                                                   description="X-Next-Cursor of the previous page"),
                        principal: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        try:
            position = paging.decode_cursor(cursor) if cursor is not None else None
        except paging.BadCursor as exc:
            raise ApiError(422, "invalid", f"query.cursor: {exc}",
                           errors=[{"field": "query.cursor", "message": str(exc), "type": "cursor"}]) from None
        owner, nothing = owner_filter(principal, owner)
        if nothing:
            return []
        jobs, next_cursor = await reads_of(request).jobs_page(
            state=state.value if state else None, owner=owner, limit=limit, name=name,
            signal=signal.value if signal else None, cursor=position)
        if next_cursor is not None:
            # The filters are the caller's to repeat: the cursor is only a position in the list's order.
            response.headers[NEXT_CURSOR_HEADER] = next_cursor
        return redact(jobs)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"],
             summary="One job: state, attempts, executor, progress, signal, budget, events")
    async def get_job(request: Request, job_id: str,
                      events: int = Query(20, ge=0, le=500, description="How many of the latest events to include"),
                      principal: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        job = await reads_of(request).get_job(job_id, events=events) if _ID.match(job_id) else None
        if job is None or not may_see(principal, job.get("owner")):
            raise not_found("job", job_id)
        job["log_tail"] = await log_tail(request, job)
        await with_reports(request, job)
        return redact(job)

    @app.get("/v1/commands/{command_id}", tags=["jobs"],
             summary="A command's decision: pending, accepted or refused (with the reason), from the audit log",
             responses={404: {"description": "No such command recorded (yet), or not yours"}})
    async def get_command(request: Request, command_id: str = Path(pattern=ID_PATTERN),
                          principal: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        # What a 202 (respond-async, or no outcome in time) leaves the client to learn: the audit log holds every
        # command as received and its outcome, whichever part decided it. Another actor's command is not found
        # (as another owner's job: only who sees every owner's jobs sees every actor's commands).
        view = command_view(await reads_of(request).command(command_id))
        if view is None or not may_see(principal, view["actor"]):
            raise not_found("command", command_id)
        return jsonable_encoder(redact(view))

    @app.get("/v1/jobs/{job_id}/events", tags=["jobs"], summary="A job's events in order (page with after_seq)")
    async def job_events(request: Request, job_id: str, after_seq: int = Query(0, ge=0, le=INT32_MAX),
                         limit: int = Query(500, ge=1, le=5000),
                         principal: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        await existing_job(request, job_id, principal)
        return redact(await reads_of(request).job_events(job_id, after_seq=after_seq, limit=limit))

    @app.get("/v1/jobs/{job_id}/steps", tags=["jobs"],
             summary="A job's step reports (loss, step time), downsampled to at most max_points")
    async def job_steps(request: Request, job_id: str,
                        max_points: int = Query(steps.DEFAULT_POINTS, ge=1, le=steps.MAX_POINTS),
                        principal: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        await existing_job(request, job_id, principal)
        return steps.steps_view(job_id, await reads_of(request).job_steps(job_id), max_points)

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"], summary="Cancel a job (your own, or any with finetune:manage)",
                 openapi_extra={COMMAND_KEY: "cancel"})
    async def cancel(request: Request, job_id: str, body: CancelBody | None = None,
                     principal: Principal = Depends(require(Permission.FINETUNE_SUBMIT))) -> JSONResponse:
        job = await existing_job(request, job_id, principal, "cancel")
        if job.get("owner") != principal.actor and not principal.can(Permission.FINETUNE_MANAGE):
            perm = Permission.FINETUNE_MANAGE.value
            reason = f"job {job_id} belongs to {job.get('owner')!r}; cancelling it needs {perm!r}"
            await commands_of(request).refuse("cancel", principal.actor, reason, job_id=job_id)
            raise ApiError(403, "forbidden", reason, permission=perm)
        cmd = CancelJob(actor=principal.actor, job_id=job_id, reason=(body or CancelBody()).reason)
        return await _answer(request, cmd, job_id)

    @app.post("/v1/jobs/{job_id}/requeue", tags=["jobs"],
              summary="Requeue an interrupted job with a new TOTAL GPU ceiling",
                 openapi_extra={COMMAND_KEY: "requeue"})
    async def requeue(request: Request, job_id: str, body: RequeueBody,
                      principal: Principal = Depends(require(Permission.FINETUNE_MANAGE))) -> JSONResponse:
        return await requeue_job(request, job_id, principal, body.gpu_ceiling_seconds)

    @app.get("/v1/executors", tags=["fleet"], summary="Executors: node, group, phase, job, signal, last heartbeat")
    async def executors(request: Request,
                        principal: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        rows = await reads_of(request).executors()
        return await scoped_fleet(request, principal, rows)


async def with_reports(request: Request, job: dict[str, Any]) -> dict[str, Any]:
    """The single-job view's account of what its runs reported (issue 27): ``reported`` (the latest step report:
    loss, learning rate, metrics) and ``checkpoints`` (the latest accepted, each with its kind, size and files)."""
    latest, events = await reads_of(request).job_reports(job["id"], reported.CHECKPOINTS_SHOWN)
    job["reported"] = reported.latest_report(latest)
    job["checkpoints"] = reported.checkpoints(events)
    return job
