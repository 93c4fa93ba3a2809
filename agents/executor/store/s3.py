"""A checkpoint store on any S3-compatible endpoint (AWS S3, MinIO, Ceph RGW, SeaweedFS), through boto3.

Path-style addressing (on-premises endpoints seldom have wildcard DNS), TLS verified against the system's CAs or
a CA file, credentials given explicitly (never the process's ambient AWS configuration: the agent must not pick
up whatever a node's environment holds). Large files go up in parts, several at once (s3transfer). Why boto3
rather than obstore or aiobotocore: docs/checkpoint-store.md ("The client library").
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .base import ObjectInfo, ObjectMissing, Stopped, StoreError, StoreRefused, StoreUnavailable

MISSING = {"404", "NoSuchKey", "NotFound"}


@dataclass(frozen=True)
class S3Config:
    """Where and how to reach one bucket (``prefix`` with no leading or trailing '/')."""

    endpoint: str
    bucket: str
    prefix: str = ""
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = ""
    ca_file: Path | None = None
    part_bytes: int = 16 << 20
    concurrency: int = 4
    connect_timeout: float = 5.0
    read_timeout: float = 60.0


def classify(exc: BaseException, key: str) -> StoreError:
    """A boto3 failure as the store's error: a missing object, a refusal, or the store unavailable (a connection
    failure, a timeout, or a 5xx or throttling answer). Pure."""
    from botocore.exceptions import BotoCoreError, ClientError, SSLError

    cause = exc if isinstance(exc, ClientError) else exc.__context__ if isinstance(exc.__context__, ClientError) \
        else None
    if cause is not None:
        error = cause.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        why = f"{code or status}: {error.get('Message') or cause}"
        if code in MISSING or status == 404:
            return ObjectMissing(key, why)
        if status >= 500 or status in (408, 429) or code in ("SlowDown", "RequestTimeout", "Throttling"):
            return StoreUnavailable(key, why)
        return StoreRefused(key, why)
    if isinstance(exc, SSLError):  # a certificate not trusted (no CA file, the wrong one): no retry mends it
        return StoreRefused(key, f"TLS: {exc}")
    if isinstance(exc, BotoCoreError | OSError):
        return StoreUnavailable(key, f"{type(exc).__name__}: {exc}")
    return StoreUnavailable(key, f"{type(exc).__name__}: {exc}")


class S3Store:
    def __init__(self, config: S3Config) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.config = config
        self.location = f"s3://{config.bucket}/{config.prefix}".rstrip("/")
        session = boto3.session.Session()
        self.client = session.client(
            "s3", endpoint_url=config.endpoint or None, region_name=config.region,
            aws_access_key_id=config.access_key_id or None, aws_secret_access_key=config.secret_access_key or None,
            verify=str(config.ca_file) if config.ca_file else None,
            config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                          connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                          retries={"mode": "standard", "max_attempts": 2},
                          max_pool_connections=max(10, config.concurrency * 2),
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))
        self.transfer = TransferConfig(multipart_threshold=config.part_bytes, multipart_chunksize=config.part_bytes,
                                       max_concurrency=config.concurrency, use_threads=True)

    def _key(self, key: str) -> str:
        return f"{self.config.prefix}/{key}" if self.config.prefix else key

    def _call(self, key: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (StoreError, Stopped):
            raise
        except Exception as exc:  # noqa: BLE001 - every failure of the client becomes one of the store's errors
            raise classify(exc, key) from exc

    def put_file(self, key: str, path: Path) -> None:
        self._call(key, self.client.upload_file, str(path), self.config.bucket, self._key(key), Config=self.transfer)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(key, self.client.put_object, Bucket=self.config.bucket, Key=self._key(key), Body=data)

    def get_file(self, key: str, path: Path, stopped: Callable[[], bool] | None = None) -> tuple[str, int]:
        """Ranged GETs of ``part_bytes``, ``concurrency`` at once and one after another as s3transfer's download
        does (a slow part never holds the others back), each written at its offset as its bytes arrive; the
        digest follows in order, reading back (from the page cache) what has been written of the first part not
        hashed yet, so hashing overlaps the transfer and nothing waits in memory. ``Stopped`` within a MiB of
        ``stopped()`` turning true. (Not s3transfer's download to a non-seekable stream, which hashes in order
        too but deadlocked here on a 1 GB object: its first part's callback waits for a window slot only the
        waiting caller frees.)"""
        size = int(self._call(key, self.client.head_object, Bucket=self.config.bucket,
                              Key=self._key(key))["ContentLength"])
        part = self.config.part_bytes
        spans = [(start, min(size, start + part) - 1) for start in range(0, size, part)]
        progress = _Progress(len(spans))
        halt = threading.Event()  # a failed part, the caller's stop: the other parts end within a chunk

        def halted() -> bool:
            return halt.is_set() or (stopped is not None and stopped())

        digest, hashed = hashlib.sha256(), 0
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="s3-get") as pool:
                parts = [pool.submit(self._call, key, self._part, key, span, fd, size > part, halted,
                                     functools.partial(progress.wrote, i)) for i, span in enumerate(spans)]
                for future in parts:
                    future.add_done_callback(lambda _: progress.wake())
                try:
                    for i, (start, end) in enumerate(spans):
                        done = 0
                        while done < end - start + 1:
                            ready = progress.wait(i, done, parts[i])
                            if ready == done:  # the part ended: failed, stopped or short
                                error = parts[i].exception()
                                if isinstance(error, Stopped):
                                    raise Stopped(key, hashed + done)
                                if error is not None:
                                    raise error
                                raise StoreUnavailable(key, f"{ready} bytes received of part {start}-{end}")
                            while done < ready:  # hashlib lets go of the GIL on each MiB
                                data = os.pread(fd, min(1 << 20, ready - done), start + done)
                                if not data:
                                    raise StoreUnavailable(key, f"part {start}-{end} not on disk after writing")
                                digest.update(data)
                                done += len(data)
                        hashed += done
                except BaseException:
                    halt.set()
                    for future in parts:
                        future.cancel()
                    raise
        finally:
            os.close(fd)
        return digest.hexdigest(), hashed

    def _part(self, key: str, span: tuple[int, int], fd: int, ranged: bool, halted: Callable[[], bool],
              wrote: Callable[[int], None]) -> None:
        args = {"Bucket": self.config.bucket, "Key": self._key(key)}
        if ranged:
            args["Range"] = f"bytes={span[0]}-{span[1]}"
        if halted():
            raise Stopped(key, 0)
        body = self.client.get_object(**args)["Body"]
        at = span[0]
        try:
            while chunk := body.read(1 << 20):
                if halted():
                    raise Stopped(key, at - span[0])
                if at + len(chunk) > span[1] + 1:
                    raise StoreUnavailable(key, f"more than the {span[1] + 1 - span[0]} bytes asked for")
                os.pwrite(fd, chunk, at)
                at += len(chunk)
                wrote(len(chunk))
        finally:
            body.close()

    def get_bytes(self, key: str, limit: int) -> bytes:
        answer = self._call(key, self.client.get_object, Bucket=self.config.bucket, Key=self._key(key))
        body = answer["Body"]
        try:
            data = self._call(key, body.read, limit + 1)
        finally:
            body.close()
        if len(data) > limit:
            raise StoreRefused(key, f"larger than {limit} bytes")
        return data

    def list(self, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        strip = len(self._key(""))
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.config.bucket,
                                                                       Prefix=self._key(prefix))

        def walk() -> None:
            for page in pages:
                for obj in page.get("Contents", []):
                    found.append(ObjectInfo(obj["Key"][strip:], int(obj["Size"])))

        self._call(prefix, walk)
        return found

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = keys[i:i + 1000]
            answer = self._call(batch[0], self.client.delete_objects, Bucket=self.config.bucket,
                                Delete={"Objects": [{"Key": self._key(k)} for k in batch], "Quiet": True})
            errors = [e for e in answer.get("Errors", []) if e.get("Code") not in MISSING]
            if errors:
                raise StoreUnavailable(errors[0].get("Key", batch[0]), str(errors[0].get("Message")))

    def close(self) -> None:
        self.client.close()


class _Progress:
    """Bytes written so far of each part (from its start, in order), for the digest to follow."""

    def __init__(self, parts: int) -> None:
        self.written = [0] * parts
        self.changed = threading.Condition()

    def wrote(self, i: int, n: int) -> None:
        with self.changed:
            self.written[i] += n
            self.changed.notify_all()

    def wake(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def wait(self, i: int, beyond: int, future) -> int:
        """Bytes written of part ``i`` once more than ``beyond`` are, or once its GET has ended."""
        with self.changed:
            while self.written[i] <= beyond and not future.done():
                self.changed.wait()
            return self.written[i]
