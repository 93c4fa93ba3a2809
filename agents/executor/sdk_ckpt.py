"""The SDK's side of directory checkpoints (issue 27): sealing a directory a training library wrote
(``checkpoint-120/`` of Hugging Face, a Lightning checkpoint directory) and the report line of any checkpoint.

A directory is sealed once (``ckpt_dir.seal``: its manifest written last); reporting one that already carries a
valid manifest of the same step reuses it, so a callback that reports a checkpoint twice hashes it twice at most,
never re-seals what a resume may already rely on. Used by ``sdk.py``; imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import checkpoints, ckpt_dir
from .checkpoints import Checkpoint


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


def in_layout(path: Path, checkpoint_dir: Path) -> bool:
    """A checkpoint in the job's checkpoint directory under a name a step is read from: retention counts it."""
    return Path(path).parent.resolve() == Path(checkpoint_dir).resolve() and ckpt_dir.step_of(Path(path).name) is not None


def of(sealed_dir: ckpt_dir.Sealed) -> Checkpoint:
    return checkpoints.of_directory(sealed_dir)
