"""``GET /v1/status`` (operators, ``fleet:manage``): the control plane's own health in one view."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request

from ..auth import Permission, Principal, require
from ..errors import unavailable
from ..status import StatusGatherer


def register(app: FastAPI) -> None:

    @app.get("/v1/status", tags=["operations"],
             summary="Each service's replicas and singleton holders, NATS members and stream replicas, consumer "
                     "lag, database reachability, executors by state")
    async def get_status(request: Request,
                         _: Principal = Depends(require(Permission.FLEET_MANAGE))) -> dict[str, Any]:
        gatherer: StatusGatherer | None = getattr(request.app.state, "status", None)
        if gatherer is None:
            raise unavailable()
        return (await gatherer.status()).as_dict()
