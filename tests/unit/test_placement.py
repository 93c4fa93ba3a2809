"""Placement: fit by GPU count, first come first served, gangs all or nothing, smallest fitting node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.queue.domain.placement import Assignment, FreeExecutor, QueuedJob, place

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def job(job_id: str, at: int = 0, workers: int = 1, gpus: int = 0) -> QueuedJob:
    return QueuedJob(job_id, T0 + timedelta(seconds=at), workers, gpus)


def ex(executor_id: str, gpus: int = 0, seen_ago: float = 0.0) -> FreeExecutor:
    return FreeExecutor(executor_id, gpus, T0 - timedelta(seconds=seen_ago))


@pytest.mark.parametrize(("need", "have", "fit"), [
    (0, 0, True), (0, 8, True), (1, 0, False), (1, 1, True), (4, 2, False), (4, 8, True),
], ids=lambda v: str(v))
def test_an_executor_fits_when_it_has_enough_gpus(need, have, fit):
    result = place([job("j", gpus=need)], [ex("e", gpus=have)], T0)
    assert result == ([Assignment("j", ("e",))] if fit else [])


def test_first_come_first_served():
    result = place([job("late", at=5), job("early", at=1)], [ex("e")], T0)
    assert result == [Assignment("early", ("e",))]


def test_every_free_executor_is_used_once():
    result = place([job("a", 1), job("b", 2), job("c", 3)], [ex("e1"), ex("e2")], T0)
    assert [a.job_id for a in result] == ["a", "b"]
    assert len({w for a in result for w in a.workers}) == 2


def test_a_gang_gets_distinct_executors_or_none():
    assert place([job("g", workers=3)], [ex("e1"), ex("e2")], T0) == []
    (a,) = place([job("g", workers=2)], [ex("e1"), ex("e2"), ex("e3")], T0)
    assert len(set(a.workers)) == 2


def test_a_gang_that_cannot_fit_holds_nothing_back_from_later_jobs():
    result = place([job("g", 1, workers=3), job("small", 2)], [ex("e1"), ex("e2")], T0)
    assert result == [Assignment("small", ("e1",))]


def test_the_smallest_fitting_executor_is_taken_so_big_nodes_stay_for_big_jobs():
    result = place([job("cpu", 1, gpus=0), job("gpu", 2, gpus=4)], [ex("big", gpus=8), ex("cpu-node", gpus=0)], T0)
    assert result == [Assignment("cpu", ("cpu-node",)), Assignment("gpu", ("big",))]


def test_an_executor_gone_quiet_is_left_out():
    result = place([job("j")], [ex("quiet", seen_ago=5), ex("alive", seen_ago=1)], T0, silent_after_seconds=2)
    assert result == [Assignment("j", ("alive",))]


def test_nothing_to_place():
    assert place([], [ex("e")], T0) == [] and place([job("j")], [], T0) == []
