"""One job's follow-up page (GET /jobs/{id}).

The facts come from the same view GET /v1/jobs/{id} answers, its ``log_tail`` included (plus the executors, for a
gang's nodes), the derived figures from jobview.py. The page's script reads the API for the rest: the step
history of the plots (GET /v1/jobs/{id}/steps) and the output (GET /v1/jobs/{id}/logs, followed). The live part (``?fragment=1``) is fetched again when the feed reports a change
of this job; the requeue and cancel forms live outside it (typing is never interrupted) and call the /v1 API.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from libs.contracts.bounds import ID_PATTERN
from libs.contracts.secrets import redact
from libs.timeline import timeline

from ...auth import Permission, Principal
from ...routes import reads_of, scoped_fleet
from ...routes.logs import log_tail
from ...scoping import may_see
from .. import jobview
from ..web import render, signed_in

NAV = None
_ID = re.compile(ID_PATTERN)
EVENTS_SHOWN = 500  # the API's page; runs of checkpoints among them are one row each (libs/timeline.py)


def figures(job: dict, executors: list[dict], principal: Principal) -> dict:
    money = jobview.budget(job)
    return {"budget": money, "minimum": jobview.requeue_minimum(money["consumed"]),
            "history": jobview.ceiling_history(job), "cost": jobview.interruption_cost(job),
            "warning": jobview.first_checkpoint_warning(job), "attempts": jobview.attempt_groups(job),
            "ranks": jobview.gang_ranks(job, executors), "timeline": timeline(job.get("events") or []),
            "may_requeue": jobview.may_requeue(job) and principal.can(Permission.FINETUNE_MANAGE),
            "may_cancel": jobview.may_cancel(job, principal.actor, manage=principal.can(Permission.FINETUNE_MANAGE),
                                             submit=principal.can(Permission.FINETUNE_SUBMIT))}


def register(router: APIRouter) -> None:

    @router.get("/jobs/{job_id}")
    async def job_page(request: Request, job_id: str, fragment: bool = False,
                       principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        reads = reads_of(request)
        job = await reads.get_job(job_id, events=EVENTS_SHOWN) if _ID.fullmatch(job_id) else None
        if job is None or not may_see(principal, job.get("owner")):
            return render(request, principal, "not_found.html", "job", status=404, job_id=job_id)
        job["log_tail"] = await log_tail(request, job)
        job = redact(job)
        executors = await scoped_fleet(request, principal, await reads.executors()) if job.get("gang") else []
        template = "job_live.html" if fragment else "job.html"
        return render(request, principal, template, "job", messages=("job.",), job=job,
                      f=figures(job, executors, principal))
