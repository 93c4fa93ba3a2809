"""Each audit entry carries its payload's canonical text, taken when the message is read (the edge reads a batch
while the one before is written): it is exactly ``jsonb.canonical_text`` of the payload (what the row's hash
and the stored jsonb are made from), for commands, outcomes and refusals, JSON or not; and the object decoder
the reader uses for "{...}" bodies gives what ``json.loads`` gives (services/audit/domain/entries.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from services.audit.domain import entries, jsonb
from services.audit.domain.jsonb import canonical_text

pytestmark = __import__("pytest").mark.unit
NOW = datetime(2026, 12, 1, tzinfo=UTC)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=10))
_json = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                     max_leaves=20)
_objects = st.dictionaries(st.text(max_size=8), _json, max_size=6)
_readers = st.sampled_from([entries.from_command, entries.from_outcome, entries.from_rejected])


@settings(max_examples=300, deadline=None)
@given(_objects, _readers, st.booleans())
def test_the_payload_text_is_the_canonical_text_of_the_payload(value, read, ascii_only):
    entry = read("t.cmd.submit", json.dumps(value, ensure_ascii=ascii_only).encode(), "CMD-1", NOW)
    assert entry.payload_normal and entry.payload_text == canonical_text(entry.payload)


@settings(max_examples=300, deadline=None)
@given(_objects)
def test_an_object_body_decodes_as_json_loads_decodes_it(value):
    data = json.dumps(value, ensure_ascii=False).encode()
    assert entries._loads(data) == json.loads(data, parse_float=entries.parse_number)


def test_a_body_that_is_not_json_or_not_utf8_still_gets_its_text():
    for data in (b"\x00 not json", b'{"a": "\xff"}', b"[1, 2]", b"{"):
        entry = entries.from_command("t.cmd.submit", data, "CMD-9", NOW)
        assert entry.payload_text == canonical_text(entry.payload)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                 st.sampled_from([1e16, -1e16, 9999999999999998.0, 1e-320, -0.0, 0.0, 1.2345e20])))
def test_a_number_takes_the_short_path_only_where_jsonb_keeps_it_as_it_is(value):
    for text in (repr(value), f"{value:.17e}"):
        parsed, stored = entries.parse_number(text), jsonb.stored_float(float(text))
        assert parsed == stored and type(parsed) is type(stored) and str(parsed) == str(stored)
