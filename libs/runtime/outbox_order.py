"""Which outbox rows may be in flight together: the relay publishes a batch in waves, each sent without waiting
for acknowledgements (``jsacks``), and no wave holds two rows that must stay in order.

Rows must stay in order when they are about the same thing: the same job (``teto.job.<job>.*``,
``teto.lease.<job>.*``, ``teto.budget.<job>.*``), executor (``teto.agent.<executor>.*``) or node. A subject's
first three tokens name it (prefix, kind, id). A command's outcome (``teto.outcome.<kind>.<command>``) is the
only message about its command, so its whole subject is its key; other two-token subjects (dead letters,
rejections of one service) share one key per service.

A wave is the longest prefix of the remaining rows in which no key repeats: when every publish is acknowledged,
the server receives every row in id order, as when each acknowledgement was awaited in turn; when one fails in
the middle of a wave, no later row of its key was sent, so a job's events never overtake one another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Row = TypeVar("Row")


def order_key(subject: str) -> str:
    """The part of a subject whose messages must keep their order (see the module docstring)."""
    parts = subject.split(".", 3)
    if len(parts) == 4 and parts[1] == "outcome":
        return subject
    return ".".join(parts[:3])


def next_wave(rows: Sequence[Row], subject_of: Callable[[Row], str]) -> tuple[list[Row], list[Row]]:
    """The longest prefix of ``rows`` with no order key twice, and the rest (the first row always goes)."""
    seen: set[str] = set()
    for i, row in enumerate(rows):
        key = order_key(subject_of(row))
        if key in seen:
            return list(rows[:i]), list(rows[i:])
        seen.add(key)
    return list(rows), []


def waves(rows: Sequence[Row], subject_of: Callable[[Row], str]) -> list[list[Row]]:
    """``rows`` cut into consecutive waves (``next_wave`` until none are left)."""
    out: list[list[Row]] = []
    rest = list(rows)
    while rest:
        wave, rest = next_wave(rest, subject_of)
        out.append(wave)
    return out
