"""Directory checkpoints (issue 27): a directory is one checkpoint once its manifest is in it.

A Hugging Face ``checkpoint-120/`` or a Lightning checkpoint directory holds many files (weights or adapter,
optimizer, scheduler, RNG and trainer state). It is complete once ``teto-manifest.json`` exists inside it: every
regular file's relative path, size and SHA-256, the step and the lease epoch of the run that sealed it, written
last (temp file, fsync, rename: ``ckpt_io.write_atomic``). Its checksum, the SHA-256 of the manifest's bytes, is
what a report carries and what the queue accepts, as a file's is for a file checkpoint.

Verification (the agent, before a resume) never follows a link below the directory (each name is opened relative
to its parent's descriptor with O_NOFOLLOW, so a link swapped in meanwhile is not followed either); it refuses a
link, device, FIFO or socket inside, a file missing, altered or not in the manifest, each reason naming the file;
and it is bounded like a file's: a manifest claiming more than the job's quota is refused unread, hashing stops
past the quota or as soon as the run is stopped. Pure rules (``parse``, ``compare``, ``build``, ``step_of``)
apart from the I/O (``listing``, ``seal``, ``verify``). Imports nothing heavy.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from . import ckpt_quota
from .ckpt_io import run_epoch, write_atomic

MANIFEST = "teto-manifest.json"
FORMAT = "teto-manifest/1"
MANIFEST_LIMIT = 32 << 20  # bytes of manifest read at most (100,000 files of long names fit)
MAX_FILES = 100_000  # files one directory checkpoint may hold
_TEMP = re.compile(rf"^\.{re.escape(MANIFEST)}\..*\.tmp$")  # a manifest write that never completed
# Checkpoint names a step can be read from: the SDK's file, a Hugging Face directory, Lightning's ``...step=N``.
_NAMES = (re.compile(r"^step-(\d{8,})\.pt$"), re.compile(r"^(?:checkpoint|step)-(\d{1,15})$"),
          re.compile(r"^(?:.*[-_])?step=(\d{1,15})(?:\.ckpt)?$"))
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Invalid(ValueError):
    """A directory that cannot be a checkpoint: ``file`` (relative to it; "." for the directory) and why."""

    def __init__(self, file: str, why: str) -> None:
        super().__init__(f"{file}: {why}" if file != "." else why)
        self.file = file
        self.why = why


@dataclass(frozen=True)
class Entry:
    path: str  # relative, '/'-separated
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    files: tuple[Entry, ...]
    epoch: int | None = None
    created_at: str = ""

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.files)


@dataclass(frozen=True)
class Sealed:
    """A complete directory checkpoint: its manifest and the manifest's own SHA-256 (the checkpoint's checksum)."""

    path: Path
    manifest: Manifest
    sha256: str

    @property
    def step(self) -> int:
        return self.manifest.step

    @property
    def bytes(self) -> int:
        return self.manifest.bytes


# -- pure rules -----------------------------------------------------------------------------------------------


def step_of(name: str) -> int | None:
    """The step a checkpoint's name says (``step-00000120.pt``, ``checkpoint-120``, ``epoch=0-step=120.ckpt``);
    None for any other name (a sidecar, a temp file, ``last.ckpt``). Pure."""
    if name.startswith("."):
        return None
    for pattern in _NAMES:
        m = pattern.match(name)
        if m:
            return int(m.group(1))
    return None


def unsafe(rel: str) -> str | None:
    """Why a manifest's path cannot name a file inside the directory (None: it can). Pure."""
    if not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
        return "not a relative path inside the checkpoint"
    parts = PurePosixPath(rel).parts
    if any(p in ("", ".", "..") for p in parts) or "/".join(parts) != rel:
        return "a path that leaves the checkpoint directory or is not normal"
    if rel == MANIFEST:
        return "the manifest cannot list itself"
    return None


def build(step: int, files: Sequence[Entry], *, epoch: int | None, created_at: str) -> bytes:
    """The manifest's bytes (files sorted by path, so a directory sealed twice lists them alike). Pure."""
    body: dict[str, Any] = {"format": FORMAT, "step": int(step), "created_at": created_at,
                            "bytes": sum(e.bytes for e in files),
                            "files": [{"path": e.path, "bytes": e.bytes, "sha256": e.sha256}
                                      for e in sorted(files, key=lambda e: e.path)]}
    if epoch is not None:
        body["epoch"] = int(epoch)
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def parse(data: bytes) -> Manifest:
    """A manifest from its bytes; ValueError saying what is wrong with it. Pure."""
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"unreadable manifest: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"unreadable manifest: not a {FORMAT} document")
    step, epoch, files = body.get("step"), body.get("epoch"), body.get("files")
    if not _count(step) or not (epoch is None or _count(epoch)) or not isinstance(files, list):
        raise ValueError("unreadable manifest: step, epoch or files missing or malformed")
    if len(files) > MAX_FILES:
        raise ValueError(f"unreadable manifest: {len(files)} files, more than {MAX_FILES}")
    entries, seen = [], set()
    for item in files:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not _count(item.get("bytes")) \
                or not isinstance(item.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", item["sha256"]):
            raise ValueError("unreadable manifest: a file entry without path, bytes and sha256")
        rel = item["path"]
        if (why := unsafe(rel)) is not None:
            raise ValueError(f"{rel[:200]!r} in the manifest: {why}")
        if rel in seen:
            raise ValueError(f"{rel[:200]!r} is listed twice in the manifest")
        seen.add(rel)
        entries.append(Entry(rel, item["bytes"], item["sha256"]))
    return Manifest(step=step, files=tuple(entries), epoch=epoch, created_at=str(body.get("created_at", "")))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53


def compare(manifest: Manifest, found: Sequence[tuple[str, int]]) -> Invalid | None:
    """What is wrong with the files found (relative path, size) against the manifest, naming the first file
    (None: the same files, the same sizes; their content is hashed next). Pure."""
    sizes = dict(found)
    for entry in manifest.files:
        if entry.path not in sizes:
            return Invalid(entry.path, "missing (the manifest lists it)")
        if sizes[entry.path] != entry.bytes:
            return Invalid(entry.path, f"truncated or altered: {sizes[entry.path]} bytes, the manifest says "
                                       f"{entry.bytes}")
    listed = {e.path for e in manifest.files}
    for rel, _ in sorted(found):
        if rel not in listed:
            return Invalid(rel, "not in the manifest (written after the checkpoint was sealed)")
    return None


# -- I/O ------------------------------------------------------------------------------------------------------


def manifest_path(directory: Path) -> Path:
    return Path(directory) / MANIFEST


def is_directory(path: Path) -> bool:
    """A real directory (a link to one is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def holds_checkpoint(path: Path) -> bool:
    """A directory checkpoint: a real directory (a link to one is not) not named like the SDK's files
    (``step-00000120.pt`` is always a file checkpoint; a directory in its place is an unreadable file)."""
    return is_directory(path) and not _NAMES[0].match(Path(path).name)


def listing(directory: Path) -> list[tuple[str, int]]:
    """Every regular file below ``directory`` (relative path, size) but the manifest; ``Invalid`` for a link or a
    special file (naming it), or more than ``MAX_FILES``. Never follows a link, the directory itself included."""
    try:
        top = os.open(directory, _DIR)
    except OSError as exc:
        raise Invalid(".", f"unreadable: {exc.strerror or exc}") from None
    try:
        found: list[tuple[str, int]] = []
        _walk(top, "", found)
        return found
    finally:
        os.close(top)


def _walk(fd: int, prefix: str, found: list[tuple[str, int]]) -> None:
    with os.scandir(fd) as entries:
        for entry in entries:
            rel = prefix + entry.name
            if not prefix and (entry.name == MANIFEST or _TEMP.match(entry.name)):
                continue
            if entry.is_symlink():
                raise Invalid(rel, "a link: a checkpoint holds regular files only")
            if entry.is_dir(follow_symlinks=False):
                sub = os.open(entry.name, _DIR, dir_fd=fd)
                try:
                    _walk(sub, rel + "/", found)
                finally:
                    os.close(sub)
            elif entry.is_file(follow_symlinks=False):
                found.append((rel, entry.stat(follow_symlinks=False).st_size))
                if len(found) > MAX_FILES:
                    raise Invalid(".", f"more than {MAX_FILES} files")
            else:
                raise Invalid(rel, "not a regular file (a device, FIFO or socket)")


def _open_below(top: int, rel: str) -> int:
    """A file below the directory of descriptor ``top``, every component opened without following a link."""
    parts = rel.split("/")
    opened: list[int] = []
    fd = top
    try:
        for part in parts[:-1]:
            fd = os.open(part, _DIR, dir_fd=fd)
            opened.append(fd)
        return os.open(parts[-1], _FILE, dir_fd=fd)
    finally:
        for o in opened:
            os.close(o)


def _hash_all(directory: Path, files: Sequence[tuple[str, int]], *, limit: int | None,
              stopped: Callable[[], bool] | None) -> list[Entry]:
    """Each file's SHA-256, in order; at most ``limit`` bytes in all (ValueError past it)."""
    top = os.open(directory, _DIR)
    entries: list[Entry] = []
    counted = 0
    try:
        for rel, _ in files:
            try:
                fd = _open_below(top, rel)
            except OSError as exc:
                raise Invalid(rel, f"unreadable: {exc.strerror or exc}") from None
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise Invalid(rel, "not a regular file")
                sha, size = ckpt_quota.sha256_stream(f, Path(directory) / rel, limit=limit, stopped=stopped,
                                                     counted=counted)
            counted += size
            entries.append(Entry(rel, size, sha))
    finally:
        os.close(top)
    return entries


def seal(directory: Path, step: int, *, quota: int | None = None, epoch: int | None = None,
         now: datetime | None = None) -> Sealed:
    """Hash every file of a complete checkpoint directory and write its manifest, last and atomically: from then
    on it is a checkpoint. ``Invalid`` for a link or special file inside; ``ckpt_quota.CheckpointRefused`` when
    its files come to more than ``quota`` (no manifest is written then)."""
    directory = Path(directory)
    files = sorted(listing(directory))
    total = sum(size for _, size in files)
    if quota is not None and total > quota:
        raise ckpt_quota.CheckpointRefused(int(step), total, quota)
    try:
        entries = _hash_all(directory, files, limit=quota, stopped=None)
    except ValueError as exc:
        if isinstance(exc, Invalid):
            raise
        raise ckpt_quota.CheckpointRefused(int(step), total, quota or 0) from None  # it grew while being hashed
    data = build(step, entries, epoch=epoch if epoch is not None else run_epoch(),
                 created_at=(now or datetime.now(UTC)).isoformat())
    write_atomic(manifest_path(directory), lambda f: f.write(data))
    return Sealed(directory, parse(data), hashlib.sha256(data).hexdigest())


def read_manifest(directory: Path) -> bytes:
    """The manifest's bytes, read without following a link (the directory's or its own) and at most
    ``MANIFEST_LIMIT``; OSError when absent or unreadable, ValueError when too large."""
    top = os.open(directory, _DIR)
    try:
        fd = os.open(MANIFEST, _FILE, dir_fd=top)
    finally:
        os.close(top)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("the manifest is not a regular file")
        data = f.read(MANIFEST_LIMIT + 1)
    if len(data) > MANIFEST_LIMIT:
        raise ValueError(f"the manifest is larger than {MANIFEST_LIMIT} bytes")
    return data


def verify(directory: Path, *, quota: int | None = None,
           stopped: Callable[[], bool] | None = None) -> tuple[Sealed | None, str | None]:
    """(the checkpoint, None) when every file matches the manifest, else (None, the reason, naming the file).
    Bounded like a file's verification: a manifest claiming more than ``quota`` is refused with nothing hashed;
    ``ckpt_quota.VerificationStopped`` as soon as ``stopped()`` is true."""
    directory = Path(directory)
    if not is_directory(directory):
        return None, "a link, not a checkpoint directory" if os.path.islink(directory) else "not a directory"
    try:
        data = read_manifest(directory)
    except FileNotFoundError:
        return None, f"no manifest ({MANIFEST}): the checkpoint was never completed"
    except (OSError, ValueError) as exc:
        return None, f"{MANIFEST}: unreadable: {exc}"
    try:
        manifest = parse(data)
    except ValueError as exc:
        return None, f"{MANIFEST}: {exc}"
    if (refused := ckpt_quota.over_quota(manifest.bytes, quota, claimed=True)) is not None:
        return None, refused
    try:
        found = listing(directory)
        if (wrong := compare(manifest, found)) is not None:
            return None, str(wrong)
        hashed = _hash_all(directory, [(e.path, e.bytes) for e in manifest.files], limit=quota, stopped=stopped)
    except Invalid as exc:
        return None, str(exc)
    except ValueError as exc:  # it grew past the quota while being read
        return None, str(exc)
    except OSError as exc:
        return None, f"unreadable: {exc}"
    for want, got in zip(manifest.files, hashed, strict=True):
        if got.bytes != want.bytes:
            return None, f"{want.path}: truncated or altered: {got.bytes} bytes, the manifest says {want.bytes}"
        if got.sha256 != want.sha256:
            return None, (f"{want.path}: checksum mismatch: sha256 {got.sha256[:12]}..., the manifest says "
                          f"{want.sha256[:12]}...")
    return Sealed(directory, manifest, hashlib.sha256(data).hexdigest()), None


def measured_size(directory: Path) -> int | None:
    """The bytes of a directory's files as they lie (no link followed, nothing read); None when it cannot be
    listed (a link or special file inside: its verification says why)."""
    try:
        return sum(size for _, size in listing(directory))
    except (Invalid, OSError):
        return None


def remove(directory: Path) -> None:
    """Delete a directory checkpoint: its manifest first (half deleted reads as incomplete, never as valid), then
    the rest; a link in its place is removed, never followed, even one swapped in meanwhile (the manifest is
    unlinked through the directory's own descriptor, and ``shutil.rmtree`` never follows one). OSError when it
    cannot be deleted."""
    directory = Path(directory)
    try:
        fd = os.open(directory, _DIR)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        directory.unlink(missing_ok=True)  # a link or a file in its place
        return
    try:
        os.unlink(MANIFEST, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)
    shutil.rmtree(directory)
