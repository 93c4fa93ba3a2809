"""The gateway's outcome subscription (services/gateway/commands.py ``on_outcome``) on FastStream's in-memory
``TestNatsBroker`` (no server): the requests waiting for outcomes (``Outcomes``) come from the broker's context,
the waiting request gets its outcome, and one nobody here waits for is counted and dropped."""

from __future__ import annotations

import pytest
from faststream.nats import TestNatsBroker

from libs.contracts.commands import CommandOutcome
from libs.contracts.subjects import Subjects
from libs.runtime.edge_stream import EdgeBroker, provide
from services.gateway.commands import Outcomes, on_outcome, outcome_listener

pytestmark = pytest.mark.unit

S = Subjects()


async def test_the_waiting_request_gets_its_outcome_and_another_is_dropped():
    outcomes = Outcomes()
    broker = EdgeBroker()
    provide(broker, outcomes=outcomes)
    outcome_listener(broker, S, on_outcome)
    async with TestNatsBroker(broker) as bus:
        waiting = outcomes.expect("c-1")
        mine = CommandOutcome(command_id="c-1", kind="submit", accepted=True, job_id="job-1", by="queue")
        await bus.publish(mine.encode(), S.outcome("submit", "c-1"))
        await bus.publish(mine.model_copy(update={"command_id": "c-2"}).encode(), S.outcome("submit", "c-2"))
    assert waiting.done() and waiting.result().job_id == "job-1" and outcomes.ignored == 1
