"""The SDK's checkpoint chores apart from its report pipe: sealing a directory a training library wrote
(``checkpoint-120/`` of Hugging Face, a Lightning checkpoint directory: issue 27), the report line of any
checkpoint, the step a resume starts from, and retention (``prune``).

A directory is sealed once (``ckpt_dir.seal``: its manifest written last); reporting one that already carries a
valid manifest of the same step reuses it, so a callback that reports a checkpoint twice hashes it twice at most,
never re-seals what a resume may already rely on. Used by ``sdk.py``; imports nothing heavy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from . import checkpoints, ckpt_dir
from .checkpoints import Checkpoint
from .sdk_context import Context


def sealed(path: Path, step: int, *, quota: int | None) -> ckpt_dir.Sealed:
    """The directory checkpoint at ``path`` for ``step``: its manifest if it already has a valid one of that step,
    else sealed now. Raises ``ckpt_dir.Invalid`` (a link or special file inside) or
    ``ckpt_quota.CheckpointRefused`` (its files come to more than ``quota``)."""
    found, _ = ckpt_dir.verify(path, quota=quota)
    if found is not None and found.step == step:
        return found
    return ckpt_dir.seal(path, step, quota=quota)


def record(ckpt: Checkpoint) -> dict[str, Any]:
    """The report line of a complete checkpoint (``reports.py`` reads it on the agent's side)."""
    line: dict[str, Any] = {"type": "checkpoint", "step": ckpt.step, "path": str(Path(ckpt.path).resolve()),
                            "sha256": ckpt.sha256, "bytes": ckpt.bytes, "kind": ckpt.kind}
    if ckpt.kind == "directory":
        line["files"] = ckpt.files
    return line


def step_of_resume(path: Path) -> int | None:
    """The step of a resume checkpoint that does not validate in this process (the agent validated it; the run may
    not read it all, as another rank's copy): what its name says."""
    return ckpt_dir.step_of(Path(path).name)


def resumed_step(path: Path) -> int | None:
    """The step of the directory checkpoint the agent chose to resume from, read from its manifest: the agent
    verified every file just before starting the run, and hashing gigabytes twice would only delay it (None for a
    file checkpoint, or a manifest this process cannot read)."""
    if not ckpt_dir.holds_checkpoint(path):
        return None
    try:
        return ckpt_dir.parse(ckpt_dir.read_manifest(path)).step
    except (OSError, ValueError):
        return None


def prune(ctx: Context, step: int, confirmed_file: str | None) -> None:
    """Once the checkpoint of ``step`` is complete: the older ones beyond the newest ``checkpoints_kept`` complete
    ones are deleted (``checkpoints.prune``: files with their sidecars, directories whole). Never raises: a
    checkpoint left behind costs space, not the run; the reason goes to the job's output."""
    if ctx.checkpoints_kept <= 0:
        return
    try:
        if confirmed_file:
            # Under Teto: nothing newer than the last checkpoint whose report the bus took counts (ckpt_fence.py),
            # so a run whose reports go nowhere never deletes the checkpoint the queue accepted.
            confirmed = _confirmed_step(confirmed_file)
            if confirmed is None:
                return
            step = min(step, confirmed)
        checkpoints.prune(ctx.checkpoint_dir, step, ctx.checkpoints_kept)
    except Exception as exc:  # noqa: BLE001 - never the training's failure
        print(f"teto: older checkpoints not removed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _confirmed_step(path: str) -> int | None:
    try:
        with open(path) as f:
            value = f.read(32).strip()
    except OSError:
        return None
    return int(value) if value.isdigit() else None


def in_layout(path: Path, checkpoint_dir: Path) -> bool:
    """A checkpoint in the job's checkpoint directory under a name a step is read from: retention counts it."""
    return Path(path).parent.resolve() == Path(checkpoint_dir).resolve() and ckpt_dir.step_of(Path(path).name) is not None


def of(sealed_dir: ckpt_dir.Sealed) -> Checkpoint:
    return checkpoints.of_directory(sealed_dir)
