"""Durable writes of checkpoint files: a temp file in the same directory, fsynced, renamed, the directory fsynced.

Shared by the file checkpoints (``checkpoints.py``: the checkpoint and its sidecar) and the directory checkpoints
(``ckpt_dir.py``: the manifest, written last). A reader never sees half a file under its final name. Imports
nothing heavy.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from . import ckpt_quota


def run_epoch() -> int | None:
    """The lease epoch of the run this process is (``TETO_EPOCH``), recorded in what it seals; None outside Teto."""
    value = os.environ.get("TETO_EPOCH", "")
    return int(value) if value.isdigit() else None


def fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[BinaryIO], None], *, quota: int | None = None,
                 step: int | None = None) -> None:
    """Write through ``write(file)`` into a temp file next to ``path``, fsync, then rename over ``path``. With a
    ``quota``, a file larger than it is removed before it gets the final name (``ckpt_quota.CheckpointRefused``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            size = os.fstat(f.fileno()).st_size  # the apparent size: a sparse file counts whole, as a reader sees it
            if quota is not None and size > quota:
                raise ckpt_quota.CheckpointRefused(step, size, quota)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
