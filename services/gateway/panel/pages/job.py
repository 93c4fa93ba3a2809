"""One job's follow-up page (GET /jobs/{id}); its facts come from the same view GET /v1/jobs/{id} answers."""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from libs.contracts.bounds import ID_PATTERN
from libs.contracts.secrets import redact

from ...auth import Permission, Principal
from ...routes import reads_of
from ...scoping import may_see
from ..web import render, signed_in

NAV = None
_ID = re.compile(ID_PATTERN)


def register(router: APIRouter) -> None:

    @router.get("/jobs/{job_id}")
    async def job_page(request: Request, job_id: str, fragment: bool = False,
                       principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        job = await reads_of(request).get_job(job_id, events=200) if _ID.fullmatch(job_id) else None
        if job is None or not may_see(principal, job.get("owner")):
            return render(request, principal, "not_found.html", "job", status=404, job_id=job_id)
        template = "job_live.html" if fragment else "job.html"
        return render(request, principal, template, "job", messages=("job.",), job=redact(job))

