"""The checkpoint store's interface: a flat namespace of immutable objects, and the errors every store raises.

A store is blocking (the agent calls it from worker threads): each call either succeeds or raises
``StoreUnavailable`` (the store cannot be reached or answered with a server error: retried with back-off) or
``StoreRefused`` (missing object, refused credentials, a bad request: retrying the same call cannot help).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class StoreError(Exception):
    """A store call failed; ``key`` names the object (or prefix) it was about."""

    retryable = False

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class StoreUnavailable(StoreError):
    """The store cannot be reached, or failed on its side: the same call may succeed later."""

    retryable = True


class StoreRefused(StoreError):
    """The store answered, and no retry of the same call can succeed (credentials, permissions, bad request)."""


class ObjectMissing(StoreRefused):
    """No object under that key."""


class Stopped(Exception):
    """A download given up midway because the run it was for was stopped (cancel, lost lease, agent shutdown);
    ``got``: the bytes received by then."""

    def __init__(self, key: str, got: int) -> None:
        super().__init__(f"{key}: download stopped after {got} bytes")
        self.key = key
        self.got = got


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    bytes: int


class Store(Protocol):
    """What the agent needs of a checkpoint store (all blocking; keys are '/'-separated, no leading '/')."""

    location: str  # where it is, for people: s3://bucket/prefix or file:///dir (never a credential)

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file (multipart when large) under ``key``."""

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_file(self, key: str, path: Path, stopped: Callable[[], bool] | None = None) -> tuple[str, int]:
        """Download ``key`` into ``path`` (created or truncated; the caller renames it into place); the SHA-256 and
        size of what was written, hashed as it was written (no second pass over a large checkpoint). ``Stopped``
        within a part (a MiB or so) once ``stopped()`` is true, however large the object."""

    def get_bytes(self, key: str, limit: int) -> bytes:
        """The object's bytes; ``StoreRefused`` when it is larger than ``limit``."""

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``."""

    def delete(self, keys: list[str]) -> None:
        """Delete these objects (a missing one is no error)."""

    def close(self) -> None: ...


class HashingWriter:
    """A file object that hashes what is written to it, in order (it cannot seek, so a parallel download hands
    it its parts in order)."""

    def __init__(self, f) -> None:
        import hashlib

        self.f = f
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.f.write(data)

    def result(self) -> tuple[str, int]:
        return self.digest.hexdigest(), self.size


def url_of(location: str, key: str) -> str:
    """The object's address for people and job events: ``s3://bucket/prefix/key``."""
    return f"{location.rstrip('/')}/{key}"
