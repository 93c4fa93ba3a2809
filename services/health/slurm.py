"""The Slurm provisioner: Teto's node verdicts carried out on the Slurm node a pilot runs on.

- drain: ``scontrol update NodeName=<node> State=DRAIN Reason="teto: <test> <figure> vs median <m>"``: Slurm puts
  nothing new on the node (the pilot keeps its allocation: DRAINING, then DRAINED once it ends).
- reboot: with ``TETO_SLURM_REBOOT`` (the site lets Teto reboot nodes, RebootProgram set), ``scontrol reboot ASAP
  nextstate=RESUME`` once the node is idle; the agent restarts in its allocation either way and is checked again.
- replace: the pilot's Slurm job is cancelled (the node stays drained with Teto's reason, for the administrator)
  and a new pilot from the same pilot directory is submitted, kept off that node (``--exclude``).
- resume: only a node whose drain reason is Teto's (``teto: ...``); an administrator's drain is left as it is.

Each action returns what it did or why not (a Slurm error included); the caller audits it. Slurm's commands run
with this service's environment (``SLURM_CONF``, PATH) and the rights of its user.
"""

from __future__ import annotations

import logging
from pathlib import Path

from libs.slurm import commands, pilotdir, rules

from .domain.provisioning import Action, Request
from .settings import HealthSettings

log = logging.getLogger(__name__)


async def act(cfg: HealthSettings, request: Request) -> tuple[bool, str]:
    """Carry out one request on Slurm: (done, what happened or why not)."""
    node, job = request.hostname, request.slurm_job_id
    if not node or not job:
        return False, f"node {request.node_id} is not a Slurm pilot's: nothing to do in Slurm"
    try:
        if request.action is Action.DRAIN:
            await commands.arun(commands.drain(node, request.reason))
            return True, f"drained Slurm node {node}: {request.reason}"
        if request.action is Action.RESUME:
            info = commands.parse_node(await commands.arun(commands.show_node(node)))
            state, reason = info.get("State", ""), info.get("Reason")
            if not rules.may_resume(state, reason):
                why = "not drained" if not rules.drained(state) else f"drained by someone else ({reason})"
                return False, f"Slurm node {node} is {state}, {why}: left as it is"
            await commands.arun(commands.resume(node))
            return True, f"resumed Slurm node {node} (was {state}: {reason})"
        if request.action is Action.REBOOT:
            if not cfg.slurm_reboot:
                return False, (f"Slurm reboots are not allowed here (TETO_SLURM_REBOOT): the agent on {node} "
                               "restarts in its allocation")
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
