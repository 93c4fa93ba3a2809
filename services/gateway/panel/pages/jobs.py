"""The jobs list: state, progress, signal badge with its numbers, executor, GPU time against the ceiling, owner,
age; filters by state, signal, owner and name; keyset paging that reaches every job (queries.job_page).

Scoping is the API's: a principal without read:all sees its own jobs only (scoping.owner_filter). With
``fragment=1`` only the table is answered: the page's script swaps it in when the live feed says a job shown
(or a new one) changed.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from libs.contracts.jobs import JobState

from ...auth import Permission, Principal
from ...routes import reads_of
from ...scoping import owner_filter
from ..queries import SIGNALS, JobFilter, job_page
from ..web import render, signed_in
from . import NavItem

NAV = NavItem("/jobs", "common.nav_jobs", Permission.READ, order=10)
PAGE_SIZE = 50


def register(router: APIRouter) -> None:

    @router.get("/jobs")
    async def jobs(request: Request, state: str | None = None, signal: str | None = None,
                   owner: str | None = Query(None, max_length=200), name: str | None = Query(None, max_length=200),
                   cursor: str | None = Query(None, max_length=400), fragment: bool = False,
                   limit: int = Query(PAGE_SIZE, ge=1, le=200),
                   principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        states = [s.value for s in JobState]
        f = JobFilter(state=state if state in states else None, signal=signal if signal in SIGNALS else None,
                      owner=(owner or "").strip() or None, name=(name or "").strip() or None)
        scoped_owner, nothing = owner_filter(principal, f.owner)
        rows, next_cursor = [], None
        if not nothing:
            f = JobFilter(f.state, f.signal, scoped_owner, f.name)
            rows, next_cursor = await job_page(reads_of(request), f, cursor=cursor, limit=limit)
        template = "jobs_table.html" if fragment else "jobs.html"
        return render(request, principal, template, "jobs", messages=("jobs.",), jobs=rows, states=states,
                      signals=SIGNALS, filters={"state": f.state, "signal": f.signal, "owner": owner or "",
                                                "name": f.name or ""},
                      next_cursor=next_cursor, first_page=cursor is None, limit=limit)
