"""When the queue last heard from an executor: placement leases work only to executors heard from recently.

An executor was seen when the bus stored its heartbeat, not when the queue got round to reading it. After an
outage of the database (or of the queue itself) a backlog of heartbeats is read at once, among them the last
ones of executors that died meanwhile; stamped with the time they were read, those dead executors looked alive
for another ``silent_after`` and were leased jobs that could never start. Pure: the clocks come in.
"""

from __future__ import annotations

from datetime import datetime


def seen_at(now: datetime, stored_at: datetime | None) -> datetime:
    """The heartbeat's stream time, never later than ``now`` (a server clock ahead of the database's must not
    make an executor look alive into the future); ``now`` when the stream time is unknown."""
    return now if stored_at is None else min(now, stored_at)
