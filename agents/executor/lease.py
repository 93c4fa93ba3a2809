"""The executor's side of the lease: renew every heartbeat over request/reply, and give up in time.

Contact is measured with the monotonic clock at the moment a renewal was SENT (the queue extends the lease
when it receives it, which is later), so the executor's view of the deadline is never later than the queue's.
Without an acknowledged renewal for ``lease - stop_margin`` the keeper reports the lease lost; the agent then
kills the training process within the remaining margin, before the queue can redeliver the job. Each acknowledged
renewal also moves on the deadline the run guard holds (``on_extended``): an agent too frozen to give up in time
(SIGSTOP, a deadlock) has its run ended by the guard at the same deadline (guard.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client

from libs.contracts.envelope import ContractError
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.runtime import metrics

log = logging.getLogger(__name__)


@dataclass
class Contact:
    """When the queue last acknowledged this lease (monotonic seconds) and when the executor must give up."""

    lease_seconds: float
    stop_margin_seconds: float
    last_contact: float

    @property
    def deadline(self) -> float:
        return self.last_contact + self.lease_seconds - self.stop_margin_seconds

    def acknowledged(self, sent_at: float) -> None:
        # Replies can arrive out of order; contact never moves backwards.
        self.last_contact = max(self.last_contact, sent_at)

    def lost(self, now: float) -> bool:
        return now >= self.deadline

    def remaining(self, now: float) -> float:
        return self.deadline - now


@dataclass(frozen=True)
class LeaseLost:
    """Why the keeper gave up: ``refused`` means the queue answered (contact is fine, the lease is gone)."""

    reason: str
    refused: bool


class LeaseKeeper:
    def __init__(self, nc: Client, subject: str, *, job_id: str, epoch: int, executor_id: str,
                 lease_seconds: float, heartbeat_seconds: float, stop_margin_seconds: float) -> None:
        self.nc = nc
        self.subject = subject
        self.request = dict(job_id=job_id, epoch=epoch, executor_id=executor_id)
        self.heartbeat_seconds = heartbeat_seconds
        self.contact = Contact(lease_seconds, stop_margin_seconds, last_contact=time.monotonic())
        self.renewals = 0
        # Called with the new deadline after each acknowledged renewal (the run guard's fence); never raises.
        self.on_extended: Callable[[float], Awaitable[object]] | None = None

    async def renew(self, timeout: float) -> LeaseRenewReply | None:
        """One renewal; None when nobody answered in time (or the answer was unreadable)."""
        sent_at = time.monotonic()
        try:
            msg = await self.nc.request(self.subject, LeaseRenewRequest(**self.request).encode(), timeout=timeout)
            reply = LeaseRenewReply.decode(msg.data)
        except ContractError as exc:
            log.error("unreadable lease renewal reply for %s: %s", self.request["job_id"], exc.reason)
            metrics.EXECUTOR_RENEWALS.labels("no_answer").inc()
            return None
        except Exception as exc:  # noqa: BLE001 - timeouts, no responders, connection loss: all "no contact"
            log.debug("lease renewal for %s got no answer: %r", self.request["job_id"], exc)
            metrics.EXECUTOR_RENEWALS.labels("no_answer").inc()
            return None
        metrics.EXECUTOR_RENEWALS.labels("ok" if reply.ok else "refused").inc()
        if reply.ok:
            self.contact.acknowledged(sent_at)
            self.renewals += 1
            if self.on_extended is not None:
                try:
                    await self.on_extended(self.contact.deadline)
                except Exception:  # noqa: BLE001 - the guard's fence only ever ends the run earlier, never later
                    log.exception("could not move the run guard's deadline on for %s", self.request["job_id"])
        return reply

    async def acquire(self, attempts: int = 3) -> LeaseRenewReply | None:
        """The first renewal, before launching: a refused or unanswered grant is not started."""
        for _ in range(attempts):
            reply = await self.renew(timeout=self.heartbeat_seconds)
            if reply is not None:
                return reply
        return None

    async def watch(self) -> LeaseLost:
        """Renew every heartbeat until the lease is refused or contact is lost; returns why. After ``acquire``
        the first renewal is a heartbeat after the acquiring one, not at once: a renewal a moment after another
        tells the queue nothing (two bus messages and a queue transaction per job, issue 12 item 1)."""
        if self.renewals:
            now = time.monotonic()
            await asyncio.sleep(max(0.0, min(self.contact.last_contact + self.heartbeat_seconds - now,
                                             self.contact.remaining(now))))
        while True:
            sent_at = time.monotonic()
            budget = self.contact.remaining(sent_at)
            if budget <= 0:
                return LeaseLost("no renewal acknowledged within lease - stop margin", refused=False)
            reply = await self.renew(timeout=max(0.05, min(self.heartbeat_seconds, budget)))
            if reply is not None and not reply.ok:
                return LeaseLost(f"lease refused: {reply.reason or 'no reason given'}", refused=True)
            now = time.monotonic()
            if self.contact.lost(now):
                return LeaseLost("no renewal acknowledged within lease - stop margin", refused=False)
            # Sleep until the next renewal is due, but wake at the deadline to give up on time.
            await asyncio.sleep(max(0.0, min(sent_at + self.heartbeat_seconds - now, self.contact.remaining(now))))
