"""The provisioner hook: when a node is replaced, ask for a fresh one in its group, through a command
(``{node_id}``, ``{group}``, ``{executor_id}`` filled in) or a webhook (POST of the request as JSON).

At most once: it runs after the commit that replaced the node, so a crash right after that commit loses the
request (the replaced node stays replaced; an operator sees it). The group's breaker (domain/breaker.py) has
already decided that this replacement is within budget.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from typing import Any

from .settings import HealthSettings

log = logging.getLogger(__name__)


async def ask(cfg: HealthSettings, request: dict[str, Any]) -> None:
    try:
        if cfg.provisioner_command:
            argv = [a.format(**request) for a in shlex.split(cfg.provisioner_command)]
            proc = await asyncio.create_subprocess_exec(*argv)
            rc = await asyncio.wait_for(proc.wait(), 60)
            log.warning("node %s replaced: provisioner command exited %s", request["node_id"], rc)
        elif cfg.provisioner_url:
            import httpx

            async with httpx.AsyncClient(timeout=30) as client:
                r = await client.post(cfg.provisioner_url, json=request)
            log.warning("node %s replaced: provisioner webhook answered %s", request["node_id"], r.status_code)
        else:
            log.error("node %s replaced but no provisioner is configured (TETO_PROVISIONER_COMMAND or "
                      "TETO_PROVISIONER_URL): add a node to group %s by hand", request["node_id"], request["group"])
    except Exception:  # noqa: BLE001 - a broken hook must not stop the health service
        log.exception("provisioner hook failed for node %s", request["node_id"])
