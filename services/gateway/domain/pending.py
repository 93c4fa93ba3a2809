"""Pending provider sign-ins an unauthenticated client can make the gateway store: the bounds, pure.

Starting a sign-in (``GET /signin/oidc/<provider>``) needs no credentials and stores a row in
``gateway.oidc_logins`` (state, nonce, PKCE verifier) for 10 minutes. Two bounds keep that table small whatever
clients do:

- per source address, ``starts`` sign-ins within a window: the limiter of domain/attempts.py under its own scope
  (``Scope.SIGN_IN_START``) counts every start, and the start after the allowed ones is refused and blocks the
  source's starts for the block time (``start_limit`` turns the allowance into that limiter's ``Limit``, which
  blocks at its count). Each replica counts its own starts: a source spread over n replicas gets n times the
  allowance, still bounded;
- for the whole installation, at most ``cap`` pending sign-ins not yet expired, counted in the database (so every
  replica sees the same number, under a lock, so replicas cannot overshoot it together). A start beyond it is
  refused until the oldest pending sign-in expires and frees a place: that is its ``retry_after``.

Either refusal is a 429 with Retry-After; the start that begins a block, and the first refusal of a full table
after an admitted start, are audited (throttle.py), the refusals that follow only counted, as for failed
sign-ins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from .attempts import Limit


@dataclass(frozen=True)
class Full:
    """The installation holds ``cap`` pending sign-ins already (``pending`` counted); a place frees in
    ``retry_after`` seconds, when the oldest expires."""

    pending: int
    cap: int
    retry_after: float

    @property
    def reason(self) -> str:
        return (f"too many sign-ins in progress ({self.pending} of at most {self.cap}); try again in "
                f"{math.ceil(self.retry_after)} s")


def start_limit(starts: int, window_seconds: float, block_seconds: float) -> Limit:
    """``starts`` allowed within the window: the limiter blocks at its count, so the refused start is the next."""
    return Limit(starts + 1, window_seconds, block_seconds)


def admit(pending: int, *, cap: int, oldest_expires_at: datetime | None, now: datetime) -> Full | None:
    """None when one more pending sign-in fits (``pending`` unexpired ones are stored); else Full, with the wait
    until the oldest of them expires (at least 1 s: the expiry is swept by the next start)."""
    if pending < cap:
        return None
    wait = (oldest_expires_at - now).total_seconds() if oldest_expires_at is not None else 1.0
    return Full(pending=pending, cap=cap, retry_after=max(1.0, wait))
