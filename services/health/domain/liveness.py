"""Whether a node's agent is there now, and which nodes may speak for the group.

A node is a row the health service keeps; its agent is a process that may have died, frozen or been powered off
without a word (a restart of ``teto up``, a machine pulled from the rack). Three rules follow, each pure, each
taking the clock as an argument:

- ``alive``: the agent was heard from (a registration or a heartbeat) within ``alive_within`` (the signal
  timeout). Only a live node is a peer of a check run: a joining node's connectivity test and all-reduce wait on
  the peers it is given, and a dead peer fails every node that joins after it.
- ``silent``: nothing heard for ``gone_after`` (the node-gone time). Such a node is marked ``gone``: out of
  scheduling and out of every list of live nodes, until its agent registers again.
- ``median_sample``: a node's figures are a sample of the group's median only while it is ready, alive now,
  checked within ``max_age`` and under the same suite version as the figures judged. A dead node's old figures,
  or figures of an older suite measuring something else under the same name, must not set the bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from libs.contracts.nodes import NodeState


def last_heard(registered_at: datetime | None, last_heartbeat: datetime | None) -> datetime | None:
    """The latest sign of life: a registration or a heartbeat (``None``: never heard from)."""
    heard = [t for t in (registered_at, last_heartbeat) if t is not None]
    return max(heard) if heard else None


def alive(registered_at: datetime | None, last_heartbeat: datetime | None, now: datetime,
          within: timedelta) -> bool:
    heard = last_heard(registered_at, last_heartbeat)
    return heard is not None and now - heard <= within


def silent(registered_at: datetime | None, last_heartbeat: datetime | None, now: datetime,
           gone_after: timedelta) -> bool:
    """Nothing heard for ``gone_after``: the agent is gone (dead at start, stopped, frozen, powered off).

    A node never heard from at all is not judged here: it has no agent to wait for, and no row is made for it
    without a registration.
    """
    heard = last_heard(registered_at, last_heartbeat)
    return heard is not None and now - heard >= gone_after


@dataclass(frozen=True)
class SampleRule:
    """What makes a node's figures a sample of its group's median."""

    alive_within: timedelta
    max_age: timedelta
    suite_version: str | None  # the suite version of the figures being judged


def median_sample(state: NodeState, registered_at: datetime | None, last_heartbeat: datetime | None,
                  checked_at: datetime | None, suite_version: str | None, now: datetime, rule: SampleRule) -> bool:
    """Whether a peer's figures may be part of the median a node is judged against."""
    return (state is NodeState.READY
            and alive(registered_at, last_heartbeat, now, rule.alive_within)
            and checked_at is not None and now - checked_at <= rule.max_age
            and suite_version == rule.suite_version)
