"""The organisations as stored, read one by one: one whose stored settings the contract refuses now (a row
written before a bound existed, or by hand) is set aside with the reason, and placement goes on for the others.

A weight of 5e-324 was once accepted; dividing by it overflowed in the placement statement, and every pass of
every organisation failed (issue 26, item 4). The contract now bounds it (libs/contracts/tenancy.py), and an
organisation's bad data stays that organisation's: its jobs wait, saying why, and nobody else's do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pydantic import ValidationError

from libs.contracts.tenancy import OrgSpec

from .model import Organisation


class Organisations(dict[str, Organisation]):
    """The usable organisations by name, and ``broken``: those set aside, with why."""

    def __init__(self, usable: dict[str, Organisation] | None = None,
                 broken: dict[str, str] | None = None) -> None:
        super().__init__(usable or {})
        self.broken: dict[str, str] = dict(broken or {})


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in exc.errors()[:3])
    return str(exc)[:300]


def read(rows: Iterable[tuple[str, str]], build: Callable[[str, OrgSpec], Organisation]) -> Organisations:
    """Each stored (name, spec JSON) checked against today's contract and made an organisation by ``build``, on
    its own."""
    usable: dict[str, Organisation] = {}
    broken: dict[str, str] = {}
    for name, spec in rows:
        try:
            usable[name] = build(name, OrgSpec.model_validate_json(spec))
        except (ValidationError, ValueError) as exc:
            broken[name] = _problem(exc)
    return Organisations(usable, broken)
