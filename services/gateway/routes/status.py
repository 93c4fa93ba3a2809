"""``GET /v1/status`` (operators, ``fleet:manage``): the control plane's own health in one view. Always a 200
with ``ok`` and the problems when the gateway runs: a part that is down is one of the problems, never the
answer's failure (services/gateway/status.py)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, Request

from ..auth import Permission, Principal, require
from ..domain.status import unanswered
from ..errors import unavailable
from ..status import StatusGatherer, failure

log = logging.getLogger(__name__)


def register(app: FastAPI) -> None:

    @app.get("/v1/status", tags=["operations"],
             summary="Each service's replicas and singleton holders, NATS members and stream replicas, consumer "
                     "lag, database reachability, executors by state")
    async def get_status(request: Request,
                         _: Principal = Depends(require(Permission.FLEET_MANAGE))) -> dict[str, Any]:
        answer = await current_status(request)
        if answer is None:
            raise unavailable()
        return answer


async def current_status(request: Request) -> dict[str, Any] | None:
    """The status as ``GET /v1/status`` answers it (the panel's status page shows the same); None when this
    gateway gathers none (no bus)."""
    gatherer: StatusGatherer | None = getattr(request.app.state, "status", None)
    if gatherer is None:
        return None
    try:
        return (await gatherer.status()).as_dict()
    except Exception as exc:  # noqa: BLE001 - each part is bounded and reported; this is the last guard
        log.exception("status: gathering failed")
        return unanswered(f"gathering failed: {failure(exc)}").as_dict()
