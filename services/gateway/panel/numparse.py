"""A number as a person typed it in the panel, read in the page's locale. Pure.

pt-BR writes ``1.234,5`` (``.`` groups thousands, ``,`` is the decimal point); English ``1,234.5``. A typed number
is read with its page's convention and nothing else: anything that convention cannot read exactly once is refused
with the reason, never guessed. So in pt-BR ``100,5`` is 100.5 and ``1.000`` is 1000, while ``1.5`` (a thousands
separator not followed by three digits: an English decimal, or a mistyped thousand?) is refused; in English
``1,000`` is 1000, ``100.5`` is 100.5 and ``100,5`` is refused. The panel's requeue form posts the text as typed and
the gateway reads it here (pages/job.py); the page's script (static/job.js ``parseNumber``) follows the same rule
only to say as you type what the server will answer, and tests/unit/test_panel_numparse.py runs one table of cases
against both.

Refusal codes (the catalogue's ``common.number_<code>`` words them, with ``{text}``, ``{group}``, ``{point}``):
- ``empty``: nothing typed;
- ``not_a_number``: a character that is neither a digit, a sign nor one of the two separators (letters, spaces,
  an exponent, a second sign);
- ``misplaced_separator``: a separator first or last, or two side by side;
- ``several_points``: more than one decimal point;
- ``group_after_point``: a thousands separator after the decimal point (``1,00.0`` in English);
- ``bad_grouping``: thousands separators not every three digits (``12.34.567``, ``1234.567`` in pt-BR);
- ``other_convention``: only readable with the other locale's separators (``1.5`` or ``100.25`` in pt-BR,
  ``100,5`` in English): said with the page's way of writing it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .fmt import number

SEPARATORS = {"pt-BR": (".", ","), "en": (",", ".")}  # (thousands, decimal point), as fmt.py writes them
MAX_CHARS = 40
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Reading:
    """What was typed, read: ``value`` when readable, else ``problem`` (a refusal code above) and, for
    ``other_convention`` and ``ambiguous``, what the other convention would read (``other``) and, for ``ambiguous``,
    what the page's own would (``mine``)."""
    value: float | None
    problem: str | None = None
    other: float | None = None
    mine: float | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def separators(locale: str) -> tuple[str, str]:
    return SEPARATORS.get(locale, SEPARATORS["en"])


def _read(text: str, group: str, point: str) -> tuple[float | None, str | None]:
    """``text`` (no sign, stripped) under one convention: (value, None) or (None, problem)."""
    if any(ch not in "0123456789" + group + point for ch in text):
        return None, "not_a_number"
    if text[0] in (group, point) or text[-1] in (group, point) or re.search(r"[^0-9][^0-9]", text):
        return None, "misplaced_separator"
    if text.count(point) > 1:
        return None, "several_points"
    whole, _, fraction = text.partition(point)
    if group in fraction:
        return None, "group_after_point"
    if group in whole:
        parts = whole.split(group)
        if len(parts[0]) > 3 or parts[0].startswith("0") or any(len(part) != 3 for part in parts[1:]):
            return None, "bad_grouping"
    return float(whole.replace(group, "") + ("." + fraction if fraction else "")), None


def parse_number(typed: str | None, locale: str) -> Reading:
    """The number ``typed`` means in ``locale`` (``pt-BR`` or ``en``; another locale reads as English), or why it
    cannot be read. A leading ``-`` or ``+`` is a sign (whether a negative number makes sense is the form's rule)."""
    text = (typed or "").strip()
    if not text:
        return Reading(None, "empty")
    if len(text) > MAX_CHARS:
        return Reading(None, "not_a_number")
    sign = -1.0 if text[0] == "-" else 1.0
    body = text[1:] if text[0] in "+-" else text
    if not body or not _DIGITS.search(body):
        return Reading(None, "not_a_number")
    group, point = separators(locale)
    value, problem = _read(body, group, point)
    other, other_problem = _read(body, point, group)
    other_value = None if other is None else sign * other + 0.0
    if problem is None:
        whole, _, fraction = body.partition(point)
        if group not in body and len(fraction) == 3 and other_problem is None:
            # "1,000" in pt-BR: 1, or 1000 written the English way?
            return Reading(None, "ambiguous", other_value, sign * value + 0.0)
        return Reading(sign * value + 0.0)
    if problem != "not_a_number" and other_problem is None:
        return Reading(None, "other_convention", other_value)
    return Reading(None, problem)


def written(value: float | None, locale: str) -> str:
    """``value`` as the page's locale writes it, with the decimals it has (up to 6): how to type it unambiguously
    there (``1000`` -> ``1.000`` in pt-BR, ``1,000`` in English; ``2.5`` -> ``2,5`` / ``2.5``)."""
    text = number(value, locale, 6)
    point = separators(locale)[1]
    return text.rstrip("0").rstrip(point) if point in text else text
