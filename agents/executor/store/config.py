"""The agent's checkpoint store from its settings: none (today's shared checkpoint directory), a directory
(``file:///path``) or an S3-compatible bucket (``s3://bucket/prefix`` at ``checkpoint_store_endpoint``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .base import Store


class StoreConfigError(ValueError):
    """A store URL or its settings that cannot work; the message says which and why."""


@dataclass(frozen=True)
class Where:
    """A parsed store URL: ``scheme`` s3 or file; for s3 the bucket and prefix, for file the directory."""

    scheme: str
    bucket: str = ""
    prefix: str = ""
    directory: Path | None = None


def parse_url(url: str) -> Where:
    """``s3://bucket[/prefix]`` or ``file:///absolute/dir``. Raises StoreConfigError. Pure."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        bucket, prefix = parts.netloc, parts.path.strip("/")
        if not bucket or not all(c.isalnum() or c in ".-" for c in bucket) or not 3 <= len(bucket) <= 63:
            raise StoreConfigError(f"checkpoint store {url!r}: the bucket name must be 3-63 letters, digits, '.' "
                                   "or '-'")
        if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
            raise StoreConfigError(f"checkpoint store {url!r}: the prefix has an empty, '.' or '..' part")
        if parts.query or parts.fragment:
            raise StoreConfigError(f"checkpoint store {url!r}: no query or fragment (the endpoint is "
                                   "TETO_CHECKPOINT_STORE_ENDPOINT)")
        return Where("s3", bucket=bucket, prefix=prefix)
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise StoreConfigError(f"checkpoint store {url!r}: a file store is file:///absolute/path")
        return Where("file", directory=Path(parts.path))
    raise StoreConfigError(f"checkpoint store {url!r}: s3://bucket/prefix or file:///path")


def open_store(settings: Any) -> Store | None:
    """The store the settings name, or None when ``checkpoint_store_url`` is empty."""
    url = settings.checkpoint_store_url
    if not url:
        return None
    where = parse_url(url)
    if where.scheme == "file":
        from .fs import FsStore

        return FsStore(where.directory)
    from .s3 import S3Config, S3Store

    return S3Store(S3Config(
        endpoint=settings.checkpoint_store_endpoint, bucket=where.bucket, prefix=where.prefix,
        region=settings.checkpoint_store_region, access_key_id=settings.checkpoint_store_access_key_id,
        secret_access_key=settings.checkpoint_store_secret_access_key, ca_file=settings.checkpoint_store_ca_file,
        part_bytes=settings.checkpoint_store_part_mb << 20, concurrency=settings.checkpoint_store_concurrency))
