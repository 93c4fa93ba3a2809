"""Resume on any node: the checkpoint the queue accepted, downloaded from the store and verified object by object.

Before a run starts, the agent lists the job's manifests and tries, newest first, the accepted checkpoint, then
the older ones of the same run (epoch), then along the line it resumed from (each manifest names its parent):
never another run's checkpoint the queue did not accept. Each object is downloaded beside its place, its size and
SHA-256 checked against the manifest, and only when all of them are good are they renamed into place, seals last
(a sidecar, a directory's manifest file), so a half-restored checkpoint reads as incomplete. A file already here
with the right checksum is kept (a resume on the same node downloads nothing). A corrupt or missing object skips
that checkpoint with the object's name; the store unavailable raises ``StoreUnavailable`` (the caller retries: a
run never silently starts from scratch while a stored checkpoint exists). Blocking: run it in a thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from libs.contracts.agents import AcceptedCheckpoint

from .. import ckpt_quota
from . import files
from . import manifest
from .base import ObjectMissing, Stopped, Store, StoreRefused, url_of

Skips = list[tuple[str, str]]  # (object or manifest address, why)


def restore(store: Store, job_id: str, directory: Path, accepted: AcceptedCheckpoint | None, *,
            quota: int | None = None, stopped: Callable[[], bool] | None = None,
            check: Callable[[Path], str | None] | None = None) -> tuple[manifest.Manifest | None, Path | None, Skips]:
    """The manifest and local path of the checkpoint to resume from (None: from scratch) and the checkpoints
    skipped, with the object at fault. ``check`` may refuse a restored checkpoint still (a file against its
    sidecar). The job's local directory is left holding that checkpoint only."""
    directory = Path(directory)
    skipped: Skips = []
    if accepted is None:
        _clear(directory, keep=set())
        return None, None, skipped
    found = manifest.stored(job_id, (o.key for o in store.list(manifest.job_prefix(job_id))))
    if accepted.epoch is None:
        line = sorted((f for f in found if f[0] == accepted.step), key=lambda f: f[1], reverse=True)
    else:
        line = manifest.of_run(found, accepted.step, accepted.epoch)
    seen: set[int] = set()
    while line:
        parent = None
        for step, epoch in line:
            key = manifest.manifest_key(job_id, step, epoch)
            try:
                made = manifest.load(store.get_bytes(key, manifest.MANIFEST_LIMIT), job_id=job_id, step=step, epoch=epoch)
            except (ObjectMissing, manifest.ManifestError) as exc:
                skipped.append((url_of(store.location, key), f"unreadable manifest: {exc}"))
                continue
            except StoreRefused as exc:
                skipped.append((url_of(store.location, key), exc.reason))
                continue
            parent = parent or made.parent
            if step == accepted.step and accepted.sha256 and made.sha256 and \
                    made.sha256.lower() != accepted.sha256.lower():
                skipped.append((url_of(store.location, key), f"not the checkpoint the queue accepted at step {step}"))
                continue
            if (why := ckpt_quota.over_quota(made.bytes, quota, claimed=True)) is not None:
                skipped.append((url_of(store.location, key), why))
                continue
            bad = _fetch(store, made, directory, stopped)
            if bad is None and check is not None and (why := check(directory / made.path)) is not None:
                bad = (url_of(store.location, key), why)
            if bad is None:
                _clear(directory, keep={e.path for e in made.objects})
                return made, directory / made.path, skipped
            skipped.append(bad)
        seen.update(e for _, e in line)
        line = [] if parent is None or parent[1] in seen else manifest.of_run(found, *parent)
    _clear(directory, keep=set())
    return None, None, skipped


def _fetch(store: Store, made: manifest.Manifest, directory: Path,
           stopped: Callable[[], bool] | None) -> tuple[str, str] | None:
    """Download and verify every object of ``made``, then rename them into place; None when done, else the
    object at fault and why (nothing of a failed checkpoint is left in place)."""
    ready: list[tuple[Path, Path]] = []  # (temporary, final)
    try:
        for entry in made.objects:
            if stopped is not None and stopped():
                raise ckpt_quota.VerificationStopped(directory / entry.path, 0)
            final = directory / entry.path
            if _already(final, entry):
                continue
            tmp = files.scratch(directory, entry.path)
            ready.append((tmp, final))
            try:
                sha, size = store.get_file(entry.key, tmp, stopped)
            except Stopped as exc:  # within the object, not only between objects: a large one takes minutes
                raise ckpt_quota.VerificationStopped(final, exc.got) from None
            except (ObjectMissing, StoreRefused) as exc:
                return url_of(store.location, entry.key), f"missing: {exc.reason}"
            if size != entry.bytes or sha != entry.sha256:
                return url_of(store.location, entry.key), (
                    f"corrupt: {size} bytes sha256 {sha[:12]}..., the manifest says {entry.bytes} bytes "
                    f"sha256 {entry.sha256[:12]}...")
        for tmp, final in sorted(ready, key=lambda r: files.sealed_last(r[1].relative_to(directory).as_posix())):
            os.replace(tmp, final)
        ready = []
        return None
    finally:
        for tmp, _ in ready:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _already(final: Path, entry: manifest.Entry) -> bool:
    """The file is here already with the manifest's size and checksum (a resume on the node that wrote it)."""
    try:
        if os.lstat(final).st_size != entry.bytes:
            return False
        sha, _ = files.hash_file(final)
    except (OSError, files.NotACheckpoint):
        return False
    return sha == entry.sha256


def _clear(directory: Path, keep: set[str]) -> None:
    """Leave the job's local directory holding ``keep`` only: it is a cache of the store, and anything else in
    it (a fenced-out run's files, a superseded upload's) is not a checkpoint the queue accepted."""
    if not directory.is_dir():
        return
    keep_dirs = {p for rel in keep for p in _parents(rel)}
    for dirpath, dirnames, filenames in os.walk(directory, topdown=False, followlinks=False):
        for name in filenames + dirnames:
            full = Path(dirpath) / name
            rel = full.relative_to(directory).as_posix()
            if rel in keep or rel in keep_dirs:
                continue
            with contextlib.suppress(OSError):
                if full.is_dir() and not full.is_symlink():
                    shutil.rmtree(full)
                else:
                    full.unlink()


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
