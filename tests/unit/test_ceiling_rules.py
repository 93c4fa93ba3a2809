"""Properties of the GPU-ceiling rules across services: the queue's requeue decision and the budget's rule agree
on every (consumed, new ceiling) pair; over a job's whole life of ceilings and requeues the overshoot is the
largest excess past any ceiling, each ceiling's exhaustion is announced exactly once, and nothing is charged
while the job is not running (the executor's meter)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.executor.heartbeat import UsageMeter
from libs.contracts.jobs import JobState
from services.budget.domain.ledger import REQUEUE_MARGIN_SECONDS, Account, check_new_ceiling, on_ceiling, on_usage
from services.queue.domain.lifecycle import Job, Refusal, Requeue, Transition, decide
from tests.support import builders

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


def interrupted(ceiling: float) -> Job:
    return builders.job(JobState.INTERRUPTED, epoch=0, at=T0, spec=builders.spec(gpu_ceiling_seconds=ceiling),
                        reason="gpu_ceiling", ceiling_history=({"ceiling_seconds": ceiling, "actor": "ann"},))


@given(consumed=seconds, new=st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
def test_requeue_is_accepted_exactly_when_the_new_total_leaves_a_minute(consumed, new):
    result = decide(interrupted(10.0), Requeue(new_ceiling=new, consumed=consumed, actor="op"), T0)
    budget_rule = check_new_ceiling(consumed, new)
    assert budget_rule.ok is (new >= consumed + REQUEUE_MARGIN_SECONDS)
    if budget_rule.ok:
        assert isinstance(result, Transition) and result.job.state is JobState.QUEUED
        assert result.job.spec.gpu_ceiling_seconds == new and result.job.ceiling_history[-1]["actor"] == "op"
        assert result.job.ceiling_history[0]["ceiling_seconds"] == 10.0  # earlier ceilings are kept
    else:
        assert isinstance(result, Refusal)
        assert result.detail == budget_rule.detail()  # the same three numbers whoever answers


@given(st.lists(st.tuples(st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), max_size=8),
                          st.floats(min_value=0, max_value=500, allow_nan=False)), min_size=1, max_size=6),
       st.floats(min_value=1, max_value=100, allow_nan=False))
def test_over_any_life_of_requeues_overshoot_is_the_largest_excess_and_each_ceiling_is_announced_once(life, first):
    """``life``: runs, each a list of usage samples followed by the extra the requeue asks above consumed+60."""
    acc, ceiling = on_ceiling(Account(ceiling=None), first).account, first
    largest_excess, announced = 0.0, {}
    for samples, extra in life:
        for s in samples:
            d = on_usage(acc, s)
            acc = d.account
            if d.exhausted:
                announced[ceiling] = announced.get(ceiling, 0) + 1
            largest_excess = max(largest_excess, acc.consumed - ceiling)
        if acc.consumed >= ceiling:
            assert announced.get(ceiling) == 1  # reached: announced, and only once
        ceiling = acc.consumed + REQUEUE_MARGIN_SECONDS + extra  # a requeue the rule accepts
        d = on_ceiling(acc, ceiling)
        assert not d.exhausted  # a new ceiling with room left is never exhausted on arrival
        acc = d.account
    assert acc.overshoot == pytest.approx(max(0.0, largest_excess))
    assert all(n == 1 for n in announced.values())


@given(st.lists(st.sampled_from(["beat", "start", "finish", "ack"]), max_size=40),
       st.lists(st.floats(min_value=0.01, max_value=5, allow_nan=False), min_size=40, max_size=40))
def test_the_meter_charges_exactly_the_time_a_process_ran(actions, gaps):
    """Whatever the order of heartbeats, process starts and exits, and acknowledgements, the samples sent (each
    counted once, by seq) add up to the time between each start and its finish, and nothing else."""
    meter, now, running_since, ran = UsageMeter(), 0.0, None, 0.0
    sent: dict[tuple[int, int], float] = {}
    epoch = 0
    for action, gap in zip(actions, gaps, strict=False):
        now += gap
        if action == "start" and running_since is None:
            epoch += 1
            meter.start("j", epoch, devices=1, now=now)
            running_since = now
        elif action == "finish" and running_since is not None:
            meter.finish(now)
            ran += now - running_since
            running_since = None
        elif action in ("beat", "ack"):
            sample = meter.next_sample(now)
            if sample is not None:
                sent[(sample.epoch, sample.seq)] = sample.wall_seconds  # a resend carries the same seq
                if action == "ack":
                    meter.acknowledged(sample)
    if running_since is not None:
        meter.finish(now)
        ran += now - running_since
    while (sample := meter.next_sample(now)) is not None:  # flush what is still owed
        sent[(sample.epoch, sample.seq)] = sample.wall_seconds
        meter.acknowledged(sample)
    assert sum(sent.values()) == pytest.approx(ran)
