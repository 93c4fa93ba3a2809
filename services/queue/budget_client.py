"""The queue's one client of the budget service's ``teto.rpc.budget.status``: what a job has consumed in all.

The budget service is the single writer of consumption, and its reply's ``known`` says whether it has ever seen
the job (a row of ``budget.jobs``, services/budget/store.py ``status``). A job it never saw was never charged:
not known means **consumed 0.0**, an answer, not a guess. **No answer** (a timeout, no responder, a broken
connection), a reply that cannot be read, or one about another job is **unknown: None**. Each caller decides
what unknown means for it, never by guessing a number: a grant carries an unknown remainder (``remaining``), a
requeue is refused as "budget service unavailable" (``commands``: its check "new ceiling >= consumed + 60 s"
needs the number).
"""

from __future__ import annotations

import logging

from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
from libs.runtime.service import Runtime

log = logging.getLogger(__name__)


def consumed_of(reply: BudgetStatusReply, job_id: str) -> float | None:
    """The GPU-seconds ``job_id`` consumed, as ``reply`` says: 0.0 when the budget never saw it, None when the
    reply is not about it."""
    if reply.job_id != job_id:
        return None
    return reply.consumed_seconds if reply.known else 0.0


async def consumed(runtime: Runtime, job_id: str, timeout: float) -> float | None:
    """Ask the budget service what ``job_id`` consumed, waiting at most ``timeout`` seconds; None: unknown."""
    try:
        msg = await runtime.nc.request(runtime.subjects.rpc_budget_status,
                                       BudgetStatusRequest(job_id=job_id).encode(), timeout=timeout)
        reply = BudgetStatusReply.decode(msg.data)
    except Exception as exc:  # noqa: BLE001 - no responders, timeout, a bad reply: unknown, never a guess
        log.info("budget status for %s unavailable: %r", job_id, exc)
        return None
    found = consumed_of(reply, job_id)
    if found is None:
        log.info("budget status for %s answered about %r: unknown", job_id, reply.job_id)
    return found
