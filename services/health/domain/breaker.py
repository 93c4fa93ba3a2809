"""The replacement circuit breaker of a node group, as pure rules: ``decide(guard, fact, now, policy)``.

When every node of a group fails the same test (a bad driver rollout, a wrong threshold), rebooting and
replacing nodes cannot help, and each replacement may be a new cloud machine. So a group has a replacement
budget per time window, and a *systemic failure* verdict: a node that joined after a replacement in the window
and fails one of the tests the replaced node failed, or a replacement due once the budget is spent, raises an
alert. While it stands nothing in the group is rebooted or replaced, a node that fails stays ``failed``, and
every node of the group is held out of scheduling. An operator clears it (``clear_group_alert``): the window
starts afresh and the held nodes are checked again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum


@dataclass(frozen=True)
class Policy:
    budget: int = 3  # replacements allowed per window (0: never replace; every due replacement alerts)
    window: timedelta = timedelta(hours=1)


@dataclass(frozen=True)
class Replacement:
    node_id: str
    at: datetime
    tests: frozenset[str]  # the tests it failed


@dataclass(frozen=True)
class Alert:
    reason: str
    since: datetime
    tests: frozenset[str] = frozenset()
    nodes: tuple[str, ...] = ()  # the nodes whose failures made the verdict

    def as_dict(self) -> dict:
        return {"reason": self.reason, "since": self.since.isoformat(), "tests": sorted(self.tests),
                "nodes": list(self.nodes)}


@dataclass(frozen=True)
class Guard:
    group: str
    replacements: tuple[Replacement, ...] = ()
    alert: Alert | None = None
    cleared_at: datetime | None = None

    def recent(self, now: datetime, window: timedelta) -> tuple[Replacement, ...]:
        """Replacements inside the window and since the last clear (a clear forgives what came before)."""
        since = now - window
        if self.cleared_at is not None:
            since = max(since, self.cleared_at)
        return tuple(r for r in self.replacements if r.at > since)


# -- facts ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeFailed:
    """A node of the group failed its checks for good; ``replace``: it has no reboot left (it would be
    replaced); ``joined_at``: when it (last) registered, to tell a successor from an old node."""
    node_id: str
    tests: frozenset[str]
    replace: bool
    joined_at: datetime | None = None


@dataclass(frozen=True)
class Clear:
    actor: str


Fact = NodeFailed | Clear


# -- answers --------------------------------------------------------------------------------------------------

class Verdict(StrEnum):
    PROCEED = "proceed"  # the usual path: reboot, or replace (counted)
    TRIP = "trip"  # systemic failure found now: raise the alert, hold the group, keep this node failed
    HOLD = "hold"  # the alert already stands: keep this node failed, do nothing else


@dataclass(frozen=True)
class Decision:
    guard: Guard
    verdict: Verdict
    ignored: str | None = None


@dataclass(frozen=True)
class Refusal:
    reason: str


def decide(guard: Guard, fact: Fact, now: datetime, policy: Policy = Policy()) -> Decision | Refusal:
    if isinstance(fact, NodeFailed):
        return on_node_failed(guard, fact, now, policy)
    if isinstance(fact, Clear):
        return on_clear(guard, now)
    raise TypeError(f"not a breaker fact: {fact!r}")


def on_node_failed(guard: Guard, fact: NodeFailed, now: datetime, policy: Policy) -> Decision:
    """Replacing stops at the budget or when a replacement fails the same way as what it replaced.

    A successor is any node that joined the group after a replacement: the provisioner cannot say which new
    node replaces which, and on a bad rollout any of them failing the same test shows the same thing.
    """
    if guard.alert is not None:
        return Decision(guard, Verdict.HOLD, "the group's systemic-failure alert stands")
    recent = guard.recent(now, policy.window)
    for r in recent:
        same = r.tests & fact.tests
        if same and fact.node_id != r.node_id and fact.joined_at is not None and fact.joined_at >= r.at:
            why = (f"systemic failure: {fact.node_id} joined after {r.node_id} was replaced and failed "
                   f"{', '.join(sorted(same))} again")
            return _trip(guard, Alert(why, now, frozenset(same), (r.node_id, fact.node_id)))
    if not fact.replace:
        return Decision(guard, Verdict.PROCEED)
    if len(recent) >= policy.budget:
        why = (f"systemic failure: replacement budget spent ({len(recent)} of {policy.budget} in "
               f"{policy.window.total_seconds():g}s); {fact.node_id} failed {', '.join(sorted(fact.tests))}")
        return _trip(guard, Alert(why, now, fact.tests, (*(r.node_id for r in recent), fact.node_id)))
    kept = tuple(r for r in guard.replacements if r.at > now - policy.window)  # forget what left the window
    return Decision(replace(guard, replacements=(*kept, Replacement(fact.node_id, now, fact.tests))),
                    Verdict.PROCEED)


def _trip(guard: Guard, alert: Alert) -> Decision:
    return Decision(replace(guard, alert=alert), Verdict.TRIP)


def on_clear(guard: Guard, now: datetime) -> Decision | Refusal:
    """An operator has looked (and fixed the cause, or decided to try again): a fresh window, nodes released."""
    if guard.alert is None:
        return Refusal(f"group {guard.group} has no systemic-failure alert")
    return Decision(Guard(guard.group, (), None, now), Verdict.PROCEED)

