"""A payload as PostgreSQL's ``jsonb`` gives it back, computed here instead of asked of the database.

The hash of a row is computed when it is written and recomputed by ``verify`` from the stored row, so it must be
taken over the payload as ``jsonb`` returns it. Sent as ``json.dumps`` text, the only things ``jsonb`` changes
that survive a ``json.loads`` are numbers and keys:
- a float whose ``repr`` has a positive exponent (``1e+16``) comes back as the integer it spells
  (``10000000000000000``): ``numeric`` prints it without an exponent or a decimal point;
- a negative zero comes back as ``0.0`` (``numeric`` has no negative zero);
- every other float comes back equal (``numeric`` keeps its decimal digits exactly, a smaller exponent
  included: ``1e-05`` comes back as ``0.00001``, which parses to the same float);
- keys come back as strings (``json.dumps`` already wrote them so) and tuples as lists; key order and
  whitespace differ, which the canonical text (sorted keys, no whitespace) does not see.
Strings come back unchanged. ``tests/integration/test_audit_jsonb_normal.py`` holds this to PostgreSQL's own
answer for generated values.

Pure: no database.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

# The canonical JSON text (the row hash's, services/audit/domain/chain.py): keys sorted, no whitespace, UTF-8.
canonical_text = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                  allow_nan=False).encode


def stored_float(value: float) -> float | int:
    """What ``jsonb`` gives back for a finite float that ``json.dumps`` wrote (as its ``repr``)."""
    token = repr(value)
    if "e+" in token:
        return int(Decimal(token))
    return 0.0 if value == 0 else value


def _number(token: str) -> float | int:
    return stored_float(float(token))


def normal(payload: Any) -> tuple[Any, str]:
    """(the payload as ``jsonb`` gives it back, its canonical text). Raises ``ValueError`` (NaN, infinities) or
    ``TypeError`` (not JSON) as ``json.dumps`` does: such a payload cannot be stored either. A payload parsed by
    ``entries.parse_payload`` is already what this returns (``Entry.payload_normal``)."""
    value = json.loads(json.dumps(payload, allow_nan=False), parse_float=_number)
    return value, canonical_text(value)
