"""The usage page (issue 14): GPU-hours, jobs by outcome, interruptions and queue wait per organisation,
project or user over a period: the report GET /v1/usage answers (routes/tenancy.usage_report over
domain/usage.py), for the same people (read, an organisation's token its own organisation only: orgs.usage_org;
without ``read:all`` one's own jobs only: scoping.usage_owner),
with a link to the same report as CSV (``format=csv``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from libs.contracts.bounds import ID_PATTERN

from ...auth import AuthError, Permission, Principal
from ...domain import usage as usages
from ...orgs import usage_org
from ...routes.tenancy import usage_report
from ...scoping import usage_owner
from ..web import PageForbidden, render, signed_in
from ..nav import NavItem

NAV = NavItem("/usage", "usage.nav", Permission.READ, order=45)
_PERIOD = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
_ORG = re.compile(ID_PATTERN)
GROUPS = tuple(g.value for g in usages.GroupBy)


def usage_form(period: str | None, group_by: str | None, org: str | None) -> dict[str, Any]:
    """The form as typed: ``{period, group_by, org, error}``; a blank period is this month, an unknown grouping
    is by organisation, a period that is not YYYY-MM or YYYY-MM-DD (or no such date) is an error to show."""
    text = (period or "").strip()
    form: dict[str, Any] = {"period": text or None, "group_by": group_by if group_by in GROUPS else GROUPS[0],
                            "org": (org or "").strip() or None, "error": None}
    if form["org"] is not None and not _ORG.fullmatch(form["org"]):
        form["error"], form["org"] = f"not an organisation name: {form['org']!r}", None
    if text and not _PERIOD.fullmatch(text):
        form["error"], form["period"] = f"a period is YYYY-MM or YYYY-MM-DD, not {text!r}", None
    return form


def csv_link(form: dict[str, Any], org: str | None) -> str:
    """The API's CSV of the report on show (the panel's session cookie is enough for a GET)."""
    query = {"group_by": form["group_by"], "format": "csv"}
    if form["period"]:
        query["period"] = form["period"]
    if org:
        query["org"] = org
    return "/v1/usage?" + urlencode(query)


def register(router: APIRouter) -> None:

    @router.get("/usage")
    async def usage(request: Request, period: str | None = Query(None, max_length=20),
                    group_by: str | None = Query(None, max_length=20), org: str | None = Query(None, max_length=200),
                    principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        form = usage_form(period, group_by, org)
        try:
            scope = usage_org(principal, form["org"])
        except AuthError as exc:
            raise PageForbidden(principal, exc.permission) from None
        report = None
        if form["error"] is None:
            try:
                start, end = usages.period_window(form["period"], datetime.now(UTC))
            except ValueError as exc:  # 2026-13, 2026-02-30
                form["error"] = str(exc)
            else:
                result = await usage_report(request, scope, start, end, usages.GroupBy(form["group_by"]),
                                            owner=usage_owner(principal))
                report = usages.as_json(result)
        return render(request, principal, "usage.html", "usage", report=report, form=form, org=scope,
                      groups=GROUPS, outcomes=usages.OUTCOMES, csv=csv_link(form, scope))
