"""Nodes and health checks: the node groups with their counts per state, each node's state, schedulable or not
and why, last check; a check run's live progress per node and per test with its figures against the group's
median; and, for ``fleet:manage``, an on-demand check of a group or of selected nodes, drain and undrain.

Reads are GET /v1/node-groups, /v1/nodes (scoped like the API) and /v1/health-checks/{id}'s. The actions call
those /v1 endpoints from static/nodes.js, which the server judges as it judges the CLI. ``/nodes?run=<id>``
shows that run below the tables; the fragments are refreshed when the feed reports a node event or a check
report.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from libs.contracts.bounds import ID_PATTERN
from libs.contracts.nodes import ALL_TESTS

from ...auth import Permission, Principal
from ...routes import reads_of, scoped_fleet
from .. import fleet
from ..web import render, signed_in
from ..nav import NavItem

NAV = NavItem("/nodes", "nodes.nav", Permission.READ, order=30)
_ID = re.compile(ID_PATTERN)


def run_view(run: dict | None) -> dict | None:
    """A check run with its progress and, for every test, its figures against their references."""
    if run is None:
        return None
    medians = fleet.run_medians(run)
    nodes = [{**node, "tests": [{**test, "rows": fleet.figure_rows(test, medians)} for test in node.get("tests") or []]}
             for node in run.get("nodes") or []]
    return {**run, "nodes": nodes, "progress": fleet.run_progress(run)}


def register(router: APIRouter) -> None:

    @router.get("/nodes")
    async def nodes(request: Request, run: str | None = Query(None, max_length=200), fragment: str | None = None,
                    principal: Principal = Depends(signed_in(Permission.READ))) -> Response:
        reads = reads_of(request)
        found = await reads.check_run(run) if run and _ID.fullmatch(run) else None
        values = {"run": run_view(found), "run_asked": run, "tests": [t.value for t in ALL_TESTS],
                  "metric_label": fleet.metric_label}
        if fragment == "run":
            return render(request, principal, "nodes_run.html", "nodes", **values)
        groups = [{**g, "counts": fleet.state_counts(g.get("states"))} for g in await reads.node_groups()]
        rows = await scoped_fleet(request, principal, await reads.nodes())
        template = "nodes_tables.html" if fragment == "tables" else "nodes.html"
        return render(request, principal, template, "nodes", messages=("nodes.",), groups=groups, nodes=rows,
                      **values)
