"""The audit computes a payload's jsonb form itself (services/audit/domain/jsonb.py) instead of asking PostgreSQL;
here PostgreSQL answers for generated values, and the two agree. A disagreement would be a row whose hash
verify cannot recompute."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.audit.domain import jsonb

pytestmark = pytest.mark.integration

_floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([1e16, -1e16, 1e22, 1.2345e20, 1.7976931348623157e308, 5e-324, -0.0, 0.0, 1e-05,
                                     1.5e-07, 3600.0, 0.1 + 0.2, 9999999999999998.0, 1e15]))
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")  # what jsonb can hold at all
_keys = st.one_of(st.text(_chars, max_size=6), st.integers(-5, 5))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), _floats, st.text(_chars, max_size=8))
_json = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4), st.tuples(kids, kids),
                                                      st.dictionaries(_keys, kids, max_size=4)), max_leaves=16)


async def _postgres_says(url: str, values: list) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT v::jsonb::text AS p FROM unnest($1::text[]) WITH ORDINALITY AS t(v, i)"
                                " ORDER BY i", [json.dumps(v, allow_nan=False) for v in values])
    finally:
        await conn.close()
    return [jsonb.canonical_text(json.loads(r["p"])) for r in rows]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_json, min_size=20, max_size=40))
def test_the_payload_as_jsonb_gives_it_back_is_computed_exactly(env, values):
    assert [jsonb.normal(v)[1] for v in values] == asyncio.run(_postgres_says(env.database_url, values))
