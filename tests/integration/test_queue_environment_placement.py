"""Placement by Python environment (issue 27) on the real queue and PostgreSQL: two executors, only one offering
the environment a job names (their heartbeats say so); the job is granted to that one, never the other, and while
no ready executor offers it the job waits queued with its reason (what its view shows) until one does."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import Heartbeat
from libs.runtime.service import Runtime
from services.queue.commands import Commands
from services.queue.runs import Runs
from services.queue.scheduler import Scheduler
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA
from tests.support import builders

pytestmark = pytest.mark.integration

ENV, OTHER = "/opt/teto/env", "/opt/conda/envs/x"


def beat(executor: str, environments: list[str]) -> Heartbeat:
    return builders.heartbeat(executor, group="default", sent_at=datetime.now(UTC), progress_interval_seconds=5,
                              environments=environments)


async def test_a_job_naming_an_environment_goes_only_to_an_executor_offering_it_and_waits_while_none_does(env):
    # Nodes not yet judged by health may take work: the executors here are known only by their heartbeats.
    settings = env.settings(QueueSettings).model_copy(update={"require_checked_nodes": False})
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        commands, runs, scheduler = Commands(rt, settings), Runs(rt, settings), Scheduler(rt, settings)

        async def submit(environment: str | None) -> str:
            spec = {"workload": {"kind": "command", "command": ["python", "t.py"]}, "environment": environment}
            cmd = SubmitJob(actor="ann", spec=JobSpec.model_validate(spec))
            assert (await commands.submit(cmd)).accepted
            return cmd.job_id

        async def job(job_id: str) -> tuple[str, list[str], dict | None]:
            row = await rt.pool.fetchrow(f"SELECT state, workers, waiting FROM {SCHEMA}.jobs WHERE id = $1", job_id)
            return row["state"], list(row["workers"] or []), json.loads(row["waiting"]) if row["waiting"] else None

        # ex-1 comes first for any job (same GPUs, smaller id) but offers another environment; ex-2 offers ENV.
        await runs.heartbeats([beat("ex-1", [OTHER]), beat("ex-2", [ENV])])
        first = await submit(ENV)
        assert await scheduler.place_once() == 1
        assert (await job(first))[:2] == ("running", ["ex-2"])

        # ex-2 is busy: a second job naming ENV waits behind, never granted to the free ex-1.
        second = await submit(ENV)
        assert await scheduler.place_once() == 0
        state, workers, waiting = await job(second)
        assert (state, workers, waiting["code"]) == ("queued", [], "behind")

        # ex-2 falls silent (its heartbeats stop): no ready executor offers ENV; the job waits saying why.
        await rt.pool.execute(f"UPDATE {SCHEMA}.executors SET last_seen = last_seen - interval '1 day'"
                              " WHERE executor_id = 'ex-2'")
        assert await scheduler.place_once() == 0
        state, workers, waiting = await job(second)
        assert (state, workers, waiting["code"]) == ("queued", [], "no_environment")
        assert waiting["reason"].startswith(f"no ready node offers the Python environment {ENV} ")
        # A job naming none still takes ex-1 meanwhile.
        anywhere = await submit(None)
        assert await scheduler.place_once() == 1
        assert (await job(anywhere))[:2] == ("running", ["ex-1"])
        assert (await job(second))[:2] == ("queued", [])

        # An executor offering ENV appears: the waiting job is granted to it.
        await runs.heartbeats([beat("ex-3", [OTHER, ENV])])
        assert await scheduler.place_once() == 1
        state, workers, waiting = await job(second)
        assert (state, workers, waiting) == ("running", ["ex-3"], None)
    finally:
        await rt.close()


async def test_every_worker_of_a_gang_naming_an_environment_goes_to_an_executor_offering_it(env):
    settings = env.settings(QueueSettings).model_copy(update={"require_checked_nodes": False})
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        # In executor order a gang of two would take ex-1 and ex-2; ex-2 does not offer ENV.
        await Runs(rt, settings).heartbeats([beat("ex-1", [ENV]), beat("ex-2", [OTHER]), beat("ex-3", [ENV])])
        spec = {"workload": {"kind": "command", "command": ["python", "t.py"]}, "environment": ENV, "workers": 2}
        cmd = SubmitJob(actor="ann", spec=JobSpec.model_validate(spec))
        assert (await Commands(rt, settings).submit(cmd)).accepted
        assert await Scheduler(rt, settings).place_once() == 1
        row = await rt.pool.fetchrow(f"SELECT state, workers FROM {SCHEMA}.jobs WHERE id = $1", cmd.job_id)
        assert (row["state"], sorted(row["workers"])) == ("admitting", ["ex-1", "ex-3"])
    finally:
        await rt.close()
