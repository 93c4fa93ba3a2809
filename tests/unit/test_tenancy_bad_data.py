"""One organisation's bad numbers stay its own (issue 26, item 4): the contract bounds every tenancy number, a
stored organisation the contract refuses now is set aside with the reason, its jobs wait saying so, and the
others are placed; a loop that keeps raising is a problem in the status."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from libs.contracts.status import ReplicaStatus
from libs.contracts.tenancy import MAX_WEIGHT, MIN_WEIGHT, OrgSpec, QuotaSpec
from libs.runtime.loophealth import CURRENT, FAILING_AFTER, LoopHealth
from libs.runtime.singleton import periodic
from services.gateway.domain.status import services_view
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Node, Snapshot, WaitCode
from services.queue.tenancy.model import Pending
from services.queue.tenancy.orgs import read as read_orgs
from services.queue.tenancy_edge import organisation

pytestmark = pytest.mark.unit
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("spec", [
    {"weight": 5e-324}, {"weight": 1e-300}, {"weight": 0}, {"weight": -1}, {"weight": MIN_WEIGHT / 2},
    {"weight": MAX_WEIGHT * 2}, {"weight": 1e308}, {"budget_gpu_seconds": -1}, {"budget_gpu_seconds": 1e13},
    {"quotas": {"g": {"nominal": -1}}}, {"quotas": {"g": {"nominal": 10**7}}},
    {"quotas": {"g": {"nominal": 1, "borrowing_limit": 10**7}}},
], ids=lambda s: json.dumps(s))
def test_the_contract_refuses_tenancy_numbers_out_of_bounds(spec):
    with pytest.raises(ValidationError):
        OrgSpec.model_validate(spec)


@pytest.mark.parametrize("weight", [MIN_WEIGHT, 0.5, 1.0, MAX_WEIGHT])
def test_weights_within_the_bounds_are_accepted(weight):
    assert OrgSpec(weight=weight, quotas={"g": QuotaSpec(nominal=1)}).weight == weight


def test_the_weight_s_bounds_keep_every_share_an_ordinary_float():
    assert 10**6 / MIN_WEIGHT < 1e300  # the most devices held over the least weight


def test_a_stored_organisation_the_contract_refuses_now_is_set_aside_with_the_reason():
    orgs = read_orgs([("ok", json.dumps({"weight": 2})), ("tiny", json.dumps({"weight": 5e-324})),
                      ("junk", "{not json"), ("extra", json.dumps({"weight": 1, "surprise": 1}))], organisation)
    assert list(orgs) == ["ok"] and orgs["ok"].weight == 2
    assert set(orgs.broken) == {"tiny", "junk", "extra"}
    assert "weight" in orgs.broken["tiny"] and "greater than or equal to 0.001" in orgs.broken["tiny"]


def test_a_set_aside_organisation_s_jobs_wait_saying_why_and_the_others_are_placed():
    orgs = read_orgs([("ok", json.dumps({})), ("tiny", json.dumps({"weight": 5e-324}))], organisation)
    pending = [Pending("t1", "tiny", T0, 1, 0, 0), Pending("o1", "ok", T0, 1, 0, 0)]
    nodes = [Node("ex-1", "default", 0), Node("ex-2", "default", 0)]
    result = plan(Snapshot(orgs, nodes, pending, broken=orgs.broken))
    assert [a.job_id for a in result.admitted] == ["o1"]
    wait = result.waiting["t1"]
    assert wait.code is WaitCode.ORGANISATION_INVALID and "organisation tiny's settings are refused" in wait.reason
    assert "weight" in wait.reason


def test_a_loop_is_failing_after_several_ticks_in_a_row_and_well_again_after_one_success():
    health = LoopHealth()
    for i in range(FAILING_AFTER - 1):
        health.failed("placement", ValueError(f"boom {i}"), T0)
    assert health.failing() == []
    health.failed("placement", ValueError("boom last"), T0)
    (f,) = health.failing()
    assert (f.name, f.failures, f.since, f.error) == ("placement", FAILING_AFTER, T0, "ValueError: boom last")
    health.succeeded("placement")
    assert health.failing() == []


async def test_periodic_reports_its_ticks_to_the_runtime_s_loop_health():
    health = LoopHealth(failing_after=2)
    ticks = 0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 3:
            done.set()
        if ticks <= 3:
            raise RuntimeError("value out of range: overflow")

    async def no_wait(_: float) -> None:
        if done.is_set():
            await asyncio.Event().wait()  # hold the loop here, as a long schedule interval would

    CURRENT.set(health)
    task = asyncio.create_task(periodic(tick, 1.0, "placement", sleep=no_wait)())
    await done.wait()
    assert [f.failures for f in health.failing()] == [3]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_failing_loop_is_a_problem_in_the_status():
    failing = LoopHealth(failing_after=1)
    failing.failed("placement", RuntimeError("NumericValueOutOfRangeError: value out of range: overflow"), T0)
    r = ReplicaStatus(service="queue", instance="q1", started_at=T0, failing_loops=failing.failing())
    view, problems = services_view([r], ("queue",))
    assert problems == ["queue: loop placement of replica q1 failing since 2026-12-01T12:00:00+00:00 (1 ticks in a "
                        "row): RuntimeError: NumericValueOutOfRangeError: value out of range: overflow"]
    assert view["queue"]["replicas"][0]["failing_loops"][0]["name"] == "placement"
