"""Health's heartbeat fold (services/health/domain/contact.py): a batch holding several heartbeats of one
executor or job leaves its row exactly as writing them one by one in send order would have, so the store can
write one statement per batch. The named cases are the rules; the exhaustive test checks the fold against a
closed form (the stuck clock restarts at the first heartbeat of the last unbroken run of equal progress) over
every short batch and starting row."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from services.health.domain.contact import Beat, Contact, fold, land

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def beat(at: float, progress="p", epoch: int = 1, cols=("x",)) -> Beat:
    return Beat(at=t(at), epoch=epoch, progress=progress, columns=cols)


def row(at: float | None, progress="p", clock: float | None = 0.0, epoch: int = 1) -> Contact:
    return Contact(at=None if at is None else t(at), epoch=epoch, progress=progress,
                   step_changed_at=None if clock is None else t(clock), columns=("old",))


def test_no_row_yet_starts_the_stuck_clock_at_the_first_heartbeat():
    assert fold(None, [beat(1), beat(2)], fenced=False) == Contact(t(2), 1, "p", t(1), ("x",))


def test_a_standing_step_then_a_moved_one_restarts_the_clock_at_the_move():
    out = fold(row(0, ("s", 5)), [beat(1, ("s", 5)), beat(2, ("s", 6)), beat(3, ("s", 6))], fenced=False)
    assert (out.at, out.step_changed_at) == (t(3), t(2))


def test_a_standing_step_keeps_the_row_s_clock():
    out = fold(row(0, "p", clock=-50), [beat(1), beat(2)], fenced=False)
    assert out.step_changed_at == t(-50)


def test_a_checkpointing_training_flap_restarts_the_clock_at_the_return_to_training():
    beats = [beat(1, "checkpointing"), beat(2, "training"), beat(3, "training")]
    out = fold(row(0, "training", clock=-50), beats, fenced=False)
    assert out.step_changed_at == t(2)


def test_a_row_without_a_clock_gets_one_even_when_nothing_changed():
    assert fold(row(0, "p", clock=None), [beat(1), beat(2)], fenced=False).step_changed_at == t(1)


def test_heartbeats_older_than_the_row_s_are_ignored_and_the_row_returned_as_it_was():
    before = row(10)
    assert fold(before, [beat(3, "q"), beat(9, "q")], fenced=False) is before


def test_a_heartbeat_as_old_as_the_row_s_still_lands():
    assert fold(row(5, "p"), [beat(5, "q")], fenced=False).step_changed_at == t(5)


def test_late_heartbeats_are_ignored_but_the_newer_ones_of_the_batch_land():
    out = fold(row(5, "p", clock=1), [beat(3, "q"), beat(6, "p")], fenced=False)
    assert (out.at, out.step_changed_at) == (t(6), t(1))


def test_a_job_heartbeat_of_an_older_epoch_never_lands_once_a_newer_one_did():
    out = fold(row(0, epoch=1), [beat(1, "a", epoch=2), beat(2, "b", epoch=1)], fenced=True)
    assert (out.at, out.epoch, out.progress) == (t(1), 2, "a")


def test_an_executor_is_not_fenced_by_epoch():
    out = fold(row(0, epoch=2), [beat(1, "b", epoch=1)], fenced=False)
    assert (out.at, out.epoch) == (t(1), 1)


def test_land_takes_every_column_of_the_newest_heartbeat():
    assert land(row(0), beat(1, cols=("new", 3)), fenced=False).columns == ("new", 3)


def _closed_form(start: Contact | None, beats: list[Beat], fenced: bool) -> Contact | None:
    """What one-by-one writing leaves, stated without stepping: the heartbeats that land are those no older
    (and, fenced, of no older epoch) than the row and every earlier landed one; the clock restarts at the first
    of the last run of equal progress, unless that run continues the row's own progress and the row had a clock."""
    landed, at, epoch = [], start and start.at, start.epoch if start else 0
    for b in beats:
        if (at is None or b.at >= at) and (not fenced or b.epoch >= epoch):
            landed.append(b)
            at, epoch = b.at, b.epoch
    if not landed:
        return start
    last = landed[-1]
    run = list(itertools.takewhile(lambda b: b.progress == last.progress, reversed(landed)))[::-1]
    continues = (len(run) == len(landed) and start is not None and start.step_changed_at is not None
                 and start.progress == last.progress)
    return Contact(at=last.at, epoch=last.epoch, progress=last.progress,
                   step_changed_at=start.step_changed_at if continues else run[0].at, columns=last.columns)


_STARTS = [None] + [row(a, p, c, e) for a in (None, 1, 2) for p in ("A", "B", None) for c in (None, -5)
                    for e in (0, 1)]
_BEATS = [beat(a, p, e, cols=(a, p, e)) for a in (0, 1, 2) for p in ("A", "B") for e in (0, 1, 2)]


@pytest.mark.parametrize("fenced", [False, True], ids=["executor", "job"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_fold_matches_the_closed_form_for_every_short_batch(fenced, n):
    for start in _STARTS:
        for beats in itertools.product(_BEATS, repeat=n):
            batch = sorted(beats, key=lambda b: b.at)  # the store folds oldest first, stably
            assert fold(start, batch, fenced=fenced) == _closed_form(start, batch, fenced), (start, batch)
