"""``facts.evolve`` (services/queue/domain/facts.py): the lifecycle's cheap copy of a Job with some fields changed
must be exactly ``dataclasses.replace``: the same job, the original untouched, an unknown field refused."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings, strategies as st

from libs.contracts.jobs import JobState
from services.queue.domain.facts import GangWorker, Job, evolve, made
from tests.support import builders

NOW = datetime(2026, 12, 1, tzinfo=UTC)


# Never granted (a grant of epoch 1 is its first); frozen, so every test may start from it.
NEW = builders.job(epoch=0, at=NOW, spec=builders.command_spec(), event_seq=1, org="o", project="p")


CHANGES = st.fixed_dictionaries({}, optional={
    "state": st.sampled_from(list(JobState)), "lease_epoch": st.integers(0, 9), "executor_id": st.text(max_size=5),
    "workers": st.lists(st.text(max_size=3), max_size=3).map(tuple), "reason": st.none() | st.text(max_size=5),
    "gang": st.lists(st.builds(GangWorker, st.text(max_size=3)), max_size=2).map(tuple),
    "updated_at": st.datetimes(timezones=st.just(UTC)), "event_seq": st.integers(0, 99)})


@settings(max_examples=200, deadline=None)
@given(CHANGES)
def test_evolve_is_replace(changes):
    before = NEW
    kept = dataclasses.replace(before)
    got = evolve(before, **changes)
    assert got == dataclasses.replace(before, **changes) and type(got) is Job
    assert before == kept  # the original is not changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.state = JobState.RUNNING  # type: ignore[misc] - still frozen


def test_evolve_refuses_a_name_that_is_not_a_field():
    with pytest.raises(TypeError, match="no field"):
        evolve(NEW, stat=JobState.RUNNING)


def test_a_grant_changes_only_the_columns_a_placement_pass_writes():
    """``store.only_granted``: a grant (single or gang) changes nothing ``write_grants`` leaves out; any other
    change (a new spec, a checkpoint) is seen, so that transition is written whole."""
    from datetime import timedelta

    from services.queue import store
    from services.queue.domain import lifecycle as lc

    before = NEW
    for workers, extra in ((("ex-1",), {}), (("ex-1", "ex-2"), {"rendezvous": "h:1", "ready_deadline": NOW})):
        t = lc.decide(before, lc.Granted(workers, 1, NOW + timedelta(seconds=30), **extra), NOW)
        assert isinstance(t, lc.Transition) and t.job.state is not JobState.QUEUED
        assert store.only_granted(before, t.job)
    assert not store.only_granted(before, evolve(before, last_checkpoint={"step": 1}))
    assert not store.only_granted(before, evolve(before, spec=before.spec.model_copy(update={"priority": 3})))
    assert store.only_granted(before, evolve(before, spec=before.spec.model_copy()))  # equal, not the same object


@settings(max_examples=100, deadline=None)
@given(CHANGES)
def test_made_is_the_constructor(changes):
    """``facts.made`` (a stored row read into a Job without the frozen ``__init__``): the job the constructor
    makes, fields in their order, still frozen; a missing or unknown name refused."""
    values = {**NEW.__dict__, **changes}
    got = made(dict(values))
    assert got == Job(**values) and type(got) is Job and list(got.__dict__) == list(Job.__dataclass_fields__)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.state = JobState.RUNNING  # type: ignore[misc] - still frozen
    with pytest.raises(TypeError, match="missing"):
        made({k: v for k, v in values.items() if k != "spec"})
    with pytest.raises(TypeError, match="unknown"):
        made({**values, "colour": "red"})
