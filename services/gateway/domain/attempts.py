"""Failed authentication attempts, counted per source address and per actor: the limiter's rule, pure.

A failure is a request whose credentials did not hold: an unknown or revoked bearer token, a wrong token typed
into the panel's sign-in form, a panel session's request without its CSRF token. Each is counted against its
source address and, when the failure names one (a revoked token's, a session's), against its actor. A key with
``limit`` failures within ``window_seconds`` is blocked for ``block_seconds``: while blocked, the gateway answers
429 with the time left and does not look at the credentials at all (a guess is not even checked), so a source
guessing tokens gets ``limit`` guesses a window. A block ends on its own; the failures that caused it stay in the
audit log.

Only the failures up to the block are worth a log line and an audit row each (``Verdict.record``); the requests
refused while blocked are counted and named once, when the block starts, so 400 bad tokens in 30 s leave a trace
that is whole and bounded. The clock is an argument; memory is bounded (``max_keys``: the keys seen longest ago
are forgotten first; a blocked key is kept until its block ends unless every key is blocked).

The same counting bounds the provider sign-ins a source may start (``Scope.SIGN_IN_START``, domain/pending.py):
not failures, but each stores a pending row, so they are counted the same way under a scope of their own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum


class Scope(StrEnum):
    SOURCE = "source"  # the client's address
    ACTOR = "actor"  # the actor the failing credentials name (a revoked token's, a panel session's)
    SIGN_IN_START = "sign_in_start"  # the client's address starting a provider sign-in (counted: each stores a row)


Key = tuple[Scope, str]


@dataclass(frozen=True)
class Limit:
    failures: int  # failures allowed within the window; the next one blocks
    window_seconds: float
    block_seconds: float


@dataclass(frozen=True)
class Verdict:
    """What one failure means: ``record`` (log and audit it: one of the first ``limit`` failures, or the one that
    started a block), ``blocked_for`` (seconds, when it started a block), the failures counted in the window."""

    record: bool
    failures: int
    blocked_for: float | None = None


@dataclass
class _Track:
    times: list[float] = field(default_factory=list)  # failure times within the window, oldest first
    blocked_until: float | None = None
    refused_while_blocked: int = 0


class Attempts:
    """The failure counts of every key. Methods take ``now`` (seconds, monotonic) and do no I/O."""

    def __init__(self, limits: dict[Scope, Limit], *, max_keys: int = 100_000) -> None:
        self.limits = limits
        self.max_keys = max_keys
        self._tracks: OrderedDict[Key, _Track] = OrderedDict()

    def blocked_for(self, key: Key, now: float) -> float | None:
        """Seconds left of ``key``'s block (None: not blocked). A request refused now is counted on the block."""
        track = self._tracks.get(key)
        if track is None or track.blocked_until is None:
            return None
        if now >= track.blocked_until:
            track.blocked_until, track.times, track.refused_while_blocked = None, [], 0
            return None
        track.refused_while_blocked += 1
        return track.blocked_until - now

    def refused_while_blocked(self, key: Key) -> int:
        track = self._tracks.get(key)
        return track.refused_while_blocked if track is not None else 0

    def on_failure(self, key: Key, now: float) -> Verdict:
        """Count one failure of ``key``; block it when it reaches the limit of its scope."""
        limit = self.limits[key[0]]
        track = self._tracks.pop(key, None) or _Track()
        self._tracks[key] = track  # most recently seen last
        self._forget(now)
        if track.blocked_until is not None and now < track.blocked_until:
            return Verdict(record=False, failures=len(track.times))
        track.times = [t for t in track.times if now - t < limit.window_seconds]
        track.times.append(now)
        count = len(track.times)
        if count >= limit.failures:
            track.blocked_until = now + limit.block_seconds
            track.refused_while_blocked = 0
            return Verdict(record=True, failures=count, blocked_for=limit.block_seconds)
        return Verdict(record=True, failures=count)

    def _forget(self, now: float) -> None:
        while len(self._tracks) > self.max_keys:
            for key, track in self._tracks.items():
                if track.blocked_until is None or now >= track.blocked_until:
                    del self._tracks[key]
                    break
            else:  # every key blocked: forget the oldest anyway, memory is the harder limit
                self._tracks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._tracks)
