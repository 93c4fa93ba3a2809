"""Jobs and executors: submit, list, show, cancel, requeue, events; the executor list.

Reads come from the public views; changes are commands whose outcome the request awaits (see commands.py).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Depends, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import Field

from libs.contracts.bounds import ID_PATTERN, INT32_MAX, Actor, Reason
from libs.contracts.commands import CancelJob, Command, RequeueJob, SubmitJob
from libs.contracts.envelope import Model
from libs.contracts.jobs import JobSpec, JobState

from ..auth import Permission, Principal, require
from ..commands import Sent
from ..domain.outcomes import status_for
from ..errors import ApiError, not_found
from . import COMMAND_KEY, commands_of, reads_of

_ID = re.compile(ID_PATTERN)


class CancelBody(Model):
    reason: Reason = Field("cancelled by operator", max_length=1000, description="Shown on the job and in the audit log")


class RequeueBody(Model):
    gpu_ceiling_seconds: float = Field(gt=0, le=10**9, description="The new TOTAL GPU-second ceiling")


async def _existing_job(request: Request, job_id: str, command: tuple[str, Principal] | None = None
                        ) -> dict[str, Any]:
    """The job's row, or 404; a command about an unknown job is recorded as refused by the gateway."""
    job = await reads_of(request).job_row(job_id) if _ID.match(job_id) else None
    if job is None:
        err = not_found("job", job_id)
        if command is not None:
            kind, principal = command
            await commands_of(request).refuse(kind, principal.actor, err.body["reason"],
                                              job_id=job_id if _ID.match(job_id) else None)
        raise err
    return job


async def _answer(request: Request, cmd: Command, job_id: str) -> JSONResponse:
    """Send a command, then answer with the job (accepted), the refusal, or 202 (no outcome in time)."""
    sent: Sent = await commands_of(request).send(cmd)
    out = sent.outcome
    status = status_for(cmd.KIND, None if out is None else out.accepted, out and out.reason, out and out.detail)
    if out is None:
        body = {"command_id": sent.command_id, "status": "pending", "job_id": job_id}
        return JSONResponse(body, status_code=status)
    if not out.accepted:
        raise ApiError(status, "refused", out.reason or "refused", detail=jsonable_encoder(out.detail),
                       command_id=sent.command_id, job_id=job_id, by=out.by)
    # Read-your-writes: the owner commits before it publishes the outcome, so the view already has the change.
    job = await reads_of(request).get_job(job_id)
    if job is None:
        job = {"id": job_id, "command_id": sent.command_id, "status": "accepted"}
    return JSONResponse(jsonable_encoder(job), status_code=status)


def register(app: FastAPI) -> None:

    @app.post("/v1/jobs", tags=["jobs"], status_code=201, summary="Submit a job (the owner is the token's actor)",
                 openapi_extra={COMMAND_KEY: "submit"},
                 responses={202: {"description": "Accepted for processing; no outcome yet"},
                            409: {"description": "Refused"}, 422: {"description": "Invalid spec"}})
    async def submit(request: Request, spec: JobSpec,
                     principal: Principal = Depends(require(Permission.FINETUNE_SUBMIT)),
                     idempotency_key: str | None = Header(None, pattern=ID_PATTERN,
                                                          description="Reuse to retry without submitting twice")
                     ) -> JSONResponse:
        cmd = SubmitJob(actor=principal.actor, spec=spec)
        if idempotency_key:
            # The same key always names the same command and job, so a retried request acts once.
            cmd = cmd.model_copy(update={"command_id": idempotency_key, "job_id": idempotency_key})
        return await _answer(request, cmd, cmd.job_id)

    @app.get("/v1/jobs", tags=["jobs"], summary="Jobs, newest first")
    async def list_jobs(request: Request, state: JobState | None = None,
                        owner: Actor | None = Query(None), limit: int = Query(100, ge=1, le=1000),
                        _: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        return await reads_of(request).list_jobs(state=state.value if state else None, owner=owner, limit=limit)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"],
             summary="One job: state, attempts, executor, progress, signal, budget, events")
    async def get_job(request: Request, job_id: str,
                      _: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        job = await reads_of(request).get_job(job_id) if _ID.match(job_id) else None
        if job is None:
            raise not_found("job", job_id)
        return job

    @app.get("/v1/jobs/{job_id}/events", tags=["jobs"], summary="A job's events in order (page with after_seq)")
    async def job_events(request: Request, job_id: str, after_seq: int = Query(0, ge=0, le=INT32_MAX),
                         limit: int = Query(500, ge=1, le=5000),
                         _: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        await _existing_job(request, job_id)
        return await reads_of(request).job_events(job_id, after_seq=after_seq, limit=limit)

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"], summary="Cancel a job (your own, or any with finetune:manage)",
                 openapi_extra={COMMAND_KEY: "cancel"})
    async def cancel(request: Request, job_id: str, body: CancelBody | None = None,
                     principal: Principal = Depends(require(Permission.FINETUNE_SUBMIT))) -> JSONResponse:
        job = await _existing_job(request, job_id, ("cancel", principal))
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
        await _existing_job(request, job_id, ("requeue", principal))
        cmd = RequeueJob(actor=principal.actor, job_id=job_id, gpu_ceiling_seconds=body.gpu_ceiling_seconds)
        return await _answer(request, cmd, job_id)

    @app.get("/v1/executors", tags=["fleet"], summary="Executors: node, group, phase, job, signal, last heartbeat")
    async def executors(request: Request, _: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        return await reads_of(request).executors()

