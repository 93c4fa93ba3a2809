"""The agent as a Slurm pilot (libs/slurm/pilot.py submits it): which Slurm job and node it is, how long its
allocation has left, and what a run started in it is told about that.

Slurm ends a pilot three ways, and each becomes the same checkpoint-and-stop (main.py): ``--signal=B:USR1@lead``
the lead time before the time limit, SIGTERM at ``scancel``, preemption or the limit itself (then SIGKILL after
the cluster's KillWait). The run is stopped with a checkpoint first and reported ``stopped``; the queue requeues
its job without spending an attempt, and another pilot resumes it from that checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from libs.contracts.telemetry import LEAVING_STOP
from libs.slurm import commands, rules
from libs.slurm.pilot import PILOT_FLAG, PilotError, time_limit_seconds

log = logging.getLogger(__name__)
LEAVING = LEAVING_STOP  # RunFinished.stop_reason: requeued free, like a transport loss; no more work for it
LEAD_VARIABLE = "TETO_SLURM_SIGNAL_LEAD_SECONDS"


@dataclass(frozen=True)
class Pilot:
    job_id: str
    node: str
    lead_seconds: float


def of(env: Mapping[str, str]) -> Pilot | None:
    """The pilot this agent is, from its environment (Slurm's variables and the pilot's settings file)."""
    job_id, node = env.get("SLURM_JOB_ID"), env.get("SLURMD_NODENAME")
    if env.get(PILOT_FLAG) != "1" or not job_id or not node:
        return None
    try:
        lead = float(env.get(LEAD_VARIABLE) or 0)
    except ValueError:
        lead = 0.0
    return Pilot(job_id, node, lead)


async def time_left(pilot: Pilot) -> float | None:
    """Seconds until the allocation's time limit, as Slurm says now (None: no limit, or Slurm did not answer)."""
    try:
        out = await commands.arun(["squeue", "-h", "-j", pilot.job_id, "-o", "%L"], timeout=10.0)
        return time_limit_seconds(out.strip())
    except (commands.SlurmError, PilotError) as exc:
        log.warning("pilot %s: could not read the allocation's time left: %s", pilot.job_id, exc)
        return None


def allocation(pilot: Pilot, seconds_left: float | None, remaining_gpu_seconds: float | None,
               devices: int) -> dict[str, Any]:
    """What a run's ``started`` event says of the allocation it runs in (with the ceiling warning, if due)."""
    out: dict[str, Any] = {"scheduler": "slurm", "job_id": pilot.job_id, "node": pilot.node,
                           "time_left_seconds": seconds_left, "signal_lead_seconds": pilot.lead_seconds}
    warning = rules.ceiling_warning(remaining_gpu_seconds, devices, seconds_left, pilot.lead_seconds)
    if warning is not None:
        out["warning"] = warning
    return out
