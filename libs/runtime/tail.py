"""Reading a stream without a durable: ephemeral, read-only consumers for views that watch the bus.

The edge (edge.py) is how a service *applies* messages: durable, shared by replicas, acknowledged. A view
(the panel's live feed) only *looks*: it must not take messages from anyone, must not
survive its reader, and must not be shared. So here:
- ``follow``: an ordered push consumer from now on (``DeliverPolicy.NEW``), no acks, recreated by the client
  on a gap; the callback gets each message's subject and decoded JSON body (malformed bodies are skipped: the
  owners' consumers refuse them visibly, a viewer has nothing to add).
It needs only what natsauth.py allows the gateway on the streams it watches: creating an *ephemeral* consumer
(never a named one: no durable of another part can be touched), its info, and flow-control replies; nothing
here acknowledges, pulls from a durable, or deletes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

log = logging.getLogger(__name__)

OnMessage = Callable[[str, dict[str, Any]], Awaitable[None]]


def body_of(data: bytes) -> dict[str, Any] | None:
    """A message body as a JSON object, or None (not JSON, not an object)."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def follow(js: JetStreamContext, stream: str, subject: str, on_message: OnMessage) -> Any:
    """Watch ``subject`` on ``stream`` from now on; returns the subscription (``await sub.unsubscribe()``)."""

    async def deliver(msg: Any) -> None:
        body = body_of(msg.data)
        if body is None:
            return
        try:
            await on_message(msg.subject, body)
        except Exception:  # a viewer's failure must not stop the feed for the others
            log.exception("live view of %s failed on %s", stream, msg.subject)

    return await js.subscribe(subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW,
                              cb=deliver, manual_ack=True, idle_heartbeat=5.0)
