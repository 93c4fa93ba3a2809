"""Nodes and deep health checks: on-demand check runs, their per-node per-test progress, nodes and groups,
drain and undrain, and clearing a group's systemic-failure alert (the replacement breaker). Reads come from the health service's public views (``health.nodes_public``,
``health.node_groups_public``, ``health.check_runs_public``); changes are commands the health service decides.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import Field, model_validator

from libs.contracts.bounds import ID_PATTERN, Id, Reason
from libs.contracts.commands import ClearGroupAlert, Command, DrainNode, RunHealthCheck, UndrainNode
from libs.contracts.envelope import Model
from libs.contracts.nodes import CheckTest

from ..auth import Permission, Principal, require
from ..domain.outcomes import status_for
from ..errors import ApiError, not_found
from . import COMMAND_KEY, commands_of, reads_of, scoped_fleet

_NODE = re.compile(ID_PATTERN)
_GROUP = re.compile(ID_PATTERN)


class CheckRequest(Model):
    group: Id | None = Field(None, description="Every ready node of a group")
    nodes: list[Id] = Field(default_factory=list, max_length=1000, description="Or these nodes")
    tests: list[CheckTest] = Field(default_factory=list, description="Empty: the whole suite")
    force: bool = Field(False, description="Busy nodes: checkpoint and requeue their job first (no attempt spent)")

    @model_validator(mode="after")
    def _one_target(self) -> CheckRequest:
        if bool(self.group) == bool(self.nodes):
            raise ValueError("name a group or a list of nodes (not both)")
        return self


class DrainBody(Model):
    reason: Reason = Field("drained by operator", max_length=1000)


class ClearAlertBody(Model):
    reason: Reason = Field("cleared by operator", max_length=1000, description="What was done about the cause")


async def _send(request: Request, cmd: Command) -> JSONResponse:
    sent = await commands_of(request).send(cmd)
    out = sent.outcome
    if out is None:
        return JSONResponse({"command_id": sent.command_id, "status": "pending"}, status_code=202)
    status = status_for(cmd.KIND, out.accepted, out.reason, out.detail)
    if not out.accepted:
        raise ApiError(status, "refused", out.reason or "refused", detail=jsonable_encoder(out.detail),
                       command_id=sent.command_id, by=out.by)
    return JSONResponse(jsonable_encoder({"command_id": sent.command_id, **out.detail}), status_code=status)


def register(app: FastAPI) -> None:

    @app.post("/v1/health-checks", tags=["fleet"], summary="Run deep checks on a group or nodes (busy ones wait)",
              openapi_extra={COMMAND_KEY: "run_health_check"})
    async def run_checks(request: Request, body: CheckRequest,
                         principal: Principal = Depends(require(Permission.FLEET_MANAGE))) -> JSONResponse:
        cmd = RunHealthCheck(actor=principal.actor, group=body.group, nodes=body.nodes, tests=body.tests,
                             force=body.force)
        return await _send(request, cmd)

    @app.get("/v1/health-checks/{run_id}", tags=["fleet"], summary="A check run: per node, per test, with figures")
    async def get_run(request: Request, run_id: str,
                      _: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        run = await reads_of(request).check_run(run_id) if _NODE.match(run_id) else None
        if run is None:
            raise not_found("check run", run_id)
        return jsonable_encoder(run)

    @app.get("/v1/nodes", tags=["fleet"], summary="Nodes: state, schedulable or not and why, last check")
    async def list_nodes(request: Request,
                         principal: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        return jsonable_encoder(await scoped_fleet(request, principal, await reads_of(request).nodes()))

    @app.get("/v1/node-groups", tags=["fleet"], summary="Node groups: nodes per state, schedulable, last check")
    async def list_groups(request: Request,
                          _: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        return jsonable_encoder(await reads_of(request).node_groups())

    @app.post("/v1/nodes/{node_id}/drain", tags=["fleet"], summary="Take a node out of scheduling",
              openapi_extra={COMMAND_KEY: "drain_node"})
    async def drain(request: Request, node_id: str, body: DrainBody | None = None,
                    principal: Principal = Depends(require(Permission.FLEET_MANAGE))) -> JSONResponse:
        if not _NODE.match(node_id):
            raise not_found("node", node_id)
        return await _send(request, DrainNode(actor=principal.actor, node_id=node_id,
                                              reason=(body or DrainBody()).reason))

    @app.post("/v1/nodes/{node_id}/undrain", tags=["fleet"], summary="Return a drained node (checked first)",
              openapi_extra={COMMAND_KEY: "undrain_node"})
    async def undrain(request: Request, node_id: str,
                      principal: Principal = Depends(require(Permission.FLEET_MANAGE))) -> JSONResponse:
        if not _NODE.match(node_id):
            raise not_found("node", node_id)
        return await _send(request, UndrainNode(actor=principal.actor, node_id=node_id))

    @app.post("/v1/node-groups/{group}/clear-alert", tags=["fleet"],
              summary="Clear a group's systemic-failure alert: replacing resumes, held nodes return (checked first)",
              openapi_extra={COMMAND_KEY: "clear_group_alert"})
    async def clear_alert(request: Request, group: str, body: ClearAlertBody | None = None,
                          principal: Principal = Depends(require(Permission.FLEET_MANAGE))) -> JSONResponse:
        if not _GROUP.match(group):
            raise not_found("group", group)
        return await _send(request, ClearGroupAlert(actor=principal.actor, group=group,
                                                    reason=(body or ClearAlertBody()).reason))
