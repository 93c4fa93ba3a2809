"""The audit row's canonical text, written field by field (services/audit/domain/chain.py), is byte for byte the
``json.dumps`` of the whole row it was defined as, so every chain written before still verifies; and a payload's
canonical text passed in gives the same bytes as the payload encoded there."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.audit import store
from services.audit.domain import anchoring, chain
from services.audit.domain.entries import Entry, Outcome
from services.audit.domain.jsonb import canonical_text

pytestmark = __import__("pytest").mark.unit


def _reference(fields) -> bytes:
    """The definition: the hashed fields, times in UTC with microseconds, one sorted compact UTF-8 dump."""
    def plain(v):
        if isinstance(v, datetime):
            v = v if v.tzinfo else v.replace(tzinfo=UTC)
            return v.astimezone(UTC).isoformat(timespec="microseconds")
        return v
    body = {name: plain(fields.get(name)) for name in chain.HASHED_FIELDS}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


_text = st.text(max_size=12)  # any code point but lone surrogates: quotes, backslashes, controls, U+2028, emoji
_times = st.datetimes(timezones=st.sampled_from([None, UTC, timezone(timedelta(hours=-7, minutes=-30))]))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                     _text)
_json = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(_text, kids, max_size=4)), max_leaves=20)
_fields = st.fixed_dictionaries({
    "seq": st.one_of(st.integers(min_value=1), st.booleans()), "command_id": _text,
    "actor": st.one_of(st.none(), _text), "time": _times, "recorded_at": st.one_of(_times, _text),
    "subject": st.one_of(_text, st.sampled_from(list(Outcome))), "kind": st.one_of(st.none(), _text),
    "job_id": st.one_of(st.none(), _text), "payload": _json,
    "outcome": st.one_of(_text, st.sampled_from(list(Outcome))),
    "reason": st.one_of(st.none(), _text, st.floats(allow_nan=False, allow_infinity=False)),
})


@settings(max_examples=500, deadline=None)
@given(_fields)
def test_the_canonical_text_is_the_whole_row_dumped_at_once(fields):
    assert chain.canonical(fields) == _reference(fields)
    assert chain.canonical(fields, canonical_text(fields["payload"])) == _reference(fields)


def test_a_known_row_hashes_as_it_always_did():
    row = {"seq": 7, "command_id": "c1", "actor": "\u00e9ve", "time": datetime(2026, 1, 1, 12, tzinfo=UTC),
           "recorded_at": datetime(2026, 1, 1, 13, 0, 0, 5, tzinfo=timezone(timedelta(hours=1))),
           "subject": "teto.cmd.submit", "kind": "submit", "job_id": None, "outcome": Outcome.RECEIVED,
           "payload": {"b": [1, 2.5, None, True], "a": "x\"\n"}, "reason": None}
    assert chain.canonical(row) == (
        '{"actor":"\u00e9ve","command_id":"c1","job_id":null,"kind":"submit","outcome":"received",'
        '"payload":{"a":"x\\"\\n","b":[1,2.5,null,true]},"reason":null,"recorded_at":"2026-01-01T12:00:00.000005'
        '+00:00","seq":7,"subject":"teto.cmd.submit","time":"2026-01-01T12:00:00.000000+00:00"}').encode()
    assert chain.row_hash(chain.GENESIS, row) == chain.row_hash(chain.GENESIS, row, canonical_text(row["payload"]))


# The fields as the store writes them (strings, 64-bit ints, None, times, or a time as its canonical text) with
# the payload's text given; any code point but a lone surrogate, controls, quotes and backslashes included.
_any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_store_fields = st.fixed_dictionaries({
    "seq": st.integers(min_value=1, max_value=2 ** 63 - 1), "command_id": _any_text,
    "actor": st.one_of(st.none(), _any_text), "time": _times, "recorded_at": _times, "subject": _any_text,
    "kind": st.one_of(st.none(), _any_text), "job_id": st.one_of(st.none(), _any_text), "payload": _json,
    "outcome": st.sampled_from([str(o) for o in Outcome]), "reason": st.one_of(st.none(), _any_text),
})


@settings(max_examples=1000, deadline=None)
@given(_store_fields, st.booleans())
def test_a_row_as_the_store_writes_it_has_the_same_bytes(fields, extra_keys):
    text = canonical_text(fields["payload"])
    if extra_keys:  # as verify passes rows: their stored hashes along
        fields = {**fields, "prev_hash": "0" * 64, "hash": "1" * 64}
    # The store gives the batch's recorded_at, and a time the message wrote in the canonical form, as text.
    as_text = {**fields, "time": chain.utc_text(fields["time"]), "recorded_at": chain.utc_text(fields["recorded_at"])}
    assert chain.canonical(fields, text) == _reference(fields) == chain.canonical(as_text, text)


def test_fields_of_other_types_are_written_as_the_encoder_writes_them():
    row = {"seq": 2 ** 70, "command_id": "c", "actor": None, "time": datetime(2026, 1, 1, tzinfo=UTC),
           "recorded_at": "2026-01-01", "subject": Outcome.RECEIVED, "kind": None, "job_id": None, "payload": [1],
           "outcome": "received", "reason": 1e-05}
    for change in ({}, {"seq": 1}, {"seq": True}, {"seq": 1, "subject": "s"}, {"seq": 1, "subject": "s", "reason": True},
                   {"outcome": Outcome.ACCEPTED, "kind": 3, "job_id": [1, "x"], "actor": {"b": 1, "a": None}}):
        fields = {**row, **change}
        assert chain.canonical(fields, "[1]") == _reference(fields)


def test_the_stores_copy_rows_carry_the_hashes_chain_gives():
    """store._linked (the rows of one COPY, built and hashed as asyncpg asks for them) links as chain.chain does:
    only the fresh entries, in the plan's sequence order, an outcome naming no actor given its command's."""
    now, key = datetime(2026, 1, 2, tzinfo=UTC), b"k" * 32
    entries = [Entry(command_id=f"c{i}", actor=None if i == 3 else "alice", time=datetime(2026, 1, 1, tzinfo=UTC),
                     subject="s", kind="k", job_id=None, payload={"n": i}, outcome=Outcome.RECEIVED, reason=None)
               for i in range(5)]
    payloads = [(e.payload, canonical_text(e.payload)) for e in entries]
    fresh, seqs = [1, 2, 4, 5], [11, 12, 13, 14]  # the third entry was stored already
    rows = list(store._linked(entries, payloads, fresh, seqs, {"c3": "bob"}, "a" * 64, now, key))
    expected = chain.chain([{"seq": seq, "command_id": e.command_id, "actor": e.actor or "bob", "time": e.time,
                             "recorded_at": now, "subject": "s", "kind": "k", "job_id": None, "payload": e.payload,
                             "outcome": "received", "reason": None}
                            for seq, e in zip(seqs, [entries[i - 1] for i in fresh], strict=True)], "a" * 64)
    assert [r[0] for r in rows] == seqs and [r[2] for r in rows] == ["alice", "alice", "bob", "alice"]
    assert [(r[11], r[12]) for r in rows] == [(x["prev_hash"], x["hash"]) for x in expected]
    assert [r[13] for r in rows] == [anchoring.row_mac(key, x["hash"]) for x in expected]
    assert [r[8] for r in rows] == [payloads[i - 1][1] for i in fresh]
    with pytest.raises(ValueError):  # a sequence number for every fresh entry
        list(store._linked(entries, payloads, fresh, seqs[:-1], {}, "a" * 64, now, key))


def test_a_lone_surrogate_in_a_field_still_fails_as_utf8_would():
    row = {"seq": 1, "command_id": "c\ud800", "actor": None, "time": None, "recorded_at": None, "subject": "s",
           "kind": None, "job_id": None, "payload": None, "outcome": "received", "reason": None}
    with pytest.raises(UnicodeEncodeError):
        chain.canonical(row, "null")
