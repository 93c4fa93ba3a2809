"""A checkpoint store on a directory (``file:///path``): each object a file under it, written atomically.

For a site whose executors share a mount but want the store's semantics (uploads in the background, manifests,
verification at resume), and the store the unit tests run the uploader against. Without any store configured
the agent keeps today's behaviour: runs write straight into the shared checkpoint directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .base import HashingWriter, ObjectInfo, ObjectMissing, Stopped, StoreRefused, StoreUnavailable


class FsStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.location = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise StoreRefused(key, "not a valid object key")
        return self.root.joinpath(*parts)

    def _write(self, key: str, fill) -> None:
        dest = self._path(key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        except OSError as exc:
            raise StoreUnavailable(key, str(exc)) from exc
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except OSError as exc:
            with _quiet():
                os.unlink(tmp)
            raise StoreUnavailable(key, str(exc)) from exc

    def put_file(self, key: str, path: Path) -> None:
        def fill(f) -> None:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)
        self._write(key, fill)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(key, lambda f: f.write(data))

    def get_file(self, key: str, path: Path, stopped: Callable[[], bool] | None = None) -> tuple[str, int]:
        try:
            with open(self._path(key), "rb") as src, open(path, "wb") as dst:
                out = HashingWriter(dst)
                while chunk := src.read(1 << 20):
                    if stopped is not None and stopped():
                        raise Stopped(key, out.size)
                    out.write(chunk)
                return out.result()
        except FileNotFoundError as exc:
            raise ObjectMissing(key, "no such object") from exc
        except OSError as exc:
            raise StoreUnavailable(key, str(exc)) from exc

    def get_bytes(self, key: str, limit: int) -> bytes:
        try:
            with open(self._path(key), "rb") as src:
                data = src.read(limit + 1)
        except FileNotFoundError as exc:
            raise ObjectMissing(key, "no such object") from exc
        except OSError as exc:
            raise StoreUnavailable(key, str(exc)) from exc
        if len(data) > limit:
            raise StoreRefused(key, f"larger than {limit} bytes")
        return data

    def list(self, prefix: str) -> list[ObjectInfo]:
        found = []
        if not self.root.is_dir():
            return found
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                if name.startswith(".") and name.endswith(".part"):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    with _quiet():
                        found.append(ObjectInfo(key, full.stat().st_size))
        return sorted(found, key=lambda o: o.key)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink(missing_ok=True)
            except OSError as exc:
                raise StoreUnavailable(key, str(exc)) from exc

    def close(self) -> None:
        pass


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        return kind is not None and issubclass(kind, OSError)
