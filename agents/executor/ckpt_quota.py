"""A job's checkpoint quota and the bounds of checkpoint verification (issue 26): pure rules, no I/O but the hash.

The quota is the most bytes one checkpoint of the job may have: the smaller of the job's
``checkpoint_quota_bytes`` and its organisation's, resolved by the queue at grant time
(``RunJob.checkpoint_quota_bytes``). It is applied where a checkpoint is written (the SDK refuses to complete a
larger one; the agent refuses to accept a larger one reported to it) and bounds its verification on resume: a
file larger than the quota, or whose sidecar claims so, is never hashed. Hashing stops as soon as the run is
stopped (``stopped()`` is asked between chunks), so a cancel or a lost lease frees the executor within one chunk.
Imports nothing heavy (no pydantic, no torch): the SDK and the agent both use it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 1 << 20  # bytes hashed between two looks at ``stopped``: a stop is seen within one chunk (~1 ms)
QUOTA_ENV = "TETO_CHECKPOINT_QUOTA_BYTES"


class VerificationStopped(Exception):
    """The run was stopped (cancel, ceiling, lost lease, agent shutdown) while its checkpoint was being hashed."""

    def __init__(self, path: Path, hashed: int) -> None:
        super().__init__(f"verification of {path} stopped after {hashed} bytes")
        self.path = path
        self.hashed = hashed


class CheckpointRefused(ValueError):
    """A checkpoint larger than the job's quota: refused when written (its file removed, never reported)."""

    def __init__(self, step: int | None, size: int, quota: int) -> None:
        super().__init__(over_quota(size, quota))
        self.step = step
        self.size = size
        self.quota = quota


def quota_of(job_quota: int, granted_quota: int | None) -> int:
    """The quota a run applies: what its grant carries (the queue's min of job and organisation), else the
    job's own (a grant from a queue before organisation quotas)."""
    return granted_quota if granted_quota is not None else job_quota


def quota_from_env(env: Any) -> int | None:
    """The quota the agent handed a training process (``TETO_CHECKPOINT_QUOTA_BYTES``); None outside Teto or
    when unreadable (no limit then: the agent still refuses an over-quota report)."""
    raw = env.get(QUOTA_ENV, "")
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def over_quota(size: int, quota: int | None, *, claimed: bool = False) -> str | None:
    """Why a checkpoint of ``size`` bytes is refused under ``quota`` (None: it fits, or there is no quota).
    ``claimed``: the size is what a sidecar or a report says, not what was measured."""
    if quota is None or size <= quota:
        return None
    what = "claims" if claimed else "has"
    return f"over the checkpoint quota: the checkpoint {what} {size} bytes, the job's quota is {quota} bytes"


def report_refusal(reported_bytes: Any, measured_bytes: int | None, quota: int | None) -> str | None:
    """Why the agent refuses a checkpoint a training process reported (None: accepted). The size on disk counts,
    whatever the report says; a report claiming more than the quota is refused too (it says so itself)."""
    if measured_bytes is not None:
        reason = over_quota(measured_bytes, quota)
        if reason is not None:
            return reason
    if isinstance(reported_bytes, int) and not isinstance(reported_bytes, bool):
        return over_quota(reported_bytes, quota, claimed=True)
    return None


def sha256_bounded(path: Path, *, limit: int | None = None,
                   stopped: Callable[[], bool] | None = None) -> tuple[str, int]:
    """SHA-256 and size of ``path``, reading at most ``limit`` bytes (a file that grows past it while being read
    raises ValueError with the quota's reason) and raising ``VerificationStopped`` as soon as ``stopped()`` says
    the run was stopped."""
    with open(path, "rb") as f:
        return sha256_stream(f, Path(path), limit=limit, stopped=stopped)


def sha256_stream(f: BinaryIO, path: Path, *, limit: int | None = None, stopped: Callable[[], bool] | None = None,
                  counted: int = 0) -> tuple[str, int]:
    """``sha256_bounded`` of an open file (``path`` names it in errors). ``counted``: bytes of the same checkpoint
    already hashed (a directory's earlier files), which count against ``limit`` too."""
    digest = hashlib.sha256()
    size = 0
    while True:
        if stopped is not None and stopped():
            raise VerificationStopped(Path(path), counted + size)
        chunk = f.read(CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if limit is not None and counted + size > limit:
            raise ValueError(over_quota(counted + size, limit) or "over the checkpoint quota")
        digest.update(chunk)
    return digest.hexdigest(), size
