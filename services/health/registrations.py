"""Node registrations that name another executor than the node's own: found here, refused by the handler
(the rule: domain/registration.py; the bindings: store/nodes.py)."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.contracts.nodes import NodeRegistered

from .domain.registration import foreign_executor
from .store import nodes


async def split_foreign(conn: asyncpg.Connection, regs: list[NodeRegistered], now: datetime,
                        gone_after_seconds: float) -> tuple[list[NodeRegistered], list[tuple[NodeRegistered, str]]]:
    """The registrations to apply (in the order sent), and those refused with the reason; each is judged
    against the binding the ones before it left."""
    bound = await nodes.bindings(conn, sorted({r.node_id for r in regs}))
    kept: list[NodeRegistered] = []
    refused: list[tuple[NodeRegistered, str]] = []
    for reg in sorted(regs, key=lambda r: r.time):
        executor, last_heard = bound.get(reg.node_id, (None, None))
        reason = foreign_executor(reg.executor_id, executor, last_heard, now, gone_after_seconds)
        if reason is None:
            kept.append(reg)
            bound[reg.node_id] = (reg.executor_id, now)  # a later one in the batch is judged against this one
        else:
            refused.append((reg, reason))
    return kept, refused
