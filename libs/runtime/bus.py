"""NATS and JetStream at the edges: connect with retries, declare the streams, publish with a message id.

JetStream de-duplicates on the ``Nats-Msg-Id`` header within the stream's duplicate window, which is what
makes the outbox relay's "publish, then mark published" safe to repeat after a crash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError
from opentelemetry import propagate

from libs.contracts.envelope import Envelope
from libs.contracts.subjects import Subjects

log = logging.getLogger(__name__)

DUPLICATE_WINDOW_SECONDS = 120.0


async def connect(url: str, name: str, *, connect_timeout: float = 5.0, attempts: int = 30) -> Client:
    """Connect, retrying the first connection (services may start before the server is ready)."""
    last: Exception | None = None
    for _ in range(attempts):
        try:
            return await nats.connect(
                servers=[u.strip() for u in url.split(",")],
                name=name,
                connect_timeout=connect_timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                # A close must not hang on a pull subscription left open (the default drain waits 30 s).
                drain_timeout=5,
            )
        except Exception as exc:  # noqa: BLE001 - any failure to connect is retried, then reported
            last = exc
            await asyncio.sleep(0.5)
    raise ConnectionError(f"cannot connect to NATS at {url}: {last}")


async def ensure_streams(js: JetStreamContext, subjects: Subjects, *, replicas: int = 1) -> None:
    """Create or update every Teto stream (idempotent; run by every service at start)."""
    for spec in subjects.streams():
        config = StreamConfig(
            name=spec.name,
            subjects=list(spec.subjects),
            description=spec.description,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=spec.max_age_seconds,
            max_msgs=spec.max_msgs if spec.max_msgs is not None else -1,
            duplicate_window=DUPLICATE_WINDOW_SECONDS,
            num_replicas=replicas,
            deny_delete=spec.deny_delete,
            deny_purge=spec.deny_purge,
        )
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)


def trace_headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    headers: dict[str, str] = {}
    propagate.inject(headers)
    if extra:
        headers.update(extra)
    return headers


async def publish(js: JetStreamContext, subject: str, msg: Envelope | bytes, *, msg_id: str | None = None,
                  timeout: float = 15.0) -> None:
    """Publish to a stream and wait for the server's ack; the message id de-duplicates retries."""
    data = msg.encode() if isinstance(msg, Envelope) else msg
    if msg_id is None and isinstance(msg, Envelope):
        msg_id = msg.id
    headers = trace_headers({"Nats-Msg-Id": msg_id} if msg_id else None)
    await js.publish(subject, data, headers=headers, timeout=timeout)
