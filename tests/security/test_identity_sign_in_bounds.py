"""Issue 30 follow-up, on the real servers (two gateway replicas on one PostgreSQL, a real OpenID Provider): an
unauthenticated client cannot make the gateway store pending sign-ins without limit. Each source address gets
its allowance of starts per replica, then 429 with Retry-After; the installation holds at most its cap of pending
sign-ins, shared by the replicas through the database, then 429 until the oldest expires. Both refusals are
audited, and a refused start stores nothing.
"""

from __future__ import annotations

import httpx
import pytest

from tests.security.identity_stack import identity_stack

pytestmark = pytest.mark.security

START = "/signin/oidc/hospital"


async def _pending(s) -> int:
    return await s.db.fetchval("SELECT count(*) FROM gateway.oidc_logins WHERE expires_at > now()")


async def test_sign_in_starts_are_bounded_per_source_and_for_the_installation(env, tmp_path):
    async with identity_stack(env, tmp_path / "s", oidc_starts_per_source=4, oidc_pending_max=5) as s:
        one, two = (httpx.AsyncClient(base_url=u, timeout=30, follow_redirects=False) for u in s.urls)
        async with one, two:
            # One source on replica one: four starts, each a redirect to the provider with a row behind it.
            for _ in range(4):
                r = await one.get(START)
                assert r.status_code == 303 and r.headers["location"].startswith(s.provider.issuer), r.text
            assert await _pending(s) == 4
            over = await one.get(START)
            assert over.status_code == 429, over.text
            assert 1 <= int(over.headers["Retry-After"]) <= 62 and "started from this source" in over.text
            again = await one.get(START)  # still blocked: refused before anything is counted or stored
            assert again.status_code == 429 and "Retry-After" in again.headers
            assert await _pending(s) == 4
            await s.audited("sign_in", '"failure": "sign_in_starts"', '"starts_from_source": 5', outcome="refused")
            # Replica two counts its own starts but shares the database's cap of five pending sign-ins.
            assert (await two.get(START)).status_code == 303
            full = await two.get(START)
            assert full.status_code == 429, full.text
            assert "too many sign-ins in progress (5 of at most 5)" in full.text
            assert 500 <= int(full.headers["Retry-After"]) <= 602  # until the oldest of the five expires (10 min)
            assert await _pending(s) == 5
            await s.audited("sign_in", '"failure": "sign_in_pending_full"', '"cap": 5', outcome="refused")
            # A pending sign-in finished or expired frees a place: expire the oldest two (as 10 minutes would).
            await s.db.execute("UPDATE gateway.oidc_logins SET expires_at = now() - interval '1 second' WHERE state"
                               " IN (SELECT state FROM gateway.oidc_logins ORDER BY created_at LIMIT 2)")
            freed = await two.get(START)
            assert freed.status_code == 303, freed.text
            assert await _pending(s) == 4
