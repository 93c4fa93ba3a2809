"""The audit service's handlers on FastStream's in-memory ``TestNatsBroker`` (no server): its own declarations
(services/audit/handlers.py), the edge's rules, and a database-less chain in the broker's context where the app
puts the real one. A command becomes an entry named by its command id and stamped by the injected clock; nothing
is refused, even garbage; an entry the chain can never store is dead-lettered, not retried forever."""

from __future__ import annotations

from datetime import datetime

import pytest

from libs.contracts.commands import CommandOutcome, SubmitJob
from libs.contracts.subjects import Subjects
from libs.runtime.errors import PermanentError
from services.audit.domain.entries import Entry, Outcome
from services.audit.handlers import consumers
from services.audit.settings import AuditSettings
from tests.support.inmemory import T0, FakeClock, in_memory

pytestmark = pytest.mark.unit

S = Subjects()


class MemoryChain:
    """The hash chain without PostgreSQL: what was appended, each batch with the time it was written."""

    def __init__(self, fail: str | None = None) -> None:
        self.batches: list[tuple[list[Entry], datetime]] = []
        self.fail = fail  # a command id whose entry can never be stored

    async def append(self, found: list[Entry], now: datetime) -> int:
        if any(e.command_id == self.fail for e in found):
            raise PermanentError("entry cannot be stored")
        self.batches.append((found, now))
        return len(found)

    @property
    def entries(self) -> list[Entry]:
        return [e for batch, _ in self.batches for e in batch]


def audit(clock: FakeClock, chain: MemoryChain):
    return in_memory("audit", S, consumers(S, AuditSettings.from_env(env={}), clock), chain=chain, clock=clock)


async def test_a_command_becomes_an_entry_named_by_its_id_and_written_at_the_injected_time():
    clock, chain = FakeClock(), MemoryChain()
    cmd = SubmitJob(actor="ann", spec={"workload": {"kind": "finetune"}})
    async with audit(clock, chain) as (bus, reporter):
        clock.advance(30)
        await bus.publish(cmd.encode(), S.cmd("submit"))
    ((entry,), written), = chain.batches
    assert (entry.command_id, entry.actor, entry.kind, entry.job_id) == (cmd.command_id, "ann", "submit", cmd.job_id)
    assert entry.outcome is Outcome.RECEIVED and entry.time == cmd.issued_at
    assert written == T0.replace(second=30) and not reporter.rejected


async def test_an_outcome_and_garbage_on_a_command_subject_are_both_recorded_never_refused():
    clock, chain = FakeClock(), MemoryChain()
    outcome = CommandOutcome(command_id="c-1", kind="cancel", accepted=False, reason="no such job", by="queue")
    async with audit(clock, chain) as (bus, reporter):
        await bus.publish(outcome.encode(), S.outcome("cancel", "c-1"))
        await bus.publish(b"\x00not json", S.cmd("submit"))
    accepted, garbage = chain.entries
    assert (accepted.command_id, accepted.outcome, accepted.reason) == ("c-1", Outcome.REFUSED, "no such job")
    # No command id and no time of its own: named by its stream (no ack subject here) and stamped by the clock.
    assert garbage.command_id.startswith("CMD-") and garbage.time == T0 and garbage.kind == "submit"
    assert reporter.rejected == [] and reporter.counters.malformed == 0


async def test_an_entry_that_can_never_be_stored_is_dead_lettered_and_the_next_one_goes_on():
    clock = FakeClock()
    bad, good = (SubmitJob(actor="ann", spec={"workload": {"kind": "finetune"}}) for _ in range(2))
    chain = MemoryChain(fail=bad.command_id)
    async with audit(clock, chain) as (bus, reporter):
        await bus.publish(bad.encode(), S.cmd("submit"))
        await bus.publish(good.encode(), S.cmd("submit"))
    assert [e.command_id for e in chain.entries] == [good.command_id]
    (letter,) = reporter.dead
    assert letter.consumer == "audit-commands" and letter.payload == bad.encode()
    assert "cannot be stored" in letter.reason
