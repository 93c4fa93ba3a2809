"""Dead letters: a message a consumer gave up on, kept with why, where it came from and its headers, so an
operator can read it (``teto dead-letters``, ``GET /v1/dead-letters``) and replay it after a fix.

Published on ``teto.dead.<service>`` (stream DEAD) by the edge library when a message fails permanently or
exhausts its deliveries; the original message is then acknowledged, so it never holds back the ones behind it.
"""

from __future__ import annotations

import base64
from enum import StrEnum
from typing import Annotated

from pydantic import BeforeValidator, Field

from .bounds import Label, bounded_text, defuse
from .envelope import Envelope

# What a dead letter quotes from the message it gave up on (a reason, a subject, headers) is hostile input made
# storable: a NUL is shown as U+FFFD rather than refused, so burying a message can never fail on its content.
Quoted = Annotated[bounded_text(4000), BeforeValidator(defuse)]
QuotedHeaders = Annotated[dict[Annotated[str, BeforeValidator(defuse)], Quoted], BeforeValidator(defuse)]


MAX_DEAD_PAYLOAD = 256 * 1024


class DeadCause(StrEnum):
    MALFORMED = "malformed"  # failed its contract at decode
    PERMANENT = "permanent"  # valid on the wire, can never be applied (the database refused the data, say)
    EXHAUSTED = "exhausted"  # failed transiently on every delivery the consumer allows
    UNPUBLISHABLE = "unpublishable"  # an outbox row the bus refused (over the max payload, say): quarantined


class DeadLetter(Envelope):
    SCHEMA = "teto.dead/1"

    service: Label = Field(description="The service whose consumer gave up")
    consumer: Label = Field(description="The durable consumer (or outbox) that gave up")
    cause: DeadCause
    reason: Quoted = Field(description="What went wrong, for a person")
    subject: Quoted = Field(description="The original subject")
    headers: QuotedHeaders = Field(default_factory=dict, description="The original NATS headers")
    deliveries: int = Field(0, ge=0, description="How many times the message was delivered")
    stream_seq: int | None = Field(None, ge=0, description="The original message's stream sequence")
    payload_b64: str = Field("", max_length=4 * MAX_DEAD_PAYLOAD // 3 + 4, pattern=r"^[A-Za-z0-9+/=]*$",
                             description="The original payload (base64), for replay; cut to 256 KiB")
    payload_bytes: int = Field(0, ge=0, description="The original payload's size")
    truncated: bool = Field(False, description="True when payload_b64 holds only the first 256 KiB")

    @property
    def payload(self) -> bytes:
        return base64.b64decode(self.payload_b64)


def dead_letter(*, service: str, consumer: str, cause: DeadCause, reason: str, subject: str, payload: bytes,
                headers: dict[str, str] | None = None, deliveries: int = 0, stream_seq: int | None = None) -> DeadLetter:
    kept = payload[:MAX_DEAD_PAYLOAD]
    return DeadLetter(service=service, consumer=consumer[:200], cause=cause, reason=reason[:4000],
                      subject=subject[:1000], headers={str(k)[:200]: str(v)[:2000] for k, v in (headers or {}).items()},
                      deliveries=deliveries, stream_seq=stream_seq, payload_b64=base64.b64encode(kept).decode(),
                      payload_bytes=len(payload), truncated=len(kept) < len(payload))
