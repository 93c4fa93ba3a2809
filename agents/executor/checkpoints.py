"""Checkpoint files: atomic writes with a checksummed sidecar, and finding the latest valid one.

A checkpoint is ``<dir>/step-00000120.pt`` plus ``<dir>/step-00000120.json`` ({step, sha256, bytes, created_at,
format}). Both are written to a temporary file in the same directory, fsynced and renamed, so a reader never
sees half a file under the final name; the sidecar is written last, so a checkpoint without one is incomplete.
Used by the SDK (in the training process) and by the agent (to choose where a new attempt resumes from); it
imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from . import ckpt_quota

NAME = re.compile(r"^step-(\d{8,})\.pt$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    sha256: str
    bytes: int
    format: str = "bytes"


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}.pt"


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def _fsync_dir(directory: Path) -> None:
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
    _fsync_dir(path.parent)


def sha256_of(path: Path) -> tuple[str, int]:
    return ckpt_quota.sha256_bounded(path)


def write_sidecar(path: Path, step: int, *, fmt: str = "bytes", now: datetime | None = None,
                  epoch: int | None = None) -> Checkpoint:
    """Checksum a complete checkpoint file and write its sidecar (atomically); from then on it is valid. The sidecar
    records the lease epoch of the run that wrote it (``epoch``, else the run's ``TETO_EPOCH``): a resume takes
    only the checkpoint the queue accepted from that epoch's lease holder (ckpt_fence.py)."""
    path = Path(path)
    sha, size = sha256_of(path)
    meta = {"step": step, "sha256": sha, "bytes": size, "format": fmt,
            "created_at": (now or datetime.now(UTC)).isoformat()}
    epoch = epoch if epoch is not None else _run_epoch()
    if epoch is not None:
        meta["epoch"] = epoch
    data = json.dumps(meta, sort_keys=True).encode()
    write_atomic(sidecar_path(path), lambda f: f.write(data))
    return Checkpoint(step=step, path=path, sha256=sha, bytes=size, format=fmt)


def _run_epoch() -> int | None:
    value = os.environ.get("TETO_EPOCH", "")
    return int(value) if value.isdigit() else None


def save(directory: Path, step: int, write: Callable[[BinaryIO], None], *, fmt: str,
         quota: int | None = None) -> Checkpoint:
    """Write ``<directory>/step-<step>.pt`` through ``write(file)`` atomically, then its sidecar. One larger than
    ``quota`` never gets its name (``ckpt_quota.CheckpointRefused``)."""
    path = checkpoint_path(directory, step)
    write_atomic(path, write, quota=quota, step=step)
    return write_sidecar(path, step, fmt=fmt)


def save_bytes(directory: Path, step: int, data: bytes, *, fmt: str = "bytes", quota: int | None = None) -> Checkpoint:
    return save(directory, step, lambda f: f.write(data), fmt=fmt, quota=quota)


def validate(path: Path, *, quota: int | None = None,
             stopped: Callable[[], bool] | None = None) -> tuple[Checkpoint | None, str | None]:
    """(checkpoint, None) when the file matches its sidecar, else (None, the reason it cannot be used). Bounded:
    a file over ``quota`` (or whose sidecar claims so) is refused without being read, and the hash raises
    ``ckpt_quota.VerificationStopped`` as soon as ``stopped()`` is true."""
    path = Path(path)
    side = sidecar_path(path)
    if path.is_symlink() or side.is_symlink():
        # A run may have planted a link to a file it cannot read itself; the agent (root) must not follow it.
        return None, "a link, not a checkpoint file"
    if not side.exists():
        return None, "no sidecar: the checkpoint was never completed"
    try:
        meta = json.loads(side.read_text())
        step, sha, size = int(meta["step"]), str(meta["sha256"]), int(meta["bytes"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"unreadable sidecar: {exc}"
    if (refused := ckpt_quota.over_quota(size, quota, claimed=True)) is not None:
        return None, refused
    try:
        if not path.is_file():
            return None, "unreadable: not a regular file"
        actual_size = path.stat().st_size
        if actual_size != size:
            return None, f"truncated or altered: {actual_size} bytes, sidecar says {size}"
        actual_sha, _ = ckpt_quota.sha256_bounded(path, limit=quota, stopped=stopped)
    except ValueError as exc:  # it grew past the quota while being read
        return None, str(exc)
    except OSError as exc:
        return None, f"unreadable: {exc}"
    if actual_sha != sha:
        return None, f"checksum mismatch: sha256 {actual_sha[:12]}..., sidecar says {sha[:12]}..."
    return Checkpoint(step=step, path=path, sha256=sha, bytes=size, format=str(meta.get("format", "bytes"))), None


def candidates(directory: Path) -> list[tuple[int, Path]]:
    """Checkpoint files by step, newest first (sidecars alone are not candidates)."""
    found = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return []
    for p in entries:
        m = NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found, key=lambda t: t[0], reverse=True)


def prunable(found: Sequence[tuple[int, bool, str]], step: int, keep: int) -> list[str]:
    """Which checkpoint files go once the one of ``step`` is complete. ``found``: (step, complete, name) of each
    checkpoint file in the directory, complete meaning it has its sidecar. The newest ``keep`` complete ones at or
    before ``step`` stay, with whatever lies between them; every file older than the last of them goes, complete
    or not (a write that never completed, older than a complete checkpoint, is never resumed from). Files newer
    than ``step`` are not touched (a newer checkpoint that failed to validate, which a resume skipped, stays as
    evidence until training writes that step again). ``keep`` of 0 or less keeps everything. Pure."""
    if keep <= 0:
        return []
    older = sorted((f for f in found if f[0] <= step), key=lambda f: f[0], reverse=True)
    kept = 0
    for i, (_, complete, _) in enumerate(older):
        if kept >= keep:
            return [name for _, _, name in older[i:]]
        kept += complete
    return []


def _complete(path: Path) -> bool:
    side = sidecar_path(path)
    return not path.is_symlink() and not side.is_symlink() and side.is_file()


def prune(directory: Path, step: int, keep: int) -> list[int]:
    """Delete the checkpoints ``prunable`` names, each sidecar before its file (one half deleted reads as
    incomplete, never as valid); the steps deleted. A file that cannot be deleted stays (the next prune tries it
    again). Runs in the training process, with its own rights: a link is removed, never followed."""
    if keep <= 0:
        return []
    directory = Path(directory)
    found = candidates(directory)
    names = set(prunable([(s, _complete(p), p.name) for s, p in found], step, keep))
    gone = []
    for s, path in found:
        if path.name not in names:
            continue
        try:
            sidecar_path(path).unlink(missing_ok=True)
            path.unlink(missing_ok=True)
        except OSError:
            continue
        gone.append(s)
    return sorted(gone)


def latest_valid(directory: Path, *, quota: int | None = None, stopped: Callable[[], bool] | None = None,
                 ) -> tuple[Checkpoint | None, list[tuple[Path, str]]]:
    """The newest checkpoint that validates, and every newer one skipped with the reason (``validate``'s bounds:
    ``ckpt_quota.VerificationStopped`` when the run is stopped meanwhile)."""
    skipped: list[tuple[Path, str]] = []
    for _, path in candidates(directory):
        ckpt, reason = validate(path, quota=quota, stopped=stopped)
        if ckpt is not None:
            return ckpt, skipped
        skipped.append((path, reason or "invalid"))
    return None, skipped
