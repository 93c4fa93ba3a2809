"""Issue 30 in a browser: two people sign in to the panel through a real OpenID Provider (oidc-provider) in
Chromium, with the authorization code flow (PKCE, state, nonce). Olga's groups make her an operator in
radiology, Vic's a viewer in cardiology; the person's page shows each role and the claim it came from. On an
interrupted job, the viewer sees no requeue form and a forged requeue from his session is refused (403, audited);
the operator requeues it from the form. A replayed callback is refused and audited; sign-out ends the session in
the database (its cookie is refused by both replicas) and signs out at the provider (RP-initiated logout).
"""

from __future__ import annotations

import sys
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from services.gateway.auth import hash_secret
from services.gateway.panel import session as panel_session
from tests.panel.browser import ensure_chromium
from tests.security.identity_stack import bearer, identity_stack
from tests.support.services import eventually

pytestmark = pytest.mark.security

VIC_SUBMITS = "teto_vic-operator-file-token"  # Vic's own script token (an operator's, to run a command job)
OLD_FILE = [{"id": "v0", "actor": "vic", "role": "operator", "sha256": hash_secret(VIC_SUBMITS),
             "created_at": "2026-10-01T10:00:00+00:00", "revoked": False}]
SLEEPER = "import time\nwhile True:\n    time.sleep(0.5)\n"


async def sign_in(browser, url: str, login: str, callbacks: list[str]):
    context = await browser.new_context(locale="en", extra_http_headers={"Accept-Language": "en"})
    page = await context.new_page()
    page.set_default_timeout(30_000)
    page.on("request", lambda r: callbacks.append(r.url) if "/signin/oidc/hospital/callback" in r.url else None)
    await page.goto(f"{url}/jobs")
    assert "/signin" in page.url
    await page.click("#signin-hospital")
    await page.fill("input[name=login]", login)  # the provider's own sign-in page
    await page.fill("input[name=password]", "any")
    await page.click("button:has-text('Sign-in')")
    await page.click("button:has-text('Continue')")  # the provider's consent page
    await page.wait_for_url(f"{url}/jobs")
    return context, page


async def session_cookie(context) -> str:
    return next(c["value"] for c in await context.cookies() if c["name"] == panel_session.COOKIE)


async def test_two_people_sign_in_through_the_provider_with_the_roles_their_groups_give(env, tmp_path):
    from playwright.async_api import async_playwright

    async with identity_stack(env, tmp_path / "s", old_tokens=OLD_FILE, budget=True) as s:
        one, two = s.urls
        s.start_executor("e1")
        async with httpx.AsyncClient(base_url=one, timeout=60, headers=bearer(VIC_SUBMITS)) as vic_api:
            made = await vic_api.post("/v1/jobs", json={"name": "sleeper", "gpu_ceiling_seconds": 3, "workload": {
                "kind": "command", "command": [sys.executable, "-c", SLEEPER]}})
            assert made.status_code in (201, 202), made.text
            job_id = made.json().get("id") or made.json()["job_id"]

            async def interrupted() -> bool:
                return (await vic_api.get(f"/v1/jobs/{job_id}")).json()["state"] == "interrupted"
            await eventually(interrupted, 180, "the job to be interrupted at its ceiling")

        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=ensure_chromium(),
                                              args=["--no-sandbox", "--disable-dev-shm-usage"])
            try:
                # Vic: a viewer in cardiology, because of his groups and org claims.
                vic_callbacks: list[str] = []
                vic_ctx, vic = await sign_in(browser, one, "vic", vic_callbacks)
                await vic.goto(f"{one}/me")
                assert (await vic.inner_text("#me-roles")).split() == ["viewer"]
                assert await vic.inner_text("#me-org") == "cardiology"
                why = await vic.inner_text("#me-grants")
                assert "claim groups contains 'teto-viewers'" in why and "claim org is 'cardiology'" in why
                assert [await r.get_attribute("data-token") for r in await vic.locator("#me-tokens tbody tr").all()] \
                    == ["v0"]  # his own token only (a viewer is no admin)
                await vic.goto(f"{one}/jobs/{job_id}")
                assert await vic.locator("#requeue-form").count() == 0  # no requeue form for a viewer
                assert await vic.locator("h1").count() == 1 and "sleeper" in await vic.inner_text("main")
                forged = await vic.evaluate(
                    """async (id) => {
                        const csrf = document.querySelector('meta[name="csrf-token"]').content;
                        const r = await fetch('/v1/jobs/' + id + '/requeue', {method: 'POST',
                            headers: {'X-CSRF-Token': csrf, 'Content-Type': 'application/json'},
                            body: JSON.stringify({gpu_ceiling_seconds: 600})});
                        return [r.status, await r.text()];
                    }""", job_id)
                assert forged[0] == 403 and "finetune:manage" in forged[1], forged
                await s.audited("requeue", outcome="refused", actor="vic")

                # Olga: an operator in radiology; she requeues the job from the form.
                olga_callbacks: list[str] = []
                olga_ctx, olga = await sign_in(browser, two, "olga", olga_callbacks)
                await olga.goto(f"{two}/me")
                assert (await olga.inner_text("#me-roles")).split() == ["operator"]
                assert await olga.inner_text("#me-org") == "radiology"
                assert "claim groups contains 'teto-operators'" in await olga.inner_text("#me-grants")
                await olga.goto(f"{two}/jobs/{job_id}")
                assert await olga.locator("#requeue").is_visible()
                await olga.fill("#requeue-ceiling", "600")
                await olga.click("#requeue-submit")
                async with httpx.AsyncClient(base_url=one, timeout=30, headers=bearer(VIC_SUBMITS)) as api:
                    async def requeued() -> bool:
                        return (await api.get(f"/v1/jobs/{job_id}")).json()["state"] != "interrupted"
                    await eventually(requeued, 60, "Olga's requeue to take the job out of interrupted")
                await s.audited("requeue", outcome="accepted", actor="olga")
                (signed,) = await s.audited("sign_in", '"actor": "olga"', '"session_kind": "panel"',
                                            outcome="accepted")
                assert '"roles": ["operator"]' in signed["payload_text"]

                # Her token page: she makes a token for a script (shown once), it is listed, she revokes it.
                await olga.goto(f"{two}/me")
                await olga.select_option("#token-role", "submitter")
                await olga.fill("#token-description", "nightly evaluation")
                await olga.click("#token-form button[type=submit]")
                await olga.wait_for_selector("#token-result[data-secret]")
                secret = await olga.get_attribute("#token-result", "data-secret")
                async with httpx.AsyncClient(base_url=one, timeout=30, headers=bearer(secret)) as script:
                    me = (await script.get("/v1/whoami")).json()
                    assert (me["actor"], me["role"], me["org"]) == ("olga", "submitter", "radiology")
                await olga.reload()
                row = olga.locator("#me-tokens tbody tr", has_text="nightly evaluation")
                await row.locator("button.revoke").click()
                await olga.wait_for_load_state()
                await olga.wait_for_selector("#me-tokens tbody tr:has-text('nightly evaluation'):not(:has(button.revoke))")
                async with httpx.AsyncClient(base_url=two, timeout=30, headers=bearer(secret)) as script:
                    assert (await script.get("/v1/whoami")).status_code == 401

                # Her callback replayed (the same code and state): in her browser the state's cookie is gone; with
                # the cookie too (someone who copied both), the pending sign-in was consumed. Refused, audited.
                await olga.goto(olga_callbacks[-1])
                assert "state does not match" in await olga.inner_text("#signin-reason")
                state = parse_qs(urlsplit(olga_callbacks[-1]).query)["state"][0]
                async with httpx.AsyncClient(timeout=30, cookies={"teto_oidc": state}) as thief:
                    replay = await thief.get(olga_callbacks[-1])
                assert replay.status_code == 403 and "no pending sign-in" in replay.text
                await s.audited("sign_in", "state does not match", outcome="refused")
                await s.audited("sign_in", "no pending sign-in", outcome="refused")

                # Sign-out ends the session everywhere and at the provider.
                cookie = await session_cookie(olga_ctx)
                await olga.goto(f"{two}/jobs")
                await olga.click("header form[action='/signout'] button")
                await olga.wait_for_url(f"{s.provider.issuer}/session/end**")
                await olga.click("button:has-text('Yes, sign me out')")  # the provider's logout page
                await olga.wait_for_url(f"{two}/signin")
                for url in s.urls:
                    async with httpx.AsyncClient(base_url=url, timeout=30,
                                                 cookies={panel_session.COOKIE: cookie}) as replay:
                        assert (await replay.get("/v1/whoami")).status_code == 401
                row = await s.db.fetchrow("SELECT ended_at, ended_reason FROM gateway.sessions WHERE actor = 'olga'")
                assert row["ended_at"] is not None and row["ended_reason"] == "signed out"
                await s.audited("sign_out", '"actor": "olga"', outcome="accepted")
                await olga.goto(f"{two}/jobs")
                assert "/signin" in olga.url
                await vic_ctx.close()
                await olga_ctx.close()
            finally:
                await browser.close()
