"""Checkpoints: files with a checksummed sidecar, directories with a manifest, and finding the latest valid one.

A checkpoint is ``<dir>/step-00000120.pt`` plus ``<dir>/step-00000120.json`` ({step, sha256, bytes, created_at,
format}). A directory checkpoint (``checkpoint-120/``, issue 27) is complete once its manifest is in it
(``ckpt_dir.py``); both kinds go through the same candidates, validity, retention and resume rules here. Both are
written to a temporary file in the same directory, fsynced and renamed, so a reader never
sees half a file under the final name; the sidecar is written last, so a checkpoint without one is incomplete.
Used by the SDK (in the training process) and by the agent (to choose where a new attempt resumes from); it
imports nothing heavy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from . import ckpt_dir, ckpt_quota
from .ckpt_io import run_epoch, write_atomic

NAME = re.compile(r"^step-(\d{8,})\.pt$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    sha256: str
    bytes: int
    format: str = "bytes"
    kind: str = "file"  # "file" (with its sidecar) or "directory" (with its manifest; sha256 is the manifest's)
    files: int = 1  # regular files in it


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}.pt"


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


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
    epoch = epoch if epoch is not None else run_epoch()
    if epoch is not None:
        meta["epoch"] = epoch
    data = json.dumps(meta, sort_keys=True).encode()
    write_atomic(sidecar_path(path), lambda f: f.write(data))
    return Checkpoint(step=step, path=path, sha256=sha, bytes=size, format=fmt)


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
    if ckpt_dir.holds_checkpoint(path):
        sealed, reason = ckpt_dir.verify(path, quota=quota, stopped=stopped)
        return (None, reason) if sealed is None else (of_directory(sealed), None)
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


def of_directory(sealed: ckpt_dir.Sealed) -> Checkpoint:
    return Checkpoint(step=sealed.step, path=sealed.path, sha256=sealed.sha256, bytes=sealed.bytes,
                      format="directory", kind="directory", files=len(sealed.manifest.files))


def candidates(directory: Path) -> list[tuple[int, Path]]:
    """Checkpoints by step, newest first: files and directories whose name says a step (``ckpt_dir.step_of``:
    ``step-00000120.pt``, ``checkpoint-120``, ``epoch=0-step=120.ckpt``); sidecars alone are not candidates."""
    found = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return []
    for p in entries:
        step = ckpt_dir.step_of(p.name)
        if step is not None:
            found.append((step, p))
    return sorted(found, key=lambda t: (t[0], t[1].name), reverse=True)


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
    if ckpt_dir.holds_checkpoint(path):
        manifest = ckpt_dir.manifest_path(path)
        return not manifest.is_symlink() and manifest.is_file()
    side = sidecar_path(path)
    return not path.is_symlink() and not side.is_symlink() and side.is_file()


def prune(directory: Path, step: int, keep: int) -> list[int]:
    """Delete the checkpoints ``prunable`` names, each sidecar before its file, a directory whole, its manifest
    first (one half deleted reads as incomplete, never as valid); the steps deleted. One that cannot be deleted
    stays (the next prune tries it again). Runs in the training process, with its own rights (and in the agent:
    ``ckpt_fence.retain``): a link is removed, never followed."""
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
            if ckpt_dir.holds_checkpoint(path):
                ckpt_dir.remove(path)
            else:
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
