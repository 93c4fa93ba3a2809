"""What JetStream says about a delivered message in its ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>.
<stream seq>.<consumer seq>.<time>.<pending>``, or the longer form with a domain and account hash), read as
nats-py's ``Msg.metadata`` reads it but without building the rest of ``metadata`` (a datetime and two objects a
message): the edge checks every message's delivery count, and the audit names a message without a command id by
its stream sequence. Pure.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def _tokens(m: Any) -> list[str] | None:
    tokens = (getattr(m, "reply", None) or "").split(".")
    if tokens[0] != "$JS" or len(tokens) < 2 or tokens[1] != "ACK" or not (len(tokens) == 9 or len(tokens) >= 11):
        return None
    return tokens


def _field(m: Any, short: int, long: int) -> int | None:
    tokens = _tokens(m)
    if tokens is None:
        return None
    try:
        return int(tokens[short] if len(tokens) == 9 else tokens[long])
    except ValueError:
        return None


def deliveries(m: Any) -> int:
    """JetStream's delivery count of ``m``; 1 if it is not a JetStream delivery."""
    return _field(m, 4, 6) or 1


def stream_seq(m: Any) -> int | None:
    """The stream sequence of ``m``, or None if it is not a JetStream delivery."""
    return _field(m, 5, 7)


def stored_at(m: Any) -> datetime | None:
    """When the stream stored ``m`` (the server's clock, from the nanoseconds in the ack subject), or None if it
    is not a JetStream delivery."""
    ns = _field(m, 7, 9)
    return None if ns is None else datetime.fromtimestamp(ns / 1e9, UTC)
