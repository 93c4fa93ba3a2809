"""The audit reader's two shortcuts (services/audit/domain/entries.py): the fields of a payload orjson parsed are
taken without ``clean`` (which must then have nothing to do), and the fallback name of a message (its stream and
sequence, read from the ack subject) is only worked out for a message without a usable command id; a time the
message wrote in the chain's own form (but for "Z") is kept as its text, which the chain hashes as it is."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from services.audit.domain import chain, entries
from services.audit.domain.entries import clean, from_command, from_outcome, from_rejected

pytestmark = __import__("pytest").mark.unit

NOW = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)
# Text with what ``clean`` replaces (NUL, lone surrogates) next to what it keeps (other controls, non-ASCII).
_text = st.text(alphabet=st.sampled_from(["a", "é", "한", "\x00", "\x01", "\n", "\ud800", "\udfff", '"', "\\", "😀"]),
                max_size=10)
_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), _text),
                     lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(_text, kids, max_size=3)),
                     max_leaves=12)


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)


def _encodings(value) -> list[bytes]:
    """The value as JSON text: all escaped; with NUL, U+0001 and U+D800 written as raw bytes instead (invalid
    JSON or invalid UTF-8, which orjson refuses); with non-ASCII raw (a lone surrogate as its raw bytes)."""
    escaped = json.dumps(value).encode()
    raw = escaped.replace(b"\\u0000", b"\x00").replace(b"\\u0001", b"\x01").replace(b"\\ud800", b"\xed\xa0\x80")
    return [escaped, raw, json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")]


@settings(max_examples=300, deadline=None)
@given(_json)
def test_a_value_said_to_need_no_cleaning_has_no_string_that_clean_would_change(value):
    for data in _encodings({"command_id": "c1", "payload": value}):
        payload, ok, _text_, cleaned = entries._read(data)
        if cleaned:
            assert ok and all(clean(s) == s for s in _strings(payload))


def test_raw_nuls_controls_and_surrogates_are_never_said_to_need_no_cleaning():
    for data in (b'{"a": "x\x00y"}', b'{"a": "x\x01y"}', b'{"a": "\xed\xa0\x80"}', b'{"\xed\xbf\xbf": 1}',
                 b'{"a": "x\\u0000y"}', b'{"a": "\\ud800"}'):
        assert entries._read(data)[3] is False, data
    assert entries._read('{"a": "é한\\n\\""}'.encode())[3] is True


def test_strings_clean_would_change_are_cleaned_in_every_field_the_entry_takes():
    for raw in (b'{"command_id": "c1", "actor": "a\\u0000b", "job_id": "j\\ud800", "issued_at": "x"}',
                b'{"command_id": "c1", "actor": "a\xed\xa0\x80b", "job_id": "j"}'):
        entry = from_command("t.cmd.submit", raw, "CMD-1", NOW)
        assert "\x00" not in entry.actor and "\ud800" not in (entry.actor + entry.job_id)
    plain = from_command("t.cmd.submit", b'{"command_id": "c1", "actor": "alice", "job_id": "j1"}', "CMD-1", NOW)
    assert (plain.command_id, plain.actor, plain.job_id) == ("c1", "alice", "j1")


class Counted:
    def __init__(self, name: str) -> None:
        self.name, self.asked = name, 0

    def __call__(self) -> str:
        self.asked += 1
        return self.name


def test_the_fallback_name_is_worked_out_only_for_a_message_without_a_usable_id():
    named = Counted("CMD-9")
    assert from_command("t.cmd.submit", b'{"command_id": "c1"}', named, NOW).command_id == "c1"
    assert from_outcome("t.outcome.submit", b'{"command_id": "c1", "accepted": true}', named, NOW).command_id == "c1"
    assert from_rejected("t.rejected.queue", b'{"id": "r1", "subject": "t.cmd.x"}', named, NOW).command_id == "r1"
    assert named.asked == 0
    assert from_command("t.cmd.submit", b'not json', named, NOW).command_id == "CMD-9"
    assert from_command("t.cmd.submit", b'{"command_id": "has space"}', named, NOW).command_id == "CMD-9"
    assert from_outcome("t.outcome.submit", b'{"accepted": "maybe"}', named, NOW).command_id == "CMD-9"
    assert from_rejected("t.rejected.queue", b'{}', named, NOW).command_id == "CMD-9"
    assert named.asked == 4
    # A plain name still works (the benchmarks and the tests pass one).
    assert from_command("t.cmd.submit", b'{}', "CMD-1", NOW).command_id == "CMD-1"


_times = st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), None]))


def _spellings(when: datetime) -> list[str]:
    return [when.isoformat(), when.isoformat(timespec="microseconds"),
            when.isoformat(timespec="microseconds").replace("+00:00", "Z"), when.isoformat(timespec="seconds"),
            when.isoformat(sep=" ", timespec="microseconds"), when.strftime("%G-W%V-%uT%H:%M:%S.%fZ"),
            when.isoformat(timespec="microseconds").replace(".", ",")]


@settings(max_examples=400, deadline=None)
@given(_times)
def test_a_time_given_as_text_is_the_text_the_chain_would_write(when):
    for raw in _spellings(when):
        data = json.dumps({"command_id": "c1", "issued_at": raw}).encode()
        entry = from_command("t.cmd.submit", data, "CMD-1", NOW)
        if entry.time_text is not None:
            assert entry.time_text == chain.utc_text(entry.time)
            assert entry.time != NOW  # parsed from the payload, not the fallback
    # The form Teto's contracts write (pydantic: UTC, microseconds, "Z") is always taken.
    if when.tzinfo is UTC:
        pydantic_form = json.dumps({"issued_at": when.isoformat(timespec="microseconds").replace("+00:00", "Z")})
        assert from_command("t.cmd.submit", pydantic_form.encode(), "CMD-1", NOW).time_text is not None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789-:T.Z+W ", min_size=20, max_size=34))
def test_no_text_that_is_not_the_chains_own_form_is_taken(raw):
    entry = from_command("t.cmd.submit", json.dumps({"issued_at": raw}).encode(), "CMD-1", NOW)
    assert entry.time_text is None or entry.time_text == chain.utc_text(entry.time)
