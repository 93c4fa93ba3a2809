"""The audit's compiled path (services/audit/domain/compiled.py, entries.read_payload) gives exactly what the
definition gives: the value of ``parse_payload_json`` and the bytes of ``jsonb.canonical_text`` of it, for any
JSON (floats at every edge of the exponent and of jsonb's rule, integers beyond 64 bits, negative zero,
non-ASCII, control characters, duplicate keys, deep nesting) and any mangled text; and where it could differ it
steps aside (None) instead of guessing."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.audit.domain import compiled, entries
from services.audit.domain.jsonb import canonical_text

pytestmark = pytest.mark.unit

_EDGE_FLOATS = [1e-4, 9.999999999999999e-05, 0.00012, 1e-5, 1.5e-7, 5e-324, -1e-300, 1e16, 9999999999999998.0,
                1.0000000000000002e16, 1e22, 123456789012345.6, -0.0, 0.0, 1.0, -2.5, 0.1, 2.0 ** 63, 1.7e308]
_EDGE_INTS = [0, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 63, 2 ** 64 - 1, 2 ** 64, -2 ** 63 - 1, 10 ** 30, -10 ** 40]
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=10)  # controls, quotes, U+2028, emoji
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(_EDGE_INTS),
                     st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(_EDGE_FLOATS), _text,
                     st.sampled_from(["fine-tune", "1e-5", "x:0.00001", "-0.0", "é", "\x7f", "\u2028"]))
_json = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(_text, kids, max_size=4)), max_leaves=24)


def _definition(data: bytes):
    payload, ok = entries.parse_payload_json(data)
    return payload, ok, entries._encoded(payload)


def _same(got, want) -> None:
    """Equal values of the same types throughout (1 == 1.0 == True in Python), and the same text."""
    assert got[1:] == want[1:]
    assert json.dumps(got[0]) == json.dumps(want[0])
    assert repr(got[0]) == repr(want[0])


@settings(max_examples=800, deadline=None)
@given(_json, st.booleans())
def test_the_compiled_path_gives_the_definitions_value_and_bytes(value, ascii_only):
    data = json.dumps(value, ensure_ascii=ascii_only).encode()
    _same(entries.read_payload(data), _definition(data))


@settings(max_examples=800, deadline=None)
@given(st.dictionaries(_text, _json, max_size=6))
def test_an_object_as_the_gateway_writes_it_takes_the_compiled_path_when_it_can(value):
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    found = compiled.parse_canonical(data)
    if found is not None and not any(marker in data for marker in entries._NEEDS_DEFINITION):
        assert found[1] == canonical_text(found[0]) == _definition(data)[2]
        assert repr(found[0]) == repr(_definition(data)[0])


def _float_text(value: float) -> list[bytes]:
    return [repr(value).encode(), f"{value:.17e}".encode(), f"{value:.20f}".encode() if abs(value) < 1e30 else b"0"]


def test_every_kind_of_float_is_taken_only_where_it_prints_the_same_and_jsonb_keeps_it():
    rng = random.Random(12)
    values = list(_EDGE_FLOATS)
    for _ in range(8000):
        values.append(struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0])
        values.append(rng.uniform(-1, 1) * 10.0 ** rng.randint(-8, 18))
    taken = 0
    for value in values:
        if not math.isfinite(value):
            continue
        for token in _float_text(value):
            data = b'{"x":[' + token + b"]}"
            found = compiled.parse_canonical(data)
            _same(entries.read_payload(data), _definition(data))
            if found is not None:
                taken += 1
                assert found[1] == _definition(data)[2]
    assert taken > 5000  # the usual floats do take the compiled path


@pytest.mark.parametrize("data", [
    b'{"a": 1e-05}', b'{"a": 0.00001}', b'{"a": 1e16}', b"10000000000000000.0", b'{"a": -0.0}', b"[-0e0]",
    b'{"a": 18446744073709551616}', b'{"a": -9223372036854775809}', b"123456789012345678901234567890",
    b'{"a": 1e999}', b'{"a": NaN}', b"[Infinity]", b"\xef\xbb\xbf{}", b'{"a": "\xff"}', b'{"a": "\x01"}',
    b'{"a": "\xed\xa0\x80"}', b"[" * 300 + b"]" * 300, b'{"a": 1}x', b"", b"{", b"1" * 5000])
def test_where_orjson_differs_or_refuses_the_compiled_path_steps_aside(data):
    assert compiled.parse_canonical(data) is None
    _same(entries.read_payload(data), _definition(data))


@pytest.mark.parametrize("data", [
    b'{"a":1,"a":2}', b'{"b":{"y":1,"x":0.5},"a":[true,null,"\xc3\xa9"]}', b'  [1, 2.5, -3]\r\n', b"-0", b"0e0",
    b'"fine-tune 1e-5 -0.0"', b'{"n": 9999999999999998.0, "m": 0.0001, "k": 9223372036854775807}',
    '{"k": "한 \u2028 😀"}'.encode(), b'{"c": "\\"\\\\\\/\\b\\f\\n\\r\\t"}'])
def test_ordinary_texts_take_the_compiled_path_with_the_definitions_bytes(data):
    found = compiled.parse_canonical(data)
    assert found is not None
    _same((found[0], True, found[1]), _definition(data))


_pieces = st.sampled_from([b"{", b"}", b"[", b"]", b",", b":", b'"a"', b'"b"', b"1", b"-0", b"0.5", b"1e5",
                           b"1e-7", b"2e16", b"true", b"null", b" ", b"\t", b"\n", b"\x0c", b"\xa0", b'"\\u0000"',
                           b'"\\ud800"', b'"secret"', b"NaN", b"\x00", b"\xed\x9f\xbf", b"\xff", b'"\xc3\xa9"',
                           b"99999999999999999999"])


@settings(max_examples=800, deadline=None)
@given(st.lists(_pieces, max_size=16))
def test_any_mangled_text_reads_as_the_definition_reads_it(pieces):
    data = b"".join(pieces)
    _same(entries.read_payload(data), _definition(data))


def test_a_secret_or_an_escape_is_left_to_the_definition_which_redacts_and_cleans():
    for data in (b'{"env": {"secret": "hunter2"}}', b'{"env": {"\\u0073ecret": "hunter2"}}',
                 b'{"name": "a\\u0000b"}'):
        payload, ok, text = entries.read_payload(data)
        assert ok and "hunter2" not in text and "\x00" not in text
        _same((payload, ok, text), _definition(data))


def test_the_spelled_out_scans_are_the_marker_lists(monkeypatch):
    for marker in compiled._UNSURE:
        assert compiled._unsure(b"x" + marker + b"y") and not compiled._unsure(marker[:-1] + b"x" + marker[-1:])
    taken = []
    monkeypatch.setattr(compiled, "parse_canonical", lambda data: taken.append(data))
    for marker in entries._NEEDS_DEFINITION:
        entries.read_payload(b'{"k": "x' + marker + b'0041"}')
    assert taken == []
    entries.read_payload(b'{"k": "x"}')
    assert taken == [b'{"k": "x"}']
