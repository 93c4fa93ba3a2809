"""Which checkpoint a run resumes from: the one the queue accepted, never a file because it is newest.

The queue accepts a checkpoint report only from the lease holder of the job's current epoch and hands the
accepted one to the next grant (``RunJob.resume_from``: step, sha256, epoch). Each sidecar records the epoch of
the run that wrote it (``checkpoints.write_sidecar``). Here the agent, before a run starts: resumes from the file
that is that accepted checkpoint (its sidecar's step, checksum and epoch; then ``checkpoints.validate``), or, if
that file is gone or damaged, from an older one of the same epoch (that run's reports arrive in order, so its
earlier checkpoints were accepted before the later one); ignores every file the queue never accepted (newer than
the accepted step, or at that step with another checksum or epoch: a fenced-out run's, whatever its name; every
file when nothing was accepted) and deletes those Teto wrote or sealed (``sealed_by_teto``); and leaves older
files to retention. Nothing here may crash a run: a file the agent cannot read (another run's, root-owned 0600)
is a reason, never an exception. Directory checkpoints (``ckpt_dir.py``) go through the same rules.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libs.contracts.agents import AcceptedCheckpoint

from . import checkpoints, ckpt_dir
from .checkpoints import Checkpoint

log = logging.getLogger(__name__)

SIDECAR_LIMIT = 64 << 10  # a sidecar is a few hundred bytes; a bigger one is not read


@dataclass(frozen=True)
class Found:
    """A checkpoint file in the job's directory, as its name and sidecar say (None: the sidecar does not say, or
    cannot be read)."""

    step: int
    path: Path
    sha256: str | None = None
    epoch: int | None = None
    link: bool = False


@dataclass(frozen=True)
class Choice:
    """``resume``: the files to try, in order, for the resume point (validated next); ``fenced``: the files never
    accepted, with why, to ignore and delete."""

    resume: list[Path] = field(default_factory=list)
    fenced: list[tuple[Path, str]] = field(default_factory=list)


def choose(found: Sequence[Found], accepted: AcceptedCheckpoint | None) -> Choice:
    """Split the files of a job's checkpoint directory by what the queue accepted (see the module's docstring).
    Pure."""
    if accepted is None:
        return Choice(fenced=[(f.path, _why(f, "the queue accepted no checkpoint of this job")) for f in found])
    resume: list[Path] = []
    older: list[Found] = []
    fenced: list[tuple[Path, str]] = []
    for f in found:
        if f.step > accepted.step:
            fenced.append((f.path, _why(f, f"newer than the last checkpoint the queue accepted (step "
                                           f"{accepted.step}): never accepted, a fenced-out run's")))
        elif f.step == accepted.step:
            if is_accepted(f, accepted):
                resume.append(f.path)
            else:
                fenced.append((f.path, _why(f, f"not the checkpoint the queue accepted at step {accepted.step} "
                                               f"(epoch {accepted.epoch}): another run wrote it")))
        elif not f.link and accepted.epoch is not None and f.epoch == accepted.epoch:
            older.append(f)
    resume += [f.path for f in sorted(older, key=lambda f: f.step, reverse=True)]
    return Choice(resume=resume, fenced=fenced)


def is_accepted(f: Found, accepted: AcceptedCheckpoint) -> bool:
    """The file is the accepted checkpoint: same step, and the checksum and epoch its sidecar records are the ones
    the queue accepted (either left unsaid by the queue, for a report made before they were recorded, is not
    compared; a sidecar without an epoch is an older writer's, matched by its checksum). Pure."""
    if f.link or f.step != accepted.step:
        return False
    if accepted.sha256 is not None and (f.sha256 or "").lower() != accepted.sha256.lower():
        return False
    return accepted.epoch is None or f.epoch is None or f.epoch == accepted.epoch


def _why(f: Found, reason: str) -> str:
    return "a link, not a checkpoint file" if f.link else reason


def resume_point(directory: Path, accepted: AcceptedCheckpoint | None, *, clean: bool = True, **bounds: Any
                 ) -> tuple[Checkpoint | None, list[tuple[Path, str]]]:
    """The checkpoint a run resumes from (None: from scratch) and every file skipped, with why; with ``clean`` (the
    directory's writer, rank 0) the files never accepted are deleted (each sidecar before its file), as far as the
    agent may. ``bounds`` go to ``checkpoints.validate`` as they are (how its verification is bounded is not this
    module's business; whatever it raises to end a verification passes through). Never raises for a file."""
    choice = choose([inspect(step, path) for step, path in checkpoints.candidates(directory)], accepted)
    skipped: list[tuple[Path, str]] = []
    for path, why in choice.fenced:
        skipped.append((path, why))
        if clean and sealed_by_teto(path):
            remove(path)
    for path in choice.resume:
        try:
            ckpt, reason = checkpoints.validate(path, **bounds)
        except OSError as exc:  # whatever the file is, it is a reason to skip it
            ckpt, reason = None, f"unreadable: {exc}"
        if ckpt is not None:
            return ckpt, skipped
        skipped.append((path, reason or "invalid"))
    return None, skipped


def inspect(step: int, path: Path) -> Found:
    """What a checkpoint file's sidecar (a directory's manifest, whose own SHA-256 is the checkpoint's checksum)
    says of it; a link (the file, its sidecar, the directory, its manifest) is never followed."""
    if ckpt_dir.holds_checkpoint(path):
        return _inspect_directory(step, path)
    side = checkpoints.sidecar_path(path)
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode) or (os.path.lexists(side) and stat.S_ISLNK(os.lstat(side).st_mode)):
            return Found(step, path, link=True)
        fd = os.open(side, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            data = os.read(fd, SIDECAR_LIMIT + 1)
        finally:
            os.close(fd)
        meta = json.loads(data) if len(data) <= SIDECAR_LIMIT else {}
    except (OSError, ValueError):
        return Found(step, path)
    if not isinstance(meta, dict):
        return Found(step, path)
    sha, epoch = meta.get("sha256"), meta.get("epoch")
    return Found(step, path, sha256=sha if isinstance(sha, str) else None,
                 epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None)


def sealed_by_teto(path: Path) -> bool:
    """Whether a checkpoint never accepted is Teto's to delete: a file of the SDK's layout (``step-N.pt``, complete
    or not), or any other that Teto sealed (its sidecar, a directory's manifest, or a link in their place). A
    training library's own unreported ``checkpoint-N/`` or ``...step=N.ckpt`` is the script's: skipped, never
    deleted (a job that keeps its checkpoints itself loses nothing on a requeue)."""
    if checkpoints.NAME.match(path.name):
        return True
    marker = ckpt_dir.manifest_path(path) if ckpt_dir.holds_checkpoint(path) else checkpoints.sidecar_path(path)
    return os.path.lexists(marker) or os.path.islink(path)


def _inspect_directory(step: int, path: Path) -> Found:
    try:
        data = ckpt_dir.read_manifest(path)
        meta = json.loads(data)
    except (OSError, ValueError):
        return Found(step, path)
    epoch = meta.get("epoch") if isinstance(meta, dict) else None
    return Found(step, path, sha256=hashlib.sha256(data).hexdigest(),
                 epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None)


def remove(path: Path) -> None:
    """Delete a checkpoint never accepted, its sidecar first (a directory whole, its manifest first: half deleted
    reads as incomplete, never as valid); one the agent may not delete stays, ignored all the same."""
    if ckpt_dir.holds_checkpoint(path):
        try:
            ckpt_dir.remove(path)
        except OSError as exc:
            log.warning("cannot delete %s, a checkpoint the queue never accepted (ignored all the same): %s", path,
                        exc)
        return
    for p in (checkpoints.sidecar_path(path), path):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot delete %s, a checkpoint the queue never accepted (ignored all the same): %s", p, exc)


def confirm(path: Path, step: int) -> None:
    """Tell the run the newest checkpoint step whose report the bus has taken (``TETO_CHECKPOINT_CONFIRMED``): its
    retention deletes nothing newer than that (sdk.py), so a run whose reports go nowhere (its agent frozen, its
    bus cut off) cannot delete the checkpoint the queue accepted. Best effort: a step not written only keeps more."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # the run (its own uid) reads it
            os.write(fd, str(int(step)).encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("checkpoint confirmation not written to %s: %s", path, exc)


def retain(directory: Path, keep: int, step: int) -> None:
    """Retention up to a checkpoint whose report the bus took (``checkpoints.prune``, which never follows a link):
    what the run's own retention would have deleted had the confirmation come before its last checkpoint."""
    try:
        checkpoints.prune(directory, step, keep)
    except OSError as exc:
        log.debug("older checkpoints in %s not removed: %s", directory, exc)
