"""The local side of a checkpoint: which files make it, hashing them, and putting downloaded ones into place.

A checkpoint is a path under the job's checkpoint directory: one file (with its sidecar, ``checkpoints.py``) or a
directory tree of regular files (sealed by its own manifest file). The agent runs as root and the directory
belongs to the run's uid: nothing here follows a link (a run could plant one towards a file it may not read), and
anything but a regular file or a directory is refused.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from ..checkpoints import sidecar_path

CHUNK = 1 << 20
# Written last into place on a restore, so a half-restored checkpoint reads as incomplete (file: its sidecar;
# directory: its own manifest).
SEALS = ("teto-manifest.json",)


class NotACheckpoint(ValueError):
    """The reported path cannot be uploaded as a checkpoint (outside the directory, a link, a special file)."""


def relative(directory: Path, path: Path) -> str:
    """The checkpoint's path relative to the job's checkpoint directory (no '..', no link on the way)."""
    directory, path = Path(os.path.abspath(directory)), Path(os.path.abspath(path))
    try:
        rel = path.relative_to(directory)
    except ValueError:
        raise NotACheckpoint(f"{path} is not inside the job's checkpoint directory {directory}") from None
    if not rel.parts:
        raise NotACheckpoint(f"{path} is the checkpoint directory itself")
    walked = directory
    for part in rel.parts[:-1]:
        walked = walked / part
        if walked.is_symlink():
            raise NotACheckpoint(f"{walked} is a link")
    return rel.as_posix()


def members(directory: Path, rel: str) -> list[str]:
    """The files (relative to ``directory``) that make the checkpoint at ``rel``: a file and its sidecar when it
    has one, or every regular file of a directory tree; seals last. Raises NotACheckpoint (a link anywhere, a
    special file, an empty directory) or OSError."""
    root = Path(directory) / rel
    mode = os.lstat(root).st_mode
    if stat.S_ISLNK(mode):
        raise NotACheckpoint(f"{rel} is a link")
    if stat.S_ISREG(mode):
        side = sidecar_path(root)
        found = [rel]
        if os.path.lexists(side):
            if not stat.S_ISREG(os.lstat(side).st_mode):
                raise NotACheckpoint(f"{side.name} is not a regular file")
            found.append(Path(rel).with_suffix(".json").as_posix())
        return found
    if not stat.S_ISDIR(mode):
        raise NotACheckpoint(f"{rel} is neither a file nor a directory")
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            m = os.lstat(full).st_mode
            if stat.S_ISLNK(m):
                raise NotACheckpoint(f"{full.relative_to(directory)} is a link")
            if not (stat.S_ISDIR(m) or stat.S_ISREG(m)):
                raise NotACheckpoint(f"{full.relative_to(directory)} is not a regular file")
            if stat.S_ISREG(m):
                found.append(full.relative_to(directory).as_posix())
    if not found:
        raise NotACheckpoint(f"{rel} is an empty directory")
    return sorted(found, key=sealed_last)


def sealed_last(rel: str) -> tuple[bool, str]:
    """Sort key: the files that seal a checkpoint (a sidecar, a directory's manifest) after its data. Pure."""
    name = rel.rsplit("/", 1)[-1]
    return (name in SEALS or ("/" not in rel and name.endswith(".json")), rel)


def open_regular(path: Path) -> int:
    """A file descriptor on a regular file, never through a link (O_NOFOLLOW; a FIFO is not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotACheckpoint(f"{path} is not a regular file")
    return fd


def sha256_fd(fd: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(fd, CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def hash_file(path: Path) -> tuple[str, int]:
    """(sha256, bytes) of a regular file, not following a link."""
    fd = open_regular(path)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def scratch(directory: Path, rel: str) -> Path:
    """A fresh temporary file beside where ``rel`` goes (made by the agent, so nothing planted is written through)."""
    dest = Path(directory) / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".restore", dir=dest.parent)
    os.close(fd)
    return Path(tmp)
