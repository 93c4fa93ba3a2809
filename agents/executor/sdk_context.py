"""Where a training process stands (``sdk.context()``): its job, lease epoch, rank, gang and checkpoint
directory, read from the ``TETO_*`` environment its executor started it with. Used by ``sdk.py``; pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ckpt_quota import quota_from_env


@dataclass(frozen=True)
class Context:
    """Where this process stands: which job and lease epoch, its rank, where checkpoints go."""

    in_teto: bool
    job_id: str | None
    epoch: int | None
    attempt: int | None
    rank: int
    world_size: int
    rendezvous: str | None
    checkpoint_dir: Path
    checkpoint_every: int | None
    resume_from: Path | None
    device: str
    work_dir: Path | None
    params: dict[str, Any] = field(default_factory=dict)
    checkpoints_kept: int = 0  # complete checkpoints kept in checkpoint_dir; 0: every one (outside Teto)
    checkpoint_quota: int | None = None  # most bytes of one checkpoint (the job's quota); None: none (outside Teto)

    @property
    def is_writer(self) -> bool:
        """Only rank 0 writes checkpoints, so the workers of a gang never race on the same file."""
        return self.rank == 0


def env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = env.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        return default


def from_environ(env: Mapping[str, str]) -> Context:
    """The context the agent's ``TETO_*`` variables describe; outside Teto (none set) a process of its own:
    rank 0 of 1, checkpoints in ``./checkpoints``, every one kept. A malformed number reads as unset, and
    parameters that are not a JSON object as none."""
    resume = env.get("TETO_RESUME_FROM", "")
    params: dict[str, Any] = {}
    if env.get("TETO_PARAMS"):
        try:
            decoded = json.loads(env["TETO_PARAMS"])
        except ValueError:
            decoded = None
        params = decoded if isinstance(decoded, dict) else {}
    return Context(
        in_teto=bool(env.get("TETO_JOB_ID")),
        job_id=env.get("TETO_JOB_ID") or None,
        epoch=env_int(env, "TETO_EPOCH", None),
        attempt=env_int(env, "TETO_ATTEMPT", None),
        rank=env_int(env, "TETO_RANK", 0) or 0,
        world_size=env_int(env, "TETO_WORLD_SIZE", 1) or 1,
        rendezvous=env.get("TETO_RENDEZVOUS") or None,
        checkpoint_dir=Path(env.get("TETO_CHECKPOINT_DIR") or "checkpoints"),
        checkpoint_every=env_int(env, "TETO_CHECKPOINT_EVERY", None),
        resume_from=Path(resume) if resume else None,
        device=env.get("TETO_DEVICE") or "cpu",
        work_dir=Path(env["TETO_WORK_DIR"]) if env.get("TETO_WORK_DIR") else None,
        params=params,
        checkpoints_kept=max(env_int(env, "TETO_CHECKPOINTS_KEPT", 0) or 0, 0),
        checkpoint_quota=quota_from_env(env),
    )
