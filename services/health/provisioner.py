"""The provisioner hook: what a node's transition asks (domain/provisioning.py: drain, reboot, replace, resume)
carried out after the commit that decided it, and audited.

Which provisioner: the Slurm one (``TETO_SLURM_PILOT_DIR`` set; slurm.py) acts on all four for nodes that are
Slurm pilots; for any other node, and without it, a replacement goes to a command (``TETO_PROVISIONER_COMMAND``,
``{node_id}``, ``{group}``, ``{executor_id}`` filled in) or a webhook (``TETO_PROVISIONER_URL``, a POST of the
request as JSON), and the other actions need nothing outside Teto.

At most once: it runs after the commit that changed the node, so a crash right after that commit loses the
request (the node keeps its state; an operator sees it). The group's breaker (domain/breaker.py) has already
decided that a replacement is within budget.
"""

from __future__ import annotations

import asyncio
import logging
import shlex

from libs.contracts.commands import CommandOutcome
from libs.contracts.envelope import new_id
from libs.runtime import outbox
from libs.runtime.service import Runtime

from . import slurm
from .domain.provisioning import Action, Request
from .store import SCHEMA
from .settings import HealthSettings

log = logging.getLogger(__name__)
PROVISION = "provision"  # the audit log's kind of a provisioner's action (an outcome by health, no command)
SERVICE = "health"


async def carry_out(runtime: Runtime, cfg: HealthSettings, request: Request) -> bool:
    """``ask``, then its result in the audit log: an outcome of kind ``provision``, by health, with the request
    and what was done (or refused). True when a record was queued (the relay should be kicked)."""
    result = await ask(cfg, request)
    if result is None:
        return False
    done, what = result
    outcome = CommandOutcome(command_id=new_id(), kind=PROVISION, accepted=done, reason=None if done else what,
                             detail={**request.as_dict(), "actor": SERVICE, "result": what}, by=SERVICE)
    try:
        async with runtime.pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, SCHEMA, [(runtime.subjects.outcome(PROVISION, outcome.command_id), outcome)])
    except Exception:  # noqa: BLE001 - the action is done; its record is logged if it cannot be queued
        log.exception("provisioner result of node %s not queued for the audit log: %s", request.node_id, what)
        return False
    return True


async def ask(cfg: HealthSettings, request: Request) -> tuple[bool, str] | None:
    """Carry out ``request``; (done, what happened) when something outside Teto was asked, else None."""
    try:
        if cfg.slurm_pilot_dir and request.slurm_job_id:
            result = await slurm.act(cfg, request)
            if result is not None:
                (log.warning if result[0] else log.error)("node %s %s in Slurm: %s", request.node_id,
                                                          request.action, result[1])
            return result
        if request.action is not Action.REPLACE:
            return None
        body = request.as_dict()
        if cfg.provisioner_command:
            argv = [a.format(**body) for a in shlex.split(cfg.provisioner_command)]
            proc = await asyncio.create_subprocess_exec(*argv)
            rc = await asyncio.wait_for(proc.wait(), 60)
            log.warning("node %s replaced: provisioner command exited %s", request.node_id, rc)
            return rc == 0, f"provisioner command exited {rc}"
        if cfg.provisioner_url:
            import httpx

            async with httpx.AsyncClient(timeout=30) as client:
                r = await client.post(cfg.provisioner_url, json=body)
            log.warning("node %s replaced: provisioner webhook answered %s", request.node_id, r.status_code)
            return r.is_success, f"provisioner webhook answered {r.status_code}"
        log.error("node %s replaced but no provisioner is configured (TETO_PROVISIONER_COMMAND, "
                  "TETO_PROVISIONER_URL or TETO_SLURM_PILOT_DIR): add a node to group %s by hand", request.node_id,
                  request.group)
        return None
    except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the health service
        log.exception("provisioner hook failed for node %s", request.node_id)
        return False, f"provisioner failed: {type(exc).__name__}: {exc}"
