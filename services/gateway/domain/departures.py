"""When an executor's row stops naming its job, and when the row itself ends. Pure: rows in, facts out.

An executor's row is fed by its own heartbeats, so a frozen agent (SIGSTOP, a deadlock, a swap storm) keeps the
last thing it said: ``training`` job J at epoch E. Meanwhile the queue takes J back at lease expiry and grants it
elsewhere. Showing the frozen row as ``training`` J then contradicts the job's own page (issue 26). So:

- ``job_left``: the job the row names has left the executor when the queue has moved it on (its lease epoch is
  past the row's: granted again, here or elsewhere), or taken it back from an executor that went silent (the job
  is no longer granted and the executor's signal is ``no_signal``). A run still stopping after a cancel or a
  preemption is not "left": its executor is heard from, and the queue's row still names that run.
- ``zombie``: messages sent under a lost lease mark a zombie only while the row still names the run it lost; once
  the agent has stopped that run (its heartbeat says idle, or names its new grant) the counts are history.
- ``row_ended``: the row ends (is no longer listed) when the health service has given the executor's node up
  (``gone``: its agent silent for the node-gone time; ``replaced``): registering again brings it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from libs.contracts.nodes import NodeState

# The states the queue holds a job granted in (views.GRANTED; spelled here so views can import this module).
GRANTED = frozenset({"running", "admitting"})
# Node states in which the executor's row ends: the health service gave its agent up.
ENDED_NODE_STATES = frozenset({NodeState.GONE, NodeState.REPLACED})


def job_left(row: Mapping[str, Any], job: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What left the executor (``{job_id, epoch, job_state, job_epoch, job_executor_id}``), or None when the
    row's job is still its own. ``job``: the queue's row of the job the heartbeat names (None: unknown)."""
    if not row.get("job_id") or job is None:
        return None
    epoch, job_epoch = row.get("epoch"), job.get("lease_epoch")
    moved = isinstance(epoch, int) and isinstance(job_epoch, int) and job_epoch > epoch
    taken_back = job.get("state") not in GRANTED and row.get("signal") == "no_signal"
    if not (moved or taken_back):
        return None
    granted = job.get("state") in GRANTED
    return {"job_id": row["job_id"], "epoch": epoch, "job_state": job.get("state"), "job_epoch": job_epoch,
            "job_executor_id": job.get("executor_id") if granted else None}


def is_zombie(row: Mapping[str, Any]) -> bool:
    """Messages under a lost lease (``stale_reports`` + ``stale_heartbeats``) while the row still names the run
    it lost (``left_job``)."""
    stale = int(row.get("stale_reports") or 0) + int(row.get("stale_heartbeats") or 0)
    return stale > 0 and bool(row.get("left_job"))


def row_ended(node_state: Any) -> bool:
    """Whether the executor's row ends: its node is ``gone`` or ``replaced`` (the health service's verdict)."""
    return node_state in ENDED_NODE_STATES
