"""One job's follow-up page (GET /jobs/{id}).

The facts come from the same view GET /v1/jobs/{id} answers, its ``log_tail`` included (plus the executors, for a
gang's nodes), the derived figures from jobview.py. The page's script reads the API for the rest: the step
history of the plots (GET /v1/jobs/{id}/steps) and the output (GET /v1/jobs/{id}/logs, followed). The live part (``?fragment=1``) is fetched again when the feed reports a change
of this job; the requeue and cancel forms live outside it (typing is never interrupted). Cancel calls the /v1 API;
requeue posts the ceiling as typed to ``POST /jobs/{id}/requeue``, which reads it in the page's locale
(numparse.py: ``100,5`` in pt-BR is 100.5, ``1.5`` is refused as ambiguous, with the reason in the page's words) and
then requeues exactly as ``POST /v1/jobs/{id}/requeue`` (routes/jobs.py ``requeue_job``: same permission, command,
audit and answers).
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from libs.contracts.bounds import ID_PATTERN
from libs.contracts.secrets import redact
from libs.timeline import timeline

from ...auth import Permission, Principal, require
from ...routes import reads_of, scoped_fleet
from ...routes.jobs import RequeueBody, requeue_job, with_reports
from ...routes.logs import log_tail
from ...scoping import may_see
from .. import fmt, i18n, jobview, numparse
from ..web import locale_of, render, signed_in

NAV = None
_ID = re.compile(ID_PATTERN)
_CEILING_MOST = next(m.le for m in RequeueBody.model_fields["gpu_ceiling_seconds"].metadata if hasattr(m, "le"))
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


def number_refusal(typed: str, locale: str) -> str | None:
    """Why ``typed`` is no ceiling, in ``locale``'s words (the catalogue's ``numbers.*``); None when it is one."""
    reading = numparse.parse_number(typed, locale)
    if not reading.ok:
        group, point = numparse.separators(locale)
        return i18n.translate(locale, f"numbers.{reading.problem}", text=typed.strip(), group=group, point=point,
                              other=numparse.written(reading.other, locale),
                              mine=numparse.written(reading.mine, locale))
    try:
        RequeueBody(gpu_ceiling_seconds=reading.value)
    except ValidationError:
        return i18n.translate(locale, "numbers.ceiling_out_of_range", text=typed.strip(),
                              most=fmt.number(_CEILING_MOST, locale))
    return None


def register(router: APIRouter) -> None:

    @router.post("/jobs/{job_id}/requeue")
    async def requeue_as_typed(request: Request, job_id: str,
                               principal: Principal = Depends(require(Permission.FINETUNE_MANAGE))) -> Response:
        """The requeue form: ``{"ceiling": "<as typed>"}``. A text the page's locale cannot read exactly once is
        refused (422, ``error: unreadable_number``, the reason in the page's words); else the API's requeue."""
        try:
            typed = (await request.json()).get("ceiling")
        except (ValueError, AttributeError):
            typed = None
        locale = locale_of(request)
        refusal = number_refusal(typed if isinstance(typed, str) else "", locale)
        if refusal is not None:
            return JSONResponse({"error": "unreadable_number", "reason": refusal, "typed": typed}, status_code=422)
        value = numparse.parse_number(typed, locale).value
        return await requeue_job(request, job_id, principal, value)

    @router.get("/jobs/{job_id}")
    async def job_page(request: Request, job_id: str, fragment: bool = False,
                       principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        reads = reads_of(request)
        job = await reads.get_job(job_id, events=EVENTS_SHOWN) if _ID.fullmatch(job_id) else None
        if job is None or not may_see(principal, job.get("owner")):
            return render(request, principal, "not_found.html", "job", status=404, job_id=job_id)
        job["log_tail"] = await log_tail(request, job)
        await with_reports(request, job)
        job = redact(job)
        executors = await scoped_fleet(request, principal, await reads.executors()) if job.get("gang") else []
        template = "job_live.html" if fragment else "job.html"
        return render(request, principal, template, "job", messages=("job.", "numbers.", "terms.log_"), job=job,
                      f=figures(job, executors, principal), ceiling_most=_CEILING_MOST)
