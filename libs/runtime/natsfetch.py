"""nats-py's pull ``fetch`` raising the timeout it documents, so FastStream's pull loops survive it.

``JetStreamContext.PullSubscription.fetch`` documents ``nats.errors.TimeoutError`` but, in nats-py 2.16, a
multi-message fetch whose deadline runs out between its two pull requests raises a bare ``asyncio.TimeoutError``
(``_fetch_n``: ``raise asyncio.TimeoutError`` where the remaining deadline is <= 0). FastStream 0.7.8's pull loops
(``BatchPullStreamSubscriber._consume_pull`` and the per-message one) catch only ``nats.errors.TimeoutError``: the
consuming task dies on the bare one, FastStream starts it again, and the messages the dead loop had already
fetched for its batch wait out their AckWait before anyone sees them (measured here: 23 to 165 of 500 messages
late by a whole AckWait, with a 5-10 ms fetch timeout).

``install()`` wraps the fetch once, process-wide, so that every timeout it raises is the documented one: a plain
``asyncio.TimeoutError`` becomes ``nats.errors.TimeoutError`` (a subclass of it, so callers that catch the plain
one, the edge among them, see no change). Nothing else about the fetch changes.

Upstream: FastStream issue 2219 ("NATS PullSub batch=True does not work reliably"); nats.py issues 418 and 709
(fetch timeouts). To drop the patch when either side is fixed: delete this module and its ``install()`` call;
``tests/integration/test_faststream_pull.py`` then shows whether FastStream's batch loop holds on its own
(``test_the_defect_is_upstream`` fails once upstream no longer has it).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import nats.errors
from nats.js.client import JetStreamContext

_MARK = "_teto_documented_timeout"


def documented(fetch: Any) -> Any:
    """``fetch`` (an unbound ``PullSubscription.fetch``) with every timeout raised as ``nats.errors.TimeoutError``."""

    @functools.wraps(fetch)
    async def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fetch(self, *args, **kwargs)
        except nats.errors.TimeoutError:
            raise
        except asyncio.TimeoutError as exc:
            raise nats.errors.TimeoutError from exc

    setattr(wrapped, _MARK, True)
    return wrapped


def installed() -> bool:
    return bool(getattr(JetStreamContext.PullSubscription.fetch, _MARK, False))


def install() -> bool:
    """Patch ``PullSubscription.fetch`` (idempotent); True if this call patched it."""
    if installed():
        return False
    JetStreamContext.PullSubscription.fetch = documented(JetStreamContext.PullSubscription.fetch)
    return True


def uninstall() -> None:
    """Undo ``install()`` (tests that show the upstream defect)."""
    fetch = JetStreamContext.PullSubscription.fetch
    if getattr(fetch, _MARK, False):
        JetStreamContext.PullSubscription.fetch = fetch.__wrapped__
