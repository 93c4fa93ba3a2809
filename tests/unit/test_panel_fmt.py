"""The panel's formatting per locale: numbers, durations, GPU time, moments."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.gateway.panel import fmt

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("value", "decimals", "pt", "en"), [
    (1234.5, 1, "1.234,5", "1,234.5"), (0, 0, "0", "0"), (1234567, 0, "1.234.567", "1,234,567"),
    (-3.25, 2, "-3,25", "-3.25"), (None, 0, "—", "—"), (float("nan"), 0, "—", "—")], ids=str)
def test_numbers_follow_the_locale(value, decimals, pt, en):
    assert fmt.number(value, "pt-BR", decimals) == pt
    assert fmt.number(value, "en", decimals) == en


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (0.0004, "< 1 ms"), (0.012, "12 ms"), (0.5, "500 ms"), (0.949, "949 ms"), (0.96, "1 s"),
    (4.26, "4.3 s"), (9.96, "10 s"), (45, "45 s"), (60, "1 min"), (200, "3 min 20 s"),
    (3600, "1 h"), (3660, "1 h 1 min"), (7505, "2 h 5 min"), (3605, "1 h"), (90000, "1 d 1 h"), (-5, "0 s"),
    (None, "—")], ids=str)
def test_durations_keep_the_two_largest_units(seconds, text):
    assert fmt.duration(seconds, "en") == text


def test_short_durations_use_the_locale_decimal_point():
    assert fmt.duration(4.5, "pt-BR") == "4,5 s"
    assert fmt.duration(0.0426, "pt-BR") == "43 ms"
    assert fmt.duration(200, "pt-BR") == "3 min 20 s"


@pytest.mark.parametrize(("seconds", "pt", "en"), [
    (45, "45 GPU-s", "45 GPU-s"), (0.5, "0,5 GPU-s", "0.5 GPU-s"), (90, "1,5 GPU-min", "1.5 GPU-min"),
    (720, "12 GPU-min", "12 GPU-min"), (4500, "1,25 GPU-h", "1.25 GPU-h"), (360000, "100 GPU-h", "100 GPU-h"),
    (None, "—", "—")], ids=str)
def test_gpu_time_picks_the_unit_that_reads_best(seconds, pt, en):
    assert fmt.gpu_time(seconds, "pt-BR") == pt
    assert fmt.gpu_time(seconds, "en") == en


def test_moments_are_shown_in_utc_per_locale():
    moment = datetime(2026, 12, 1, 10, 30, 5, tzinfo=UTC)
    assert fmt.timestamp(moment, "pt-BR") == "01/12/2026 10:30:05 UTC"
    assert fmt.timestamp("2026-12-01T10:30:05Z", "en") == "2026-12-01 10:30:05 UTC"
    assert fmt.timestamp("not a time", "en") == "—"
    assert fmt.age("2026-12-01T10:27:45+00:00", moment, "en") == "2 min 20 s"


def test_ratio_and_percent():
    assert fmt.ratio(50, 200) == 0.25
    assert fmt.ratio(300, 200) == 1.0 and fmt.ratio(None, 200) == 0.0 and fmt.ratio(5, 0) == 0.0
    assert fmt.percent(1, 3, "pt-BR") == "33,3 %"
    assert fmt.percent(1, 8, "en") == "12.5 %"
    assert fmt.percent(None, 3, "en") == "—"
