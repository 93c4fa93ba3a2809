"""What a node's transition asks of the provisioner, as a pure function: the provisioner interface.

A provisioner is told four things (docs/provisioners.md): ``drain`` (a node failed its checks, or an operator
drained it: keep the site's own scheduler off it, with the reason), ``reboot`` (the node is being recovered),
``replace`` (the node is given up: a fresh one in its group, within the group's replacement budget, which the
breaker has already checked) and ``resume`` (the node passed its checks: undo a drain that was Teto's). The
command and webhook provisioners act on ``replace`` alone; the Slurm provisioner (services/health/slurm.py) on all
four.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from libs.contracts.nodes import NodeEventKind, NodeState
from libs.slurm import rules

from .nodes import Provision, Reboot, Transition


class Action(StrEnum):
    DRAIN = "drain"  # out of the site's scheduling, with the reason (failed checks, an operator's drain)
    REBOOT = "reboot"  # the node is rebooted to recover (the agent restarts; the site may reboot the machine)
    REPLACE = "replace"  # given up: ask for a fresh node in the group
    RESUME = "resume"  # passed its checks: back in the site's scheduling, if Teto drained it


@dataclass(frozen=True)
class Request:
    action: Action
    node_id: str
    group: str
    executor_id: str
    reason: str
    hostname: str | None = None  # the node's host (a Slurm pilot's: its Slurm node name)
    slurm_job_id: str | None = None  # the Slurm job of a pilot's agent

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "action": self.action.value}


def requests_for(t: Transition, *, failed: Sequence[tuple[str, Mapping[str, Any]]] = (),
                 hostname: str | None = None, slurm_job_id: str | None = None) -> list[Request]:
    """The provisioner's requests for one transition, in the order they must be carried out (drain before
    reboot or replace). ``failed``: the failed tests' verdicts of a failed check run (the drain reason)."""
    n = t.node

    def request(action: Action, reason: str) -> Request:
        return Request(action, n.node_id, n.group, n.executor_id or "", reason, hostname, slurm_job_id)

    out = []
    for e in t.events:
        if e.kind is NodeEventKind.FAILED and e.detail.get("run_id"):  # failed a check run (not: unaddressable)
            out.append(request(Action.DRAIN, rules.drain_reason(failed) if failed
                               else f"{rules.TETO} {' '.join(str(e.reason).split())}"[:rules.REASON_MAX]))
        elif e.kind is NodeEventKind.DRAINED:
            out.append(request(Action.DRAIN, rules.operator_drain_reason(e.reason)))
        elif e.kind is NodeEventKind.READY and e.previous is NodeState.CHECKING:
            out.append(request(Action.RESUME, "passed its checks"))
    for effect in t.effects:
        if isinstance(effect, Reboot):
            out.append(request(Action.REBOOT, f"{rules.TETO} reboot {effect.reboots}: {effect.reason}"[
                :rules.REASON_MAX]))
        elif isinstance(effect, Provision):
            out.append(request(Action.REPLACE, effect.reason))
    return out
