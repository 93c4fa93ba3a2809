"""The jobs list: state, progress, signal badge with its numbers, executor, GPU time against the ceiling, owner,
age; filters by state, signal, owner and name; keyset paging that reaches every job: the API's own
(Reads.jobs_page and domain/paging.py, as GET /v1/jobs and its X-Next-Cursor), so both pages agree.

Scoping is the API's: a principal without read:all sees its own jobs only (scoping.owner_filter). With
``fragment=1`` only the table is answered: the page's script swaps it in when the live feed says a job shown
(or a new one) changed.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from libs.contracts.jobs import JobState
from libs.contracts.nodes import Signal

from ...auth import Permission, Principal
from ...domain import paging
from ...routes import reads_of
from ...scoping import owner_filter
from .. import jobview
from ..web import render, signed_in
from ..nav import NavItem

NAV = NavItem("/jobs", "common.nav_jobs", Permission.READ, order=10)
PAGE_SIZE = 50
STATES = tuple(s.value for s in JobState)
SIGNALS = (Signal.STUCK.value, Signal.NO_SIGNAL.value)  # the badges worth a filter (ok is most jobs)


def filters(state: str | None, signal: str | None, owner: str | None, name: str | None) -> dict[str, str | None]:
    """The list's filters as typed in the form: an unknown state or signal, or a blank field, is no filter."""
    return {"state": state if state in STATES else None, "signal": signal if signal in SIGNALS else None,
            "owner": (owner or "").strip() or None, "name": (name or "").strip() or None}


def position(cursor: str | None) -> paging.Position | None:
    """Where the page starts: a cursor this gateway made, else the first page (a cut or edited link)."""
    try:
        return paging.decode_cursor(cursor) if cursor else None
    except paging.BadCursor:
        return None


def register(router: APIRouter) -> None:

    @router.get("/jobs")
    async def jobs(request: Request, state: str | None = None, signal: str | None = None,
                   owner: str | None = Query(None, max_length=200), name: str | None = Query(None, max_length=200),
                   cursor: str | None = Query(None, max_length=paging.MAX_CURSOR_CHARS), fragment: bool = False,
                   limit: int = Query(PAGE_SIZE, ge=1, le=200),
                   principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        f = filters(state, signal, owner, name)
        scoped_owner, nothing = owner_filter(principal, f["owner"])
        start = position(cursor)
        rows, next_cursor = [], None
        if not nothing:
            rows, next_cursor = await reads_of(request).jobs_page(
                state=f["state"], owner=scoped_owner, name=f["name"], signal=f["signal"], cursor=start, limit=limit)
        template = "jobs_table.html" if fragment else "jobs.html"
        # The first-checkpoint warning of the job's page, on its row too (issue 26).
        warnings = {row["id"]: jobview.first_checkpoint_warning(row) for row in rows}
        return render(request, principal, template, "jobs", messages=("jobs.",), jobs=rows, states=list(STATES),
                      signals=SIGNALS, warnings=warnings, filters={**f, "owner": owner or "", "name": f["name"] or ""},
                      next_cursor=next_cursor, first_page=start is None, limit=limit)
