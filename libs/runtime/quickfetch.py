"""A pull subscription whose fetch takes already-arrived messages without a task and a timer each.

nats-py's ``PullSubscription.fetch`` gets every message of a batch through ``Subscription.next_msg``, which
creates a task running ``asyncio.wait_for(queue.get(), timeout)`` (and a uuid to name it) per message, even when
the message is already in the subscription's queue: at the edge's batch sizes that was most of a consumer's
CPU per message (the edge ran at about a third of what the broker delivers). ``quicken`` gives one subscription
a ``next_msg`` that hands over a message already queued at once, with the same bookkeeping as nats-py's (pending
size, ``task_done``), and falls back to nats-py's own ``next_msg`` (its timeout, its errors) when the queue is
empty. The fetch logic itself (pull requests, status messages, heartbeats, the lingering second request) stays
nats-py's.

It relies on three private attributes of nats-py's ``Subscription`` (``_pending_queue``, ``_pending_size``,
``_conn``); nats-py is pinned to an exact version in pyproject.toml, and where any of them is missing the
subscription is left as it is (``quicken`` returns False) rather than guessed at.
"""

from __future__ import annotations

import asyncio
from typing import Any

_NEEDED = ("_pending_queue", "_pending_size", "_conn", "next_msg")


def quicken(psub: Any) -> bool:
    """Give ``psub`` (a JetStream pull subscription) the quick ``next_msg``; True if it was given."""
    sub = getattr(psub, "_sub", None)
    if sub is None or not all(hasattr(sub, name) for name in _NEEDED):
        return False
    queue = sub._pending_queue
    if not isinstance(queue, asyncio.Queue):
        return False
    slow = sub.next_msg

    async def next_msg(timeout: float | None = 1.0) -> Any:
        if queue.empty() or sub._conn.is_closed:
            return await slow(timeout)  # waits, times out and raises exactly as nats-py does
        msg = queue.get_nowait()
        sub._pending_size -= len(msg.data)
        queue.task_done()
        return msg

    sub.next_msg = next_msg
    return True
