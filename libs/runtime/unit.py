"""One transaction applying facts, the way every service does it: the state change, the events it announces
(written to the outbox in the same transaction), the stale-epoch facts it ignored (counted against their
senders once committed), the command it answered (decided once per command id), and a kick to the outbox relay
after the commit so what was announced leaves at once instead of at the relay's next poll."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from libs.contracts.commands import Command, CommandOutcome
from libs.contracts.envelope import Envelope
from libs.contracts.subjects import Subjects

from . import commands, outbox, tracing
from .fencing import StaleCounter, StaleEpoch


@dataclass
class Unit:
    """The open transaction: ``conn`` for the service's store, and what to do once it commits."""

    conn: asyncpg.Connection
    schema: str
    subjects: Subjects
    emitted: list[tuple[str, Envelope]] = field(default_factory=list)
    ignored: list[StaleEpoch] = field(default_factory=list)

    def emit(self, *items: tuple[str, Envelope]) -> None:
        """Announce (subject, message) pairs through the outbox when this transaction commits."""
        self.emitted.extend(items)

    def stale(self, fact: StaleEpoch) -> StaleEpoch:
        """A fact from an older lease epoch: ignored, and counted against its sender after the commit."""
        self.ignored.append(fact)
        return fact

    async def once(self, cmd: Command, decide: Callable[[], Awaitable[CommandOutcome]], *,
                   job_id: str | None = None) -> commands.Answer:
        """Decide ``cmd`` once per command id in this transaction; a repeat is answered with the stored outcome."""
        return await commands.decide_once(self.conn, self.schema, self.subjects, cmd, decide, job_id=job_id)


class Units:
    """Opens Units for one service: its pool, schema, stale counter and relay kick."""

    def __init__(self, pool: asyncpg.Pool, schema: str, subjects: Subjects, counter: StaleCounter,
                 kick: Callable[[], None] | None = None) -> None:
        self.pool = pool
        self.schema = schema
        self.subjects = subjects
        self.counter = counter
        self.kick = kick

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[Unit]:
        with tracing.child(f"{self.schema} transaction", **{"db.system": "postgresql"}):
            async with self.pool.acquire() as conn:
                async with conn.transaction():
                    unit = Unit(conn, self.schema, self.subjects)
                    yield unit
                    if unit.emitted:
                        await outbox.add(conn, self.schema, unit.emitted)
            # Committed: count what was ignored, and let the relay publish now.
            for fact in unit.ignored:
                self.counter.note(fact)
            if self.kick is not None:
                self.kick()
