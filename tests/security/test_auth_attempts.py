"""Attack (issue 26, item 6): guessing tokens and abusing a panel session, on the real stack (queue, audit,
gateway on PostgreSQL and NATS). Before, 400 bad bearer tokens in 30 s were each answered 401 and left no trace.
Now the source's failures are counted: up to the limit each is 401, logged and audited (``authenticate``, with
the source address); the one that reaches the limit blocks the source, whose every later request is 429 with
Retry-After (a valid token too: it is not looked at). A panel session's request without its CSRF token is
refused and audited under the session's actor."""

from __future__ import annotations

import re

import asyncpg
import httpx
import pytest

from services.audit import store as audit_store
from tests.security.gateway_stack import gateway_stack
from tests.support.services import eventually

pytestmark = pytest.mark.security

LIMIT = 20  # the gateway's default auth_failures_per_source


async def test_token_guessing_is_limited_and_audited_and_a_csrf_refusal_names_its_actor(env, tmp_path, caplog):
    async with gateway_stack(env, tmp_path / "s") as s:
        r = await s.as_("alice").post("/v1/jobs", json={"workload": {"kind": "finetune", "params": {"steps": 5}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        async with httpx.AsyncClient(base_url=s.url, timeout=30) as browser:
            form = await browser.get("/signin")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
            signed = await browser.post("/signin", data={"token": s.tokens["alice"], "csrf": csrf, "next": "/jobs"})
            assert signed.status_code in (200, 303), signed.text
            forged = await browser.post(f"/v1/jobs/{job_id}/cancel")  # the cookie without X-CSRF-Token
            assert forged.status_code == 403 and "CSRF" in forged.json()["reason"]

        async with httpx.AsyncClient(base_url=s.url, timeout=30) as guesser:
            codes = [(await guesser.get("/v1/jobs", headers={"Authorization": f"Bearer teto_guess{i}"})).status_code
                     for i in range(400)]
            assert codes == [401] * (LIMIT - 1) + [429] * (400 - LIMIT + 1)  # the CSRF refusal counted first
            late = await guesser.get("/v1/jobs", headers={"Authorization": f"Bearer {s.tokens['alice']}"})
            assert late.status_code == 429 and int(late.headers["Retry-After"]) > 0

        async def audited() -> list[dict]:
            rows = await s.audit_rows(kind="authenticate", outcome="refused")
            return rows if len(rows) == LIMIT else []
        rows = await eventually(audited, 30, f"{LIMIT} authenticate refusals in the audit log")
        csrf_rows = [r for r in rows if '"failure": "csrf"' in r["payload_text"]]
        assert len(csrf_rows) == 1 and csrf_rows[0]["actor"] == "alice"
        guesses = [r for r in rows if '"failure": "unknown_token"' in r["payload_text"]]
        assert len(guesses) == LIMIT - 1 and all(r["actor"] is None for r in guesses)
        assert all('"source": "127.0.0.1"' in r["payload_text"] for r in rows)
        assert '"blocked_seconds"' in guesses[-1]["payload_text"]
        pool = await asyncpg.create_pool(env.database_url, min_size=1, max_size=1)
        try:
            checked = await audit_store.verify(pool)  # the failures joined the append-only chain, which holds
        finally:
            await pool.close()
        assert checked.ok and checked.checked >= LIMIT + 1
        assert (await s.db.fetchval(f"SELECT state FROM queue.jobs WHERE id = '{job_id}'")) == "queued"
        assert any("authentication failure unknown_token from 127.0.0.1" in m for m in caplog.messages)
