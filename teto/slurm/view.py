"""What ``teto slurm status`` shows, as pure functions: each pilot's Slurm state beside its Teto node's state,
and the Slurm nodes Teto has drained (with its reason) that no pilot holds any more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from libs.slurm import rules
from libs.slurm.commands import PilotJob
from libs.slurm.pilot import PILOT_FLAG, pilot_ids


def ids_of(job: PilotJob, cluster: str | None) -> tuple[str, str] | None:
    """The executor and node ids the pilot's agent takes (the same rule as the agent's, libs/slurm/pilot.py)."""
    if not job.node:
        return None
    return pilot_ids({PILOT_FLAG: "1", "SLURM_JOB_ID": job.job_id, "SLURMD_NODENAME": job.node,
                      "SLURM_CLUSTER_NAME": cluster or "slurm"})


def rows(jobs: Iterable[PilotJob], cluster: str | None, teto_nodes: Iterable[Mapping[str, Any]],
         slurm_nodes: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """One row per pilot: its Slurm job and phase, its node's Slurm state and reason, its Teto node and state
    (``-`` until the agent has registered), whether Teto may schedule on it."""
    by_node = {n.get("node_id"): n for n in teto_nodes}
    out = []
    for job in jobs:
        ids = ids_of(job, cluster)
        teto = by_node.get(ids[1]) if ids else None
        slurm = slurm_nodes.get(job.node or "", {})
        out.append({"job_id": job.job_id, "slurm_state": job.state, "phase": rules.pilot_phase(job.state).value,
                    "slurm_node": job.node, "node_state": slurm.get("State"), "node_reason": slurm.get("Reason"),
                    "time_left": job.time_left, "partition": job.partition,
                    "teto_node": ids[1] if ids else None, "teto_state": teto.get("state") if teto else None,
                    "schedulable": teto.get("schedulable") if teto else None})
    return out


def drained_without_pilot(slurm_nodes: Mapping[str, Mapping[str, str]], pilot_nodes: Iterable[str | None]
                          ) -> list[dict[str, str]]:
    """Slurm nodes drained by Teto (reason ``teto: ...``) where no pilot runs: an administrator's to repair."""
    held = set(pilot_nodes)
    return [{"slurm_node": name, "node_state": info.get("State", ""), "node_reason": info.get("Reason", "")}
            for name, info in sorted(slurm_nodes.items())
            if name not in held and rules.may_resume(info.get("State", ""), info.get("Reason"))]
