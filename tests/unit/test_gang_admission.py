"""Gang admission arithmetic: ready timeouts, the back-off sequence against its formula with an injected
random source and clock, sequential admission, and rendezvous ports."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.contracts.policies import GangPolicy, NodeFailureStrategy
from services.queue.domain.gang_admission import (
    JITTER_FRACTION,
    PortRange,
    admissible,
    backoff_due,
    capped_delay,
    next_backoff,
    ready_deadline,
    ready_timeout,
    rendezvous,
    rendezvous_port,
    spec_refusal,
    timed_out,
)
from tests.support.builders import T0, queued_job, spec

pytestmark = pytest.mark.unit


# -- policy -----------------------------------------------------------------------------------------------

def test_policy_defaults_are_what_docs_say():
    p = GangPolicy()
    assert (p.ready_timeout_seconds, p.backoff_base_seconds, p.backoff_max_seconds, p.backoff_limit,
            p.sequential_admission, p.node_failure_strategy) == (120.0, 15.0, 600.0, 5, True,
                                                                 NodeFailureStrategy.REQUEUE_GANG)


def test_policy_refuses_a_cap_below_the_base():
    with pytest.raises(ValueError, match="below backoff_base_seconds"):
        GangPolicy(backoff_base_seconds=10, backoff_max_seconds=5)


# -- ready timeout ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("asked", "policy", "effective"), [
    (None, 120, 120), (30, 120, 30), (120, 120, 120), (200, 120, 120),
], ids=["policy's", "shorter asked", "equal", "policy shortened since submit"])
def test_ready_timeout_is_the_shorter_of_job_and_policy(asked, policy, effective):
    gang = spec(workers=3, ready_timeout_seconds=asked)
    assert ready_timeout(gang, GangPolicy(ready_timeout_seconds=policy)) == effective
    assert ready_deadline(T0, gang, GangPolicy(ready_timeout_seconds=policy)) == T0 + timedelta(seconds=effective)


def test_a_job_asking_a_longer_ready_timeout_than_the_policy_is_refused_with_the_numbers():
    reason, numbers = spec_refusal(spec(workers=3, ready_timeout_seconds=300), GangPolicy(ready_timeout_seconds=120))
    assert "shorter" in reason and numbers == {"ready_timeout_seconds": 300, "policy_ready_timeout_seconds": 120}
    assert spec_refusal(spec(workers=3, ready_timeout_seconds=120), GangPolicy(ready_timeout_seconds=120)) is None
    assert spec_refusal(spec(workers=3, ready_timeout_seconds=None), GangPolicy()) is None


@pytest.mark.parametrize(("offset", "over"), [(-0.001, False), (0.0, True), (5.0, True)],
                         ids=["just before", "at the deadline", "after"])
def test_ready_deadline_is_over_at_the_deadline(offset, over):
    deadline = T0 + timedelta(seconds=30)
    assert timed_out(deadline, deadline + timedelta(seconds=offset)) is over
    assert timed_out(None, deadline) is False


# -- back-off ---------------------------------------------------------------------------------------------

def test_backoff_doubles_from_the_base_and_is_capped():
    p = GangPolicy(backoff_base_seconds=10, backoff_max_seconds=100, backoff_limit=None)
    assert [capped_delay(p, n) for n in range(1, 8)] == [10, 20, 40, 80, 100, 100, 100]
    assert capped_delay(p, 10_000) == 100  # an unlimited policy reaches any n without overflow


def test_requeue_times_follow_the_formula_with_an_injected_clock_and_random_source():
    """Play a job timing out again and again: each requeue lands at timeout time + base x 2^(n-1) (capped)
    plus the jitter drawn from the injected source, and the job fails after the limit."""
    p = GangPolicy(ready_timeout_seconds=30, backoff_base_seconds=5, backoff_max_seconds=30, backoff_limit=4)
    rng = random.Random(7)
    draws = random.Random(7)  # the same source, replayed: the test knows every draw in advance
    now, count, requeues = T0, 0, []
    while (b := next_backoff(p, count, rng.random())) is not None:
        now += timedelta(seconds=30)  # admitted, then timed out after the ready timeout
        at = b.requeue_at(now)
        requeues.append((b.n, (at - now).total_seconds(), b.jitter))
        count, now = b.n, at
    assert [n for n, _, _ in requeues] == [1, 2, 3, 4]
    for n, delay, draw in requeues:
        assert draw == draws.random()
        assert delay == pytest.approx(min(5 * 2 ** (n - 1), 30) * (1 + JITTER_FRACTION * draw))
    assert next_backoff(p, 4, 0.5) is None  # the 5th timeout fails the job


@given(base=st.floats(0.1, 1000), factor=st.floats(1, 100), n=st.integers(1, 200), draw=st.floats(0, 0.999999))
def test_backoff_stays_within_its_bounds(base, factor, n, draw):
    p = GangPolicy(backoff_base_seconds=base, backoff_max_seconds=base * factor, backoff_limit=None)
    b = next_backoff(p, n - 1, draw)
    assert b is not None and b.n == n
    assert base <= b.base_delay_seconds <= p.backoff_max_seconds
    assert b.base_delay_seconds <= b.delay_seconds <= b.base_delay_seconds * (1 + JITTER_FRACTION)


@given(n=st.integers(1, 60))
def test_backoff_never_shrinks(n):
    p = GangPolicy(backoff_base_seconds=1, backoff_max_seconds=3600, backoff_limit=None)
    assert capped_delay(p, n + 1) >= capped_delay(p, n)


@pytest.mark.parametrize(("limit", "allowed"), [(0, 0), (1, 1), (3, 3)], ids=["0", "1", "3"])
def test_backoff_limit_counts_backoffs_then_fails(limit, allowed):
    p = GangPolicy(backoff_limit=limit)
    assert [next_backoff(p, k, 0.0) is not None for k in range(allowed + 1)] == [True] * allowed + [False]


def test_a_draw_outside_the_unit_interval_is_a_bug():
    with pytest.raises(ValueError):
        next_backoff(GangPolicy(), 0, 1.0)


def test_backoff_is_due_at_its_time():
    assert backoff_due(T0, T0) and not backoff_due(T0, T0 - timedelta(microseconds=1)) and not backoff_due(None, T0)


# -- sequential admission ---------------------------------------------------------------------------------

def test_sequential_admission_considers_only_the_first_gang_and_every_single_worker_job():
    jobs = [queued_job("g2", at=120, workers=3), queued_job("s1", at=60, workers=1),
            queued_job("g1", at=0, workers=3), queued_job("s3", at=180, workers=1)]
    assert [j.job_id for j in admissible(jobs, admitting_now=0, sequential=True)] == ["g1", "s1", "s3"]


def test_sequential_admission_holds_every_gang_while_one_is_admitting():
    jobs = [queued_job("g1", at=0, workers=3), queued_job("s1", at=60, workers=1)]
    assert [j.job_id for j in admissible(jobs, admitting_now=1, sequential=True)] == ["s1"]


def test_without_sequential_admission_every_gang_is_considered_in_arrival_order():
    jobs = [queued_job("g2", at=120, workers=3), queued_job("g1", at=0, workers=2)]
    assert [j.job_id for j in admissible(jobs, admitting_now=1, sequential=False)] == ["g1", "g2"]


# -- rendezvous -------------------------------------------------------------------------------------------

def test_rendezvous_port_is_stable_per_epoch_and_avoids_ports_in_use():
    r = PortRange(29500, 100)
    p1 = rendezvous_port("job", 1, set(), r)
    assert p1 == rendezvous_port("job", 1, set(), r) and 29500 <= p1 < 29600
    assert rendezvous_port("job", 1, {p1}, r) != p1
    assert rendezvous_port("job", 1, set(range(29500, 29600)), r) is None


def test_rendezvous_names_an_ipv6_host_in_brackets():
    assert rendezvous("10.0.0.5", 29500) == "10.0.0.5:29500"
    assert rendezvous("fe80::1", 29500) == "[fe80::1]:29500"
    assert rendezvous(None, 29500) == "127.0.0.1:29500"


def test_a_port_range_outside_the_unprivileged_ports_is_refused():
    with pytest.raises(ValueError):
        PortRange(80, 10)
    with pytest.raises(ValueError):
        PortRange(65530, 10)
