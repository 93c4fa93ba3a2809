"""A job naming a Python environment (issue 27) against the real queue and PostgreSQL: the executors' heartbeats
say which environments they offer, and a submit naming one no executor offers is refused with its name."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.telemetry import Heartbeat
from libs.runtime.service import Runtime
from services.queue.commands import Commands
from services.queue.runs import Runs
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA
from tests.support import builders

pytestmark = pytest.mark.integration


def submit(environment: str | None) -> SubmitJob:
    return builders.submit(builders.command_spec("python", "t.py", environment=environment))


def beat(executor: str, environments: list[str]) -> Heartbeat:
    return builders.heartbeat(executor, group="default", sent_at=datetime.now(UTC), progress_interval_seconds=5,
                              environments=environments)


async def test_a_submit_naming_an_environment_no_executor_offers_is_refused(env):
    settings = env.settings(QueueSettings)
    runtime = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        commands, runs = Commands(runtime, settings), Runs(runtime, settings)
        await runs.heartbeats([beat("ex-1", ["/opt/teto/env", "/usr/bin/python3.11"]), beat("ex-2", [])])
        stored = await runtime.pool.fetch(f"SELECT executor_id, environments FROM {SCHEMA}.executors"
                                          " ORDER BY executor_id")
        assert [(r["executor_id"], r["environments"]) for r in stored] == [
            ("ex-1", ["/opt/teto/env", "/usr/bin/python3.11"]), ("ex-2", [])]
        batch = [submit("/opt/teto/env"), submit("/opt/other"), submit(None), submit("/usr/bin/python3.11")]
        outcomes = await commands.submit_all(batch)
        assert [o.accepted for o in outcomes] == [True, False, True, True]
        assert outcomes[1].reason.startswith("no node offers the Python environment /opt/other")
        assert outcomes[1].detail == {"environment": "/opt/other"}
        # ex-1 stops offering it (its next heartbeat): the same spec is refused from then on.
        await runs.heartbeats([beat("ex-1", [])])
        (again,) = await commands.submit_all([submit("/opt/teto/env")])
        assert not again.accepted and "/opt/teto/env" in again.reason
    finally:
        await runtime.close()
