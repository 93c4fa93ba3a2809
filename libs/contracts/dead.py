"""Dead letters: a message a consumer gave up on, kept with why, where it came from and its headers, so an
operator can read it (``teto dead-letters``, ``GET /v1/dead-letters``) and replay it after a fix.

Published on ``teto.dead.<service>`` (stream DEAD) by the edge library when a message fails permanently or
exhausts its deliveries; the original message is then acknowledged, so it never holds back the ones behind it.
"""

from __future__ import annotations

import base64
from enum import StrEnum

from pydantic import Field

from .envelope import Envelope


class DeadCause(StrEnum):
    MALFORMED = "malformed"  # failed its contract at decode
    PERMANENT = "permanent"  # valid on the wire, can never be applied (the database refused the data, say)
    EXHAUSTED = "exhausted"  # failed transiently on every delivery the consumer allows
    UNPUBLISHABLE = "unpublishable"  # an outbox row the bus refused (over the max payload, say): quarantined


class DeadLetter(Envelope):
    SCHEMA = "teto.dead/1"

    service: str = Field(max_length=64, description="The service whose consumer gave up")
    consumer: str = Field(max_length=200, description="The durable consumer (or outbox) that gave up")
    cause: DeadCause
    reason: str = Field(max_length=4000, description="What went wrong, for a person")
    subject: str = Field(max_length=1000, description="The original subject")
    headers: dict[str, str] = Field(default_factory=dict, description="The original NATS headers")
    deliveries: int = Field(0, ge=0, description="How many times the message was delivered")
    stream_seq: int | None = Field(None, ge=0, description="The original message's stream sequence")
    payload_b64: str = Field("", description="The original payload (base64), for replay; cut to 256 KiB")
    payload_bytes: int = Field(0, ge=0, description="The original payload's size")
    truncated: bool = Field(False, description="True when payload_b64 holds only the first 256 KiB")

    @property
    def payload(self) -> bytes:
        return base64.b64decode(self.payload_b64)


MAX_DEAD_PAYLOAD = 256 * 1024


def dead_letter(*, service: str, consumer: str, cause: DeadCause, reason: str, subject: str, payload: bytes,
                headers: dict[str, str] | None = None, deliveries: int = 0, stream_seq: int | None = None) -> DeadLetter:
    kept = payload[:MAX_DEAD_PAYLOAD]
    return DeadLetter(service=service, consumer=consumer[:200], cause=cause, reason=reason[:4000],
                      subject=subject[:1000], headers={str(k)[:200]: str(v)[:2000] for k, v in (headers or {}).items()},
                      deliveries=deliveries, stream_seq=stream_seq, payload_b64=base64.b64encode(kept).decode(),
                      payload_bytes=len(payload), truncated=len(kept) < len(payload))
