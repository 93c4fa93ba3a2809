"""A payload as PostgreSQL's jsonb gives it back, computed without asking it (services/audit/domain/jsonb.py), and
every payload the audit parses from a message is already in that form, so the store hashes it as it is.
(tests/integration/test_audit_jsonb_normal.py holds the rule to PostgreSQL's own answer.)"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.audit.domain import entries, jsonb
from services.audit.domain.jsonb import canonical_text

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("value", "stored"), [
    (1e16, 10**16), (-1e16, -10**16), (1.2345e20, 123450000000000000000),
    (1.7976931348623157e308, int("17976931348623157" + "0" * 292)),
    (3600.0, 3600.0), (0.003, 0.003), (1e-05, 1e-05), (5e-324, 5e-324), (1e15, 1e15), (0.0, 0.0),
], ids=str)
def test_a_float_comes_back_as_numeric_prints_it(value, stored):
    got = jsonb.stored_float(value)
    assert type(got) is type(stored) and got == stored  # noqa: E721 - int against float is the point


def test_a_negative_zero_comes_back_positive():
    assert math.copysign(1, jsonb.stored_float(-0.0)) == 1
    assert jsonb.normal({"z": -0.0}) == ({"z": 0.0}, '{"z":0.0}')


def test_keys_become_strings_tuples_lists_and_the_text_is_canonical():
    value, text = jsonb.normal({"b": (1, 2.5e20), 3: {"é": None}, "a": True})
    assert value == {"b": [1, 250000000000000000000], "3": {"é": None}, "a": True}
    assert text == '{"3":{"é":null},"a":true,"b":[1,250000000000000000000]}'


@pytest.mark.parametrize("payload", [{"loss": math.nan}, [math.inf], {"when": object()}], ids=["nan", "inf", "obj"])
def test_what_cannot_be_stored_raises_as_json_does(payload):
    with pytest.raises((ValueError, TypeError)):
        jsonb.normal(payload)


_floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([1e16, 1e22, -0.0, 1.5e-7, 2.5e300, 123456789.5]))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), _floats, st.text(max_size=8))
_json = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_normal_is_a_fixed_point(value):
    once, text = jsonb.normal(value)
    assert jsonb.normal(once)[1] == text == canonical_text(once)


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans(), st.sampled_from(["secret", "value"]))
def test_every_parsed_payload_is_already_normal(value, ascii_only, key):
    # Both parse paths: plain JSON, and JSON with a marker (a "secret" key, a \u escape) that takes the full walk.
    for data in (json.dumps(value, ensure_ascii=ascii_only), json.dumps({key: value, "é": 1}, ensure_ascii=True)):
        payload, ok = entries.parse_payload(data.encode())
        assert ok and jsonb.normal(payload)[1] == canonical_text(payload)


def test_entries_made_from_messages_say_their_payload_is_normal():
    now = datetime(2026, 12, 1, tzinfo=UTC)
    made = [entries.from_command("t.cmd.submit", b'{"n": 1e16}', "CMD-1", now),
            entries.from_outcome("t.outcome.x", b"not json", "OUT-1", now),
            entries.from_rejected("t.rejected.q", b"{}", "REJ-1", now)]
    assert all(e.payload_normal for e in made)
    assert made[0].payload == {"n": 10**16}
