"""How job events land on health's row of a job (services/health/domain/tracking.py), one at a time and folded
in batches: redeliveries ignored, a new lease epoch resets the contact, phase and step, the same epoch keeps
them, an event without an executor keeps the row's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.health.domain.tracking import Event, JobRow, fold_events, on_event

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ROW = JobRow("running", 3, 1, "ex1", T0, T0, "training", 40)


def ev(seq: int, state: str = "running", epoch: int | None = 1, executor: str | None = "ex1", at: float = 10) -> Event:
    return Event(state, seq, epoch, executor, T0 + timedelta(seconds=at))


def test_a_job_without_a_row_starts_from_its_event_whatever_its_epoch():
    assert on_event(None, ev(1, "queued", epoch=None, executor=None)) == JobRow(
        "queued", 1, 0, None, T0 + timedelta(seconds=10), T0 + timedelta(seconds=10), None, None)


@pytest.mark.parametrize("seq", [1, 3], ids=["older", "same seq"])
def test_an_event_already_applied_is_ignored(seq):
    assert on_event(ROW, ev(seq, "failed", epoch=5)) is ROW


def test_a_new_lease_epoch_resets_contact_phase_and_step():
    assert on_event(ROW, ev(4, "running", epoch=2, executor="ex2")) == JobRow(
        "running", 4, 2, "ex2", T0 + timedelta(seconds=10), T0 + timedelta(seconds=10), None, None)


def test_the_same_epoch_keeps_contact_phase_step_and_an_executorless_event_keeps_the_executor():
    assert on_event(ROW, ev(4, "succeeded", epoch=1, executor=None)) == JobRow(
        "succeeded", 4, 1, "ex1", T0, T0, "training", 40)


def test_an_older_epoch_never_lowers_the_row_s():
    assert on_event(ROW, ev(4, "running", epoch=None)).epoch == 1


def test_a_batch_folds_in_sequence_order_and_ignores_what_it_overtook():
    out = fold_events(ROW, [ev(4, "interrupted", epoch=1), ev(5, "running", epoch=2, executor="ex9", at=20),
                            ev(5, "failed", epoch=3, at=30), ev(6, "succeeded", epoch=2, executor=None, at=40)])
    assert out == JobRow("succeeded", 6, 2, "ex9", T0 + timedelta(seconds=20), T0 + timedelta(seconds=20), None, None)


def test_a_batch_of_nothing_new_returns_the_row_itself():
    assert fold_events(ROW, [ev(2), ev(3)]) is ROW
