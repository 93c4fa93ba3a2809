"""The ledger's charging rule (services/budget/domain/usage.py): each (job, executor, epoch, seq) is charged
once whatever the order, the duplicates or the epoch; and the reconciliation of a total with its ledger."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.budget.domain.usage import Charge, Reconciliation, missing_in_run, plan_charges

pytestmark = pytest.mark.unit


def charge(seq: int, *, epoch: int = 1, job: str = "j", executor: str = "ex1", devices: int = 1,
           wall: float = 1.0) -> Charge:
    return Charge(job, executor, epoch, seq, devices, wall)


@pytest.mark.parametrize(("batch", "charged", "current", "fresh", "duplicates", "late"), [
    ([charge(1), charge(2)], {}, {"j": 1}, [1, 2], 0, 0),
    ([charge(1), charge(1)], {}, {"j": 1}, [1], 1, 0),
    ([charge(1), charge(2)], {charge(1).key: charge(1)}, {"j": 1}, [2], 1, 0),
    ([charge(5, epoch=1)], {}, {"j": 2}, [5], 0, 1),
    ([charge(5, epoch=3)], {}, {"j": 2}, [5], 0, 0),
    ([charge(5, epoch=1)], {}, {}, [5], 0, 0),
], ids=["new", "twice-in-a-batch", "already-in-the-ledger", "old-epoch-charged-late", "newer-epoch", "unknown-job"])
def test_plan(batch, charged, current, fresh, duplicates, late):
    plan = plan_charges(batch, charged, current)
    assert [c.seq for c in plan.fresh] == fresh
    assert (plan.duplicates, plan.late, plan.conflicts) == (duplicates, late, [])


def test_the_same_seq_from_another_executor_or_epoch_is_another_record():
    batch = [charge(1), charge(1, executor="ex2"), charge(1, epoch=2), charge(1, job="k")]
    assert len(plan_charges(batch, {}, {}).fresh) == 4


def test_a_known_record_with_other_figures_is_a_conflict_and_not_charged_again():
    plan = plan_charges([charge(1, wall=9.0)], {charge(1).key: charge(1)}, {"j": 1})
    assert plan.fresh == [] and plan.conflicts == [charge(1, wall=9.0)] and plan.duplicates == 0


def test_added_seconds_are_devices_times_wall_per_job():
    plan = plan_charges([charge(1, devices=4, wall=2.5), charge(2, devices=0, wall=3.0), charge(1, job="k")], {}, {})
    assert plan.added_by_job() == {"j": 13.0, "k": 1.0}  # a CPU-only worker counts as one device


records = st.lists(
    st.builds(Charge, job_id=st.sampled_from(["a", "b"]), executor_id=st.sampled_from(["ex1", "ex2"]),
              epoch=st.integers(1, 4), seq=st.integers(1, 6), devices=st.integers(0, 8),
              wall_seconds=st.floats(0, 100, allow_nan=False)),
    max_size=25, unique_by=lambda c: c.key)


@settings(max_examples=300)
@given(records, st.integers(0, 3), st.randoms(use_true_random=False), st.lists(st.integers(1, 4), max_size=10),
       st.integers(1, 8))
def test_any_interleaving_of_duplicated_reordered_and_stale_records_charges_exactly_the_distinct_ones(
        distinct, copies, rnd: random.Random, epochs, batch_size):
    deliveries = [c for c in distinct for _ in range(1 + rnd.randint(0, copies))]
    rnd.shuffle(deliveries)
    ledger: dict[tuple[str, str, int, int], Charge] = {}
    current: dict[str, int] = {}
    late = 0
    for n in range(0, len(deliveries), batch_size):
        # The jobs' epochs move on between batches (requeues, new leases): late records must still count.
        if epochs:
            current = {"a": epochs[n % len(epochs)], "b": epochs[(n + 1) % len(epochs)]}
        batch = deliveries[n:n + batch_size]
        plan = plan_charges(batch, {c.key: ledger[c.key] for c in batch if c.key in ledger}, current)
        assert not plan.conflicts and len(plan.fresh) + plan.duplicates == len(batch)
        late += plan.late
        for c in plan.fresh:
            assert c.key not in ledger
            ledger[c.key] = c
    assert sorted(ledger) == sorted(c.key for c in distinct)
    assert sum(c.gpu_seconds for c in ledger.values()) == pytest.approx(sum(c.gpu_seconds for c in distinct))
    assert late <= len(distinct)


@pytest.mark.parametrize(("consumed", "ledger", "ok"), [
    (10.0, 10.0, True), (0.1 + 0.2, 0.3, True), (1e6, 1e6 + 1e-4, True), (10.0, 10.001, False), (0.0, 5.0, False),
], ids=["equal", "float-order", "relative", "off-by-a-millisecond", "missing-total"])
def test_reconciliation_allows_only_float_rounding(consumed, ledger, ok):
    r = Reconciliation("j", consumed, ledger, 3)
    assert r.ok is ok and r.as_dict()["difference"] == pytest.approx(consumed - ledger)


@pytest.mark.parametrize(("highest", "present", "missing"), [(3, 3, 0), (5, 3, 2), (1, 1, 0), (0, 0, 0)],
                         ids=["complete", "two-missing", "one-record", "empty"])
def test_missing_records_of_a_run_are_the_numbers_below_its_highest_not_in_the_ledger(highest, present, missing):
    assert missing_in_run(highest, present) == missing


def test_missing_records_do_not_fail_the_totals_they_are_reported_apart():
    r = Reconciliation("j", 2.0, 2.0, 2, missing=1, open_runs=1)
    assert r.ok and r.as_dict()["missing"] == 1 and r.as_dict()["open_runs"] == 1


def test_a_reports_records_become_the_same_rows_as_one_record_at_a_time():
    from libs.contracts.usage import UsageRecord, UsageReport
    from services.budget.store import charge_of, charges_of

    start = datetime(2026, 12, 1, tzinfo=UTC)
    records = [UsageRecord(job_id="j", epoch=2, seq=1, devices=4, wall_seconds=2.5, started_at=start,
                           ended_at=start + timedelta(seconds=2.5), last=True),
               UsageRecord(job_id="k", epoch=1, seq=7, devices=1, wall_seconds=0.0)]
    reports = [UsageReport(executor_id="ex1", node_id="n1", records=records),
               UsageReport(executor_id="ex2", node_id="n2", records=records[1:])]
    assert charges_of(reports) == [charge_of(r.executor_id, rec) for r in reports for rec in r.records]
    assert charges_of(reports)[0] == Charge("j", "ex1", 2, 1, 4, 2.5, start, start + timedelta(seconds=2.5), True)
