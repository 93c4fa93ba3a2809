"""Checkpoints in a store, as pure rules: where each object goes, what a manifest says, which checkpoint a resume
tries in which order, and which ones retention deletes.

A checkpoint of job J written by the run of epoch E at step S is a set of objects under
``J/e<E>-step-<S>/<path>`` (``path`` relative to the job's local checkpoint directory: ``step-00000120.pt`` and its
sidecar ``step-00000120.json``, or every file of a checkpoint directory ``step-00000120/...``) and one manifest
``J/manifests/step-<S>-e<E>.json`` listing each object's path, key, size and SHA-256. The manifest is written
last: it is the commit point. A checkpoint without one does not exist, whatever objects lie there (an upload
killed midway). The epoch in every key means two runs (a fenced-out one still uploading, and its successor) never
write the same key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from libs.contracts.telemetry import CheckpointKind

from ..ckpt_dir import MANIFEST as DIRECTORY_MANIFEST

SCHEMA = "teto.checkpoint_manifest/1"
MANIFEST_LIMIT = 4 << 20  # a manifest of 10,000 files is about 2 MB; a larger one is not read
_MANIFEST = re.compile(r"^manifests/step-(\d{8,})-e(\d+)\.json$")


class ManifestError(ValueError):
    """A manifest that cannot be read or does not describe a checkpoint."""


def job_prefix(job_id: str) -> str:
    return f"{job_id}/"


def object_key(job_id: str, epoch: int, step: int, path: str) -> str:
    return f"{job_id}/e{epoch}-step-{step:08d}/{path}"


def manifest_key(job_id: str, step: int, epoch: int) -> str:
    return f"{job_id}/manifests/step-{step:08d}-e{epoch}.json"


def parse_manifest_key(job_id: str, key: str) -> tuple[int, int] | None:
    """(step, epoch) of a manifest key of this job, else None."""
    if not key.startswith(job_prefix(job_id)):
        return None
    m = _MANIFEST.match(key[len(job_prefix(job_id)):])
    return (int(m.group(1)), int(m.group(2))) if m else None


def safe_path(path: str) -> str:
    """A relative path as stored in a manifest: no absolute path, no '..', no empty part. Raises ManifestError."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise ManifestError(f"not a relative path inside the checkpoint directory: {path!r}")
    return str(p)


@dataclass(frozen=True)
class Entry:
    """One object of a checkpoint: its path under the job's checkpoint directory, key, size and SHA-256."""

    path: str
    key: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    job_id: str
    step: int
    epoch: int
    path: str  # the checkpoint as the run reported it, relative to the job's directory (a file or a directory)
    sha256: str | None  # the checkpoint's checksum as reported (the queue accepts it by step, epoch and this)
    objects: tuple[Entry, ...]
    written_at: str  # ISO time the run reported it
    stored_at: str  # ISO time its last object was stored
    # The checkpoint the run that wrote this one resumed from ((step, epoch), None: from scratch): a resume whose
    # checkpoints of this epoch are all damaged falls back along it, never to another run's unaccepted files.
    parent: tuple[int, int] | None = None
    schema: str = field(default=SCHEMA)

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.objects)

    def to_bytes(self) -> bytes:
        body = asdict(self)
        body["objects"] = [asdict(e) for e in self.objects]
        body["parent"] = list(self.parent) if self.parent else None
        body["bytes"] = self.bytes
        return json.dumps(body, sort_keys=True).encode()


def load(data: bytes, *, job_id: str, step: int, epoch: int) -> Manifest:
    """A manifest read back, checked against the key it was found under. Raises ManifestError. Pure."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("schema") != SCHEMA:
            raise ManifestError(f"not a {SCHEMA} document")
        objects = tuple(Entry(path=safe_path(str(o["path"])), key=str(o["key"]), bytes=_int(o["bytes"]),
                              sha256=str(o["sha256"]).lower()) for o in body["objects"])
        parent = body.get("parent")
        made = Manifest(job_id=str(body["job_id"]), step=_int(body["step"]), epoch=_int(body["epoch"]),
                        path=safe_path(str(body["path"])), sha256=body.get("sha256"), objects=objects,
                        written_at=str(body.get("written_at", "")), stored_at=str(body.get("stored_at", "")),
                        parent=(_int(parent[0]), _int(parent[1])) if parent else None)
    except ManifestError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ManifestError(f"unreadable manifest: {exc!r}") from None
    if (made.job_id, made.step, made.epoch) != (job_id, step, epoch):
        raise ManifestError(f"manifest of job {made.job_id} step {made.step} epoch {made.epoch} under the key of "
                            f"job {job_id} step {step} epoch {epoch}")
    prefix = object_key(job_id, epoch, step, "")
    for e in objects:
        if e.key != prefix + e.path:
            raise ManifestError(f"object {e.path} is listed under another checkpoint's key {e.key}")
    if not objects:
        raise ManifestError("a manifest with no objects")
    return made


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def shape(made: Manifest) -> tuple[CheckpointKind, int | None]:
    """What the stored checkpoint is, as its report says it: a directory (its objects lie below its path) with the
    files its own ``teto-manifest.json`` lists (every object but that one), or a file (with its sidecar). Pure."""
    below = made.path + "/"
    inside = [e.path for e in made.objects if e.path.startswith(below)]
    if not inside:
        return CheckpointKind.FILE, None
    return CheckpointKind.DIRECTORY, sum(1 for p in inside if p != below + DIRECTORY_MANIFEST)


def stored(job_id: str, keys: Iterable[str]) -> list[tuple[int, int]]:
    """(step, epoch) of every manifest among ``keys``, newest step first. Pure."""
    found = {parsed for key in keys if (parsed := parse_manifest_key(job_id, key)) is not None}
    return sorted(found, reverse=True)


def of_run(found: Sequence[tuple[int, int]], step: int, epoch: int) -> list[tuple[int, int]]:
    """The checkpoints a resume may try within one run's (epoch's) line, newest first: that epoch's at or before
    ``step``. That run's reports reach the queue in order, so its earlier stored checkpoints were accepted before
    the later one; another epoch's, newer or not, never were as far as this line knows. Pure."""
    return sorted(((s, e) for s, e in found if e == epoch and s <= step), reverse=True)


def prunable(found: Sequence[tuple[int, int]], newest: tuple[int, int], keep: int) -> list[tuple[int, int]]:
    """Which stored checkpoints go once ``newest`` (step, epoch) is stored and reported: all but the ``keep``
    newest at or before its step, and any of an earlier epoch past its step (a fenced-out run's, never accepted).
    Checkpoints of ``newest``'s own epoch past its step are not touched (uploads still to be reported). ``keep`` 0
    keeps everything. Pure."""
    if keep <= 0:
        return []
    step, epoch = newest
    older = sorted((f for f in found if f[0] <= step), reverse=True)
    fenced = [f for f in found if f[0] > step and f[1] < epoch]
    return sorted(older[keep:] + fenced)


def held_after(job_id: str, objects: Iterable[tuple[str, int]], gone: Iterable[tuple[int, int]]) -> int:
    """Bytes the job's objects (key, size) hold once the checkpoints ``gone`` (step, epoch) are deleted, manifests
    included. Pure."""
    gone = set(gone)
    dropped = {object_key(job_id, e, s, "") for s, e in gone} | {manifest_key(job_id, s, e) for s, e in gone}
    return sum(size for key, size in objects if key.startswith(job_prefix(job_id))
               and not any(key.startswith(d) for d in dropped))
