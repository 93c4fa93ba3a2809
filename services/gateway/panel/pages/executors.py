"""The executors page: node, group, phase, the job it runs (a link), the job's signal badge as the executor's own
row carries it, last heartbeat age, and the messages it sent under a lease it had lost (a zombie is visible).

The rows are GET /v1/executors' (Reads.executors, scoped as the API scopes them: another owner's job id is
hidden). With ``fragment=1`` only the table is answered; the page refreshes it when the live feed reports an
executor heartbeat or a signal (at most once a second, panel.js).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ...auth import Permission, Principal
from ...routes import reads_of, scoped_fleet
from .. import fleet
from ..web import render, signed_in
from ..nav import NavItem

NAV = NavItem("/executors", "executors.nav", Permission.READ, order=20)


def rows_for(rows: list[dict], now: datetime) -> list[dict]:
    return [{**row, "badge": fleet.executor_signal(row), "heartbeat_age": fleet.heartbeat_age(row, now),
             "stale": fleet.stale_count(row), "zombie": fleet.is_zombie(row)} for row in rows]


def register(router: APIRouter) -> None:

    @router.get("/executors")
    async def executors(request: Request, fragment: bool = False,
                        principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        reads = reads_of(request)
        rows = await scoped_fleet(request, principal, await reads.executors())
        # Job names beside their ids, read after scoping: a job hidden from this principal has no id left to name.
        named = {r["job_id"] for r in rows if r.get("job_id")} | {
            r["left_job"]["job_id"] for r in rows if r.get("left_job") and r["left_job"].get("job_id")}
        template = "executors_table.html" if fragment else "executors.html"
        return render(request, principal, template, "executors", messages=("executors.",),
                      executors=rows_for(rows, datetime.now(UTC)), names=await reads.job_names(sorted(named)))
