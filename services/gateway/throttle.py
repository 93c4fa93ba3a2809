"""Failed sign-ins and bad tokens at the edge: counted per source address and per actor (the rule is
domain/attempts.py), logged, and audited through the existing contracts: a refused ``CommandOutcome`` the gateway
decides, of kind ``authenticate`` (a request's bearer token or panel session) or ``sign_in`` (the panel's
sign-in form), which the audit service appends to its hash chain like every other refusal. The actor is the one
the failing credentials name (a revoked token's, a CSRF-refused session's), else none; the source address, the
failure, the path and the counts are in the detail. Only the failures up to a block are recorded one by one; the
one that starts a block says for how long; requests refused while blocked (429) are counted on the block.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request

from .auth import Failure, source_of
from .domain.attempts import Attempts, Limit, Scope, Verdict
from .settings import GatewaySettings

log = logging.getLogger(__name__)

AUTHENTICATE = "authenticate"  # the audit kind of a request whose token or session did not hold
SIGN_IN = "sign_in"  # the audit kind of a failed panel sign-in
_KINDS = {Failure.SIGN_IN: SIGN_IN, Failure.SIGN_IN_CSRF: SIGN_IN, Failure.OIDC: SIGN_IN}


def attempts_for(settings: GatewaySettings) -> Attempts:
    window, block = settings.auth_failure_window_seconds, settings.auth_block_seconds
    return Attempts({Scope.SOURCE: Limit(settings.auth_failures_per_source, window, block),
                     Scope.ACTOR: Limit(settings.auth_failures_per_actor, window, block)})


async def record_failure(request: Request, failure: Failure, reason: str, actor: str | None) -> Verdict | None:
    """Count one failure against the request's source and ``actor``; log and audit it when the rule says so.
    Returns the source's verdict (None when the gateway has no limiter)."""
    attempts: Attempts | None = getattr(request.app.state, "attempts", None)
    if attempts is None:
        return None
    now = request.app.state.monotonic()
    source = source_of(request)
    by_source = attempts.on_failure((Scope.SOURCE, source), now)
    by_actor = attempts.on_failure((Scope.ACTOR, actor), now) if actor is not None else None
    verdicts = [v for v in (by_source, by_actor) if v is not None]
    if not any(v.record for v in verdicts):
        return by_source
    blocked = {scope.value: v.blocked_for for scope, v in ((Scope.SOURCE, by_source), (Scope.ACTOR, by_actor))
               if v is not None and v.blocked_for is not None}
    detail: dict[str, Any] = {"source": source, "failure": failure.value, "method": request.method,
                              "path": request.url.path[:500], "failures_from_source": by_source.failures}
    if by_actor is not None:
        detail["failures_of_actor"] = by_actor.failures
    if blocked:
        detail["blocked_seconds"] = blocked
    log.warning("authentication failure %s from %s%s on %s %s (%d from this source in the window)%s",
                failure.value, source, f" naming actor {actor!r}" if actor else "", request.method,
                request.url.path[:200], by_source.failures,
                f"; blocked {blocked}" if blocked else "")
    commands = request.app.state.commands
    if commands is not None:
        await commands.refuse(_KINDS.get(failure, AUTHENTICATE), actor, reason, detail=detail)
    return by_source
