"""Leases: the fencing contract between the queue and an executor.

A grant carries an ``epoch``; every later message about the job carries it back, and anything with an older
epoch is ignored. Renewals are a NATS request/reply (``teto.rpc.lease.renew``) so the executor knows its
contact was acknowledged by a queue replica, not merely stored by the server.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from .bounds import Epoch, Id, Reason, Time
from .envelope import Envelope


class LeaseEventKind(StrEnum):
    GRANTED = "granted"
    RENEWED = "renewed"
    EXPIRED = "expired"
    RELEASED = "released"


class LeaseEvent(Envelope):
    SCHEMA = "teto.lease.event/1"

    job_id: Id
    epoch: Epoch
    executor_id: Id
    event: LeaseEventKind
    expires_at: Time | None = None
    reason: Reason | None = None


class LeaseRenewRequest(Envelope):
    SCHEMA = "teto.rpc.lease.renew/1"

    job_id: Id
    epoch: Epoch
    executor_id: Id


class LeaseRenewReply(Envelope):
    SCHEMA = "teto.rpc.lease.renew.reply/1"

    ok: bool
    expires_at: Time | None = None
    reason: Reason | None = Field(None, description="Why the lease is not yours any more (stale epoch, job ended)")
