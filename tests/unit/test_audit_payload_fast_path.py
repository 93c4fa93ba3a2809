"""The audit's parse of a command payload: the fast path (no cleaning, no redaction walk) gives exactly what the
full walk gives, for any JSON, and never lets a secret, a NUL or a NaN through (services/audit/domain/entries.py)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.contracts.secrets import redact
from services.audit.domain.entries import clean, parse_number, parse_payload

pytestmark = __import__("pytest").mark.unit

_keys = st.one_of(st.text(max_size=8), st.sampled_from(["secret", "sealed", "value", "env", "a\x00b"]))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=12), st.sampled_from(['{"secret": "pw"}', "x\x00y", "sécret", "\u0000"]))
_json = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(_keys, kids, max_size=4)), max_leaves=20)


def _walked(data: bytes):
    return redact(clean(json.loads(data, parse_float=parse_number)))


@settings(max_examples=400, deadline=None)
@given(_json, st.booleans())
def test_the_fast_path_gives_what_the_full_walk_gives(value, ascii_only):
    data = json.dumps(value, ensure_ascii=ascii_only).encode()
    payload, ok = parse_payload(data)
    assert ok and payload == _walked(data)


def test_a_secret_spelled_with_escapes_or_in_utf16_is_still_redacted():
    for data in (b'{"env": {"\\u0073ecret": "hunter2"}}', '{"env": {"secret": "hunter2"}}'.encode("utf-16")):
        payload, ok = parse_payload(data)
        assert ok and "hunter2" not in json.dumps(payload)


def test_nul_and_nan_are_still_cleaned():
    payload, _ = parse_payload(b'{"name": "a\\u0000b", "loss": NaN}')
    assert payload == {"name": "a\ufffdb", "loss": "nan"}


def test_a_number_too_large_for_a_float_is_kept_as_text_like_the_full_walk_keeps_it():
    data = b'{"gpu_ceiling_seconds": 1e999, "small": -2.5e-3, "n": 7}'
    payload, ok = parse_payload(data)
    assert ok and payload == _walked(data) == {"gpu_ceiling_seconds": "inf", "small": -0.0025, "n": 7}
    assert json.dumps(payload, allow_nan=False)  # storable: PostgreSQL's jsonb refuses infinities


def test_a_lone_surrogate_escaped_or_raw_is_replaced_so_the_entry_can_be_stored():
    for data in (b'{"a": "\\ud800x", "\\udfff": 1}', b'{"a": "\xed\xa0\x80x", "\xed\xbf\xbf": 1}'):
        payload, ok = parse_payload(data)
        assert ok and payload == {"a": "\ufffdx", "\ufffd": 1}
        json.dumps(payload, ensure_ascii=False).encode()  # UTF-8 can hold it (PostgreSQL too)
    assert parse_payload('{"k": "한"}'.encode()) == ({"k": "한"}, True)  # starts with 0xED too: walked, unchanged
