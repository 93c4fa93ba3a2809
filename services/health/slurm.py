"""The Slurm provisioner: Teto's node verdicts carried out on the Slurm node a pilot runs on.

- drain: ``scontrol update NodeName=<node> State=DRAIN Reason="teto: <test> <figure> vs median <m>"``: Slurm puts
  nothing new on the node (the pilot keeps its allocation: DRAINING, then DRAINED once it ends).
- reboot: with ``TETO_SLURM_REBOOT`` (the site lets Teto reboot nodes, RebootProgram set), ``scontrol reboot ASAP
  nextstate=DOWN``: Slurm reboots the node once idle (once its pilot has ended) and leaves it down for its
  administrator; the agent restarts in its allocation either way and is checked again, and a pass cancels the
  pending reboot and resumes the node.
- replace: the pilot's Slurm job is cancelled (the node stays drained with Teto's reason, for the administrator)
  and a new pilot from the same pilot directory is submitted, kept off that node (``--exclude``).
- resume: only a node whose drain reason is Teto's (``teto: ...``); an administrator's drain is left as it is.

Each action returns what it did, or why Slurm refused it; nothing when there was nothing to do in Slurm (a node
that is no pilot's, one not drained or drained by someone else, a reboot not allowed here), which is logged, not
audited. Slurm's commands run with this service's environment (``SLURM_CONF``, PATH) and the rights of its user.
"""

from __future__ import annotations

import logging
from pathlib import Path

from libs.slurm import commands, pilotdir, rules

from .domain.provisioning import Action, Request
from .settings import HealthSettings

log = logging.getLogger(__name__)


async def act(cfg: HealthSettings, request: Request) -> tuple[bool, str] | None:
    """Carry out one request on Slurm: (done, what happened or why Slurm refused), or None: nothing to do."""
    node, job = request.hostname, request.slurm_job_id
    if not node or not job:
        log.info("node %s is not a Slurm pilot's: nothing to %s in Slurm", request.node_id, request.action)
        return None
    try:
        if request.action is Action.DRAIN:
            await commands.arun(commands.drain(node, request.reason))
            return True, f"drained Slurm node {node}: {request.reason}"
        if request.action is Action.RESUME:
            info = commands.parse_node(await commands.arun(commands.show_node(node)))
            state, reason = info.get("State", ""), info.get("Reason")
            if not rules.may_resume(state, reason):
                why = "not drained" if not rules.drained(state) else f"drained by someone else ({reason})"
                log.info("Slurm node %s is %s, %s: left as it is", node, state, why)
                return None
            if rules.reboot_pending(state):  # the reboot Teto asked for is not needed any more: it passed
                await commands.arun(commands.cancel_reboot(node))
            await commands.arun(commands.resume(node))
            return True, f"resumed Slurm node {node} (was {state}: {reason})"
        if request.action is Action.REBOOT:
            if not cfg.slurm_reboot:
                log.info("Slurm reboots are not allowed here (TETO_SLURM_REBOOT): the agent on %s restarts in its "
                         "allocation", node)
                return None
            await commands.arun(commands.reboot(node, request.reason))
            return True, f"asked Slurm to reboot {node} once idle: {request.reason}"
        return True, await _replace(Path(cfg.slurm_pilot_dir or "."), node, job)
    except commands.SlurmError as exc:
        log.error("Slurm %s of node %s (%s) failed: %s", request.action, request.node_id, node, exc)
        return False, f"Slurm refused: {exc}"


async def _replace(pilot_dir: Path, node: str, job: str) -> str:
    try:
        await commands.arun(commands.cancel(job))  # its node is drained: the pilot would hold it for nothing
        ended = f"ended pilot {job} on {node}"
    except commands.SlurmError as exc:  # already gone (its allocation ended): the replacement is still due
        ended = f"pilot {job} on {node} not cancelled ({exc})"
    new = await pilotdir.asubmit(pilot_dir, exclude=(node,))
    return f"{ended}; submitted replacement pilot {new} (not on {node})"
