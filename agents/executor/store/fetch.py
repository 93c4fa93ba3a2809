"""The agent's side of a resume from the store: ``restore`` in a worker thread, retried with back-off while the
store is unavailable (each wait told to ``waiting``, which the job shows), the restored file checked against its
sidecar like a local checkpoint. A run never starts from scratch because the store was down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from libs.contracts.agents import RunJob

from .. import checkpoints, ckpt_dir
from ..checkpoints import Checkpoint
from .base import Store, StoreUnavailable
from .restore import restore
from .uploader import Backoff

log = logging.getLogger(__name__)


def local_check(quota: int | None, stopped: Callable[[], bool] | None) -> Callable[[Path], str | None]:
    """Why a restored checkpoint cannot be used locally, None when it can: judged by the rules of a checkpoint
    kept in place, whatever the store's manifest said of its objects (a file against its sidecar, a directory
    against its own ``teto-manifest.json``, the reason naming the file)."""
    def check(path: Path) -> str | None:
        _, reason = checkpoints.validate(path, quota=quota, stopped=stopped)  # a directory: ckpt_dir.verify
        if reason is not None and ckpt_dir.holds_checkpoint(path):
            return f"{ckpt_dir.MANIFEST} disagrees: {reason}"
        return reason
    return check


async def fetch(store: Store, grant: RunJob, directory: Path, *, quota: int | None = None,
                stopped: Callable[[], bool] | None = None, waiting: Callable[[str], None] | None = None,
                backoff: Backoff = Backoff(first=1.0, cap=30.0)) -> tuple[Checkpoint | None, list[tuple[str, str]]]:
    """The checkpoint to resume from, restored into ``directory``, and those skipped (address, why)."""
    n = 0
    while True:
        try:
            made, path, skipped = await asyncio.to_thread(
                restore, store, grant.job_id, directory, grant.resume_from, quota=quota, stopped=stopped,
                check=local_check(quota, stopped))
        except StoreUnavailable as exc:
            delay = backoff.delay(n)
            n += 1
            why = f"checkpoint store {store.location} unavailable ({exc.reason}); retrying in {delay:.0f}s"
            log.warning("job %s: %s", grant.job_id, why)
            if waiting is not None:
                waiting(why)
            for _ in range(max(1, int(delay * 10))):  # a stop ends the wait within 0.1 s
                if stopped is not None and stopped():
                    from ..ckpt_quota import VerificationStopped

                    raise VerificationStopped(directory, 0) from None
                await asyncio.sleep(0.1)
            continue
        if made is None or path is None:
            return None, skipped
        ckpt = Checkpoint(step=made.step, path=path, sha256=made.sha256 or "", bytes=made.bytes,
                          format="directory" if path.is_dir() else "bytes")
        if not path.is_dir():
            ckpt = checkpoints.validate(path)[0] or ckpt
        return ckpt, skipped
