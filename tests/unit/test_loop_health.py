"""The outbox relay reports its rounds to the runtime's loop health like ``periodic`` loops do
(libs/runtime/loophealth.py): one failing round after round is a status problem, one good round clears it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from libs.runtime.loophealth import CURRENT, LoopHealth
from libs.runtime.outbox import OutboxRelay

pytestmark = pytest.mark.unit


class _Relay(OutboxRelay):
    def __init__(self, fail: int, done: asyncio.Event) -> None:
        super().__init__(None, "queue", None)  # type: ignore[arg-type]
        self.fail, self.rounds, self.done = fail, 0, done
        self.fetched = 0

    async def relay_once(self) -> int:
        self.rounds += 1
        if self.rounds <= self.fail:
            raise asyncpg.UndefinedTableError('relation "queue.outbox" does not exist')
        self.done.set()
        return 0


async def test_a_relay_failing_round_after_round_is_failing_until_a_round_works(monkeypatch):
    health = LoopHealth(failing_after=2)
    seen: list[list[str]] = []
    real_sleep = asyncio.sleep

    async def note_and_go_on(_: float) -> None:  # the relay's back-off, without its second
        # asyncio.sleep is patched for every task of the (shared) loop: only the relay's sleeps are its back-off.
        if asyncio.current_task() is task:
            seen.append([f.name for f in health.failing()])
        await real_sleep(0)

    monkeypatch.setattr("libs.runtime.outbox.asyncio.sleep", note_and_go_on)
    done = asyncio.Event()
    CURRENT.set(health)
    relay = _Relay(fail=3, done=done)
    task = asyncio.create_task(relay.run())
    await done.wait()
    assert seen == [[], ["outbox relay queue"], ["outbox relay queue"]]
    assert health.failing() == []  # cleared by the round that worked
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
