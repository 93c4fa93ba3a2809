"""Failed sign-ins and bad tokens at the edge: counted per source address and per actor (the rule is
domain/attempts.py), logged, and audited through the existing contracts: a refused ``CommandOutcome`` the gateway
decides, of kind ``authenticate`` (a request's bearer token or panel session) or ``sign_in`` (the panel's
sign-in form), which the audit service appends to its hash chain like every other refusal. The actor is the one
the failing credentials name (a revoked token's, a CSRF-refused session's), else none; the source address, the
failure, the path and the counts are in the detail. Only the failures up to a block are recorded one by one; the
one that starts a block says for how long; requests refused while blocked (429) are counted on the block.

Starting a provider sign-in needs no credentials but stores a pending row, so starts are bounded too
(domain/pending.py): per source address by the same limiter under its own scope, and for the installation by a
cap the database counts. Their refusals are audited the same way, kind ``sign_in``, failure ``sign_in_starts`` (a
source over its allowance: the start that blocks it) or ``sign_in_pending_full`` (the first refusal of a full
table since a start was admitted).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request

from .auth import Failure, source_of
from .domain.attempts import Attempts, Limit, Scope, Verdict
from .domain.pending import Full, start_limit
from .settings import GatewaySettings

log = logging.getLogger(__name__)

AUTHENTICATE = "authenticate"  # the audit kind of a request whose token or session did not hold
SIGN_IN = "sign_in"  # the audit kind of a failed panel sign-in
_KINDS = {Failure.SIGN_IN: SIGN_IN, Failure.SIGN_IN_CSRF: SIGN_IN, Failure.OIDC: SIGN_IN}


def attempts_for(settings: GatewaySettings) -> Attempts:
    window, block = settings.auth_failure_window_seconds, settings.auth_block_seconds
    return Attempts({Scope.SOURCE: Limit(settings.auth_failures_per_source, window, block),
                     Scope.ACTOR: Limit(settings.auth_failures_per_actor, window, block),
                     Scope.SIGN_IN_START: start_limit(settings.oidc_starts_per_source, window, block)})


async def count_start(request: Request) -> float | None:
    """Count a provider sign-in start against its source. Returns the block's seconds when this start is the one
    over the allowance (refuse it: 429), after logging and auditing it; None to go on."""
    attempts: Attempts | None = getattr(request.app.state, "attempts", None)
    if attempts is None:
        return None
    source = source_of(request)
    verdict = attempts.on_failure((Scope.SIGN_IN_START, source), request.app.state.monotonic())
    if verdict.blocked_for is None:
        return None
    reason = (f"too many sign-ins started from this source ({verdict.failures - 1} allowed within the window); "
              f"try again in {verdict.blocked_for:.0f} s")
    await _audit_start_refused(request, "sign_in_starts", reason, {
        "source": source, "starts_from_source": verdict.failures, "blocked_seconds": verdict.blocked_for})
    return verdict.blocked_for


async def pending_full(request: Request, full: Full | None) -> None:
    """Note a start's outcome against the installation's cap: the first Full since a start was admitted is logged
    and audited (later ones are only counted, so a flood leaves one row an episode)."""
    state = request.app.state
    if full is None:
        state.pending_full_refusals = 0
        return
    state.pending_full_refusals = getattr(state, "pending_full_refusals", 0) + 1
    if state.pending_full_refusals == 1:
        await _audit_start_refused(request, "sign_in_pending_full", full.reason, {
            "source": source_of(request), "pending": full.pending, "cap": full.cap,
            "retry_after_seconds": round(full.retry_after, 1)})


async def _audit_start_refused(request: Request, failure: str, reason: str, detail: dict[str, Any]) -> None:
    detail = {**detail, "failure": failure, "method": request.method, "path": request.url.path[:500]}
    log.warning("sign-in start refused (%s) from %s on %s: %s", failure, detail["source"], detail["path"], reason)
    commands = request.app.state.commands
    if commands is not None:
        await commands.refuse(SIGN_IN, None, reason, detail=detail)


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
