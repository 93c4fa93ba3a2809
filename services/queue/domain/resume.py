"""Where a granted run resumes: the latest checkpoint the queue accepted (DESIGN.md section 12).

A checkpoint report counts only from the lease holder of the job's current epoch (``lifecycle.from_holder`` and
the epoch check of ``on_run_fact``); the accepted one is kept as the job's ``last_checkpoint`` with that epoch.
Every grant carries it (``RunJob.resume_from``) and the agent resumes from that file only: a file a fenced-out run
wrote after its lease was gone is never accepted, so never resumed from, whatever its name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from libs.contracts.agents import AcceptedCheckpoint


def resume_point(last_checkpoint: Mapping[str, Any] | None) -> AcceptedCheckpoint | None:
    """The accepted checkpoint a grant carries, from the job's stored ``last_checkpoint``; None when the queue has
    accepted none (or what is stored cannot name one: then the run starts from scratch rather than trust a file).
    A checkpoint accepted before checkpoints carried their epoch has none (the agent then matches step and
    checksum only). Pure."""
    if not last_checkpoint or last_checkpoint.get("step") is None:
        return None
    try:
        return AcceptedCheckpoint(step=last_checkpoint["step"], sha256=last_checkpoint.get("sha256"),
                                  epoch=last_checkpoint.get("epoch"))
    except ValueError:
        return None
