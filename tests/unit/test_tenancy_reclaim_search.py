"""Reclaim at scale (issue 12, item 4): a search for victims that found none is not repeated for every waiting job
of the same organisation, group and shape (10,000 waiting jobs cost one walk of the running jobs per such key, not
one each), and a search that succeeds still lets later jobs search again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.queue.tenancy import reclaim
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Node, Snapshot, WaitCode
from services.queue.tenancy.model import Cohort, GroupQuota, Organisation, Pending, Preemption, Running

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _snapshot(b_devices: int, waiting: int) -> Snapshot:
    """Org a wants its nominal 2 back; org b holds ``b_devices`` of the 4 busy one-GPU nodes (nominal 2)."""
    orgs = {"a": Organisation("a", cohort="c", quotas={"g": GroupQuota(2, borrowing_limit=2)}),
            "b": Organisation("b", cohort="c", quotas={"g": GroupQuota(2, borrowing_limit=2)})}
    nodes = [Node(f"n{i}", "g", 1, free=False) for i in range(4)]
    running = [Running(f"r{i}", "b", "g", 1, admitted_at=T0 + timedelta(seconds=i), executors=(f"n{i}",))
               for i in range(b_devices)]
    pending = [Pending(f"j{i:04d}", "a", T0 + timedelta(seconds=i), 1, 1) for i in range(waiting)]
    return Snapshot(orgs, nodes, pending, running, {"c": Cohort("c", Preemption.RECLAIM_BORROWED)})


def _counting(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    real = reclaim._victims

    def counted(*args, **kw):
        result = real(*args, **kw)
        calls.append((args[2].job_id, result is not None))
        return result

    monkeypatch.setattr(reclaim, "_victims", counted)
    return calls


def test_a_reclaim_that_finds_no_victim_is_searched_once_for_every_job_of_that_shape(monkeypatch):
    calls = _counting(monkeypatch)
    result = plan(_snapshot(b_devices=2, waiting=500))  # b within its nominal: nothing to reclaim
    assert not result.preempted and len(calls) == 1
    assert {w.code for w in result.waiting.values()} == {WaitCode.BEHIND} and len(result.waiting) == 500


def test_after_a_reclaim_succeeds_the_next_job_searches_again(monkeypatch):
    calls = _counting(monkeypatch)
    result = plan(_snapshot(b_devices=4, waiting=5))  # b borrows 2: a takes back its nominal 2, one per job
    assert [p.job_id for p in result.preempted] == ["r3", "r2"]
    assert [w.code for w in result.waiting.values()].count(WaitCode.RECLAIMING) == 2
    assert calls == [("j0000", True), ("j0001", True)]  # then a is at its nominal share: no search at all
