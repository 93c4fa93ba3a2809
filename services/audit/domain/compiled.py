"""A message's payload parsed and given its canonical text by a compiled JSON library (orjson), where that
provably gives what the definition gives; ``None`` everywhere else, and the caller takes the definition's path.

The definition (services/audit/domain/entries.py, ``parse_payload_json``): ``json.loads(data,
parse_float=entries.parse_number)``, then ``jsonb.canonical_text`` of the value (``json.dumps`` with sorted keys,
no whitespace, non-ASCII kept, no NaN). orjson (``loads``, then ``dumps`` with ``OPT_SORT_KEYS``) gives the same
value and the same bytes except where it is known to differ, and each of those is caught here:

- a float below 1e-4 (``repr`` writes ``1e-05``, orjson ``0.00001``): orjson writes such a float with ``e-`` or
  as ``0.0000...``;
- a float of 1e16 or more (``json`` writes ``1e+16``, and jsonb keeps the integer it spells, so the definition
  gives ``10000000000000000``): orjson writes it with ``e+``;
- an integer beyond 64 bits (``json`` keeps it, orjson parses it to a float): such a float is at least 2**63,
  written with ``e+``;
- a negative zero (jsonb keeps ``0.0``, orjson writes ``-0.0``);
- NaN, the infinities (``1e999``), invalid UTF-8, a byte-order mark, a raw control character, a lone surrogate:
  orjson refuses the text (the definition records some of them cleaned, some as raw text);
- nesting deeper than 255: orjson refuses to write it.
Any float found by the cheap scan of orjson's text (``_UNSURE``; a string containing one of these only costs a
walk) is checked in the value: every float must print without an exponent and be kept as it is by jsonb
(1e-4 <= |x| < 1e16, or a positive zero), where ``repr`` and orjson write the same digits. Strings are escaped
alike (the same short escapes, other controls as lower-case ``\\u00XX``, nothing else escaped) and keys sort
alike (UTF-8 byte order is code point order). ``tests/unit/test_audit_compiled_json.py`` holds all of this to
the definition byte for byte, for generated values, numbers at every edge and mangled texts.

The caller still routes a text that needs cleaning or redaction (a ``\\u`` escape, a secret's key) to the
definition's path first (entries.py). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

_SORTED = orjson.OPT_SORT_KEYS
# In orjson's text: an exponent, a float below 1e-4 written out, a negative zero. None of them: no float to check.
_UNSURE = (b"e+", b"e-", b"0.0000", b"-0.0")


def _unsure(text: bytes) -> bool:
    """Any of ``_UNSURE`` in ``text`` (spelled out: a generator over them costs as much as the scans; a rare
    single byte is looked for first, which is much cheaper than a two-byte needle whose first byte is common)."""
    return (b"e-" in text or (b"+" in text and b"e+" in text) or b"0.0000" in text
            or b"-0.0" in text)


def _plain_floats(value: Any) -> bool:
    """Every float in ``value`` is written by ``repr`` without an exponent and kept as it is by jsonb."""
    kind = type(value)
    if kind is float:
        return 1e-4 <= abs(value) < 1e16 or (value == 0 and str(value) == "0.0")
    if kind is dict:
        return all(map(_plain_floats, value.values()))
    if kind is list:
        return all(map(_plain_floats, value))
    return True


def parse_canonical(data: bytes) -> tuple[Any, str] | None:
    """(the JSON value, its canonical text) as ``json.loads`` with ``entries.parse_number`` and
    ``jsonb.canonical_text`` give them, or None where orjson might differ (see the module's note)."""
    try:
        value = orjson.loads(data)
        text = orjson.dumps(value, option=_SORTED)
    except (ValueError, TypeError):  # JSONDecodeError is a ValueError, JSONEncodeError a TypeError
        return None
    if _unsure(text) and not _plain_floats(value):
        return None
    return value, text.decode()
