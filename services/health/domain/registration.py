"""Whom a node registration may name: only its sender (issue 26, item 4).

The bus lets only a node's own executor publish ``teto.node.<node>.registered`` (docs/security/bus.md), but the
body names an ``executor_id`` the bus does not check. The health service knows the node's sender as the executor
the node is bound to (the one that registered it, whose heartbeats arrive under its own bound subject). A
registration naming another executor while that one is alive is refused: believed, it would re-bind the node to a
made-up id, and the node would be marked gone while its real agent kept heartbeating. Once the bound executor has
been silent for the node-gone time, the node may be taken by a new executor (an agent reinstalled with a new id).
"""

from __future__ import annotations

from datetime import datetime


def foreign_executor(named: str, bound: str | None, bound_last_heard: datetime | None, now: datetime,
                     gone_after_seconds: float) -> str | None:
    """Why a registration naming ``named`` for a node bound to ``bound`` (last heard from at
    ``bound_last_heard``: its latest heartbeat or registration) is refused; None when it may be believed."""
    if bound is None or named == bound:
        return None
    if bound_last_heard is None or (now - bound_last_heard).total_seconds() >= gone_after_seconds:
        return None  # the node's executor is gone: a new one may take the node
    return (f"registration names executor {named!r} but the node is bound to executor {bound!r}, alive (heard from "
            f"{(now - bound_last_heard).total_seconds():.0f}s ago): a registration may only name its sender")
