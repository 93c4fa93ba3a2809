"""Numbers, dates, durations and GPU time as a person reads them, per locale. Pure functions.

pt-BR groups thousands with "." and writes decimals with ","; English the other way round. Durations keep the
two largest units ("3 min 20 s", "2 h 5 min", "1 d 4 h"); GPU time picks GPU-h, GPU-min or GPU-s so the number
stays readable ("1,25 GPU-h", "12 GPU-min", "45 GPU-s").
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

_SEPARATORS = {"pt-BR": (".", ","), "en": (",", ".")}
_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def number(value: float | int | None, locale: str, decimals: int = 0) -> str:
    """``1234.5`` -> ``1.234,5`` (pt-BR) / ``1,234.5`` (en); None or not finite -> an em dash."""
    if value is None or not math.isfinite(float(value)):
        return "—"
    group, point = _SEPARATORS.get(locale, _SEPARATORS["en"])
    text = f"{float(value):,.{decimals}f}"
    return text.replace(",", "\0").replace(".", point).replace("\0", group)


def compact(value: float, locale: str) -> str:
    """A number with as many decimals as help: 2 under 10, 1 under 100, none above."""
    magnitude = abs(value)
    decimals = 2 if magnitude < 10 else 1 if magnitude < 100 else 0
    text = number(value, locale, decimals)
    point = _SEPARATORS.get(locale, _SEPARATORS["en"])[1]
    if point in text:
        text = text.rstrip("0").rstrip(point)
    return text


def duration(seconds: float | None, locale: str) -> str:
    """Human duration with the two largest units: ``200`` -> ``3 min 20 s``; under 10 s one decimal; under a
    second (what one decimal would round to 0.x or 0) milliseconds: a step time of 0.04 s is ``40 ms``, not ``0 s``."""
    if seconds is None or not math.isfinite(float(seconds)):
        return "—"
    seconds = max(float(seconds), 0.0)
    if 0 < seconds < 0.95:
        millis = round(seconds * 1000)
        return f"{compact(millis, locale)} ms" if millis >= 1 else "< 1 ms"
    if seconds < 10:
        return f"{compact(round(seconds, 1), locale)} s"
    whole = int(round(seconds))
    amounts = []
    for unit, size in _UNITS:
        amount, whole = divmod(whole, size)
        amounts.append((unit, amount))
    first = next(i for i, (_, amount) in enumerate(amounts) if amount)
    shown = [f"{amount} {unit}" for unit, amount in amounts[first:first + 2] if amount]
    return " ".join(shown)


def gpu_time(seconds: float | None, locale: str) -> str:
    """GPU-seconds in the unit that reads best: under a minute GPU-s, under an hour GPU-min, else GPU-h."""
    if seconds is None or not math.isfinite(float(seconds)):
        return "—"
    value = float(seconds)
    if abs(value) < 60:
        return f"{compact(value, locale)} GPU-s"
    if abs(value) < 3600:
        return f"{compact(value / 60, locale)} GPU-min"
    return f"{compact(value / 3600, locale)} GPU-h"


def significant(value: float | int | None, locale: str, digits: int = 4) -> str:
    """A measured figure with ``digits`` significant digits, in the locale's decimal point: a loss ``0.6931``
    (``0,6931`` in pt-BR), a learning rate ``0.0002`` or ``5e-06``."""
    if value is None or isinstance(value, bool) or not math.isfinite(float(value)):
        return "—"
    point = _SEPARATORS.get(locale, _SEPARATORS["en"])[1]
    return f"{float(value):.{digits}g}".replace(".", point)


def size(value: float | int | None, locale: str) -> str:
    """Bytes in the binary unit that reads best: ``512 B``, ``1,5 KiB`` (pt-BR) / ``1.5 KiB`` (en), MiB, GiB, TiB."""
    if value is None or isinstance(value, bool) or not math.isfinite(float(value)):
        return "—"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(amount) < 1024:
            return f"{compact(amount, locale) if unit != 'B' else number(amount, locale)} {unit}"
        amount /= 1024
    return f"{compact(amount, locale)} TiB"


def parse_time(value: datetime | str | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def timestamp(value: datetime | str | None, locale: str) -> str:
    """A moment in UTC: ``01/12/2026 10:30:05 UTC`` (pt-BR), ``2026-12-01 10:30:05 UTC`` (en)."""
    moment = parse_time(value)
    if moment is None:
        return "—"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    pattern = "%d/%m/%Y %H:%M:%S UTC" if locale == "pt-BR" else "%Y-%m-%d %H:%M:%S UTC"
    return moment.strftime(pattern)


def age(value: datetime | str | None, now: datetime, locale: str) -> str:
    """How long ago, as a duration (``3 min 20 s``)."""
    moment = parse_time(value)
    if moment is None:
        return "—"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return duration((now - moment).total_seconds(), locale)


def percent(part: float | None, whole: float | None, locale: str) -> str:
    if part is None or not whole:
        return "—"
    return f"{compact(100.0 * float(part) / float(whole), locale)} %"


def ratio(part: float | None, whole: float | None) -> float:
    """``part / whole`` clamped to [0, 1] (a bar's fill); 0 when unknown."""
    if part is None or not whole or not math.isfinite(float(part)) or float(whole) <= 0:
        return 0.0
    return min(max(float(part) / float(whole), 0.0), 1.0)
