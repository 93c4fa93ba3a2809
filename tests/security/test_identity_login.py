"""Issue 30 on the command line: ``teto login`` through the device authorization grant of a real OpenID Provider
(the person confirms the code in Chromium), the credential stored 0600; then ``teto submit`` and ``teto jobs`` act
as that person, ``teto whoami`` says which claim gave which role; when the session is about to end the CLI
refreshes it at the provider by itself; ``teto logout`` ends it on every replica.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import sys
import time

import httpx
import pytest

from services.gateway.auth import hash_secret

from tests.panel.browser import ensure_chromium
from tests.security.identity_stack import identity_stack

pytestmark = pytest.mark.security


async def teto(*args: str, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "teto.cli", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, env={**os.environ, "TETO_URL": "",
                                                                                       "TETO_TOKEN": ""})
    out, _ = await proc.communicate()
    text = out.decode()
    assert not check or proc.returncode == 0, f"teto {' '.join(args)} exited {proc.returncode}: {text}"
    return text


async def confirm_in_browser(address: str, login: str) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=ensure_chromium(), args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            page.set_default_timeout(30_000)
            await page.goto(address)
            await page.click("button:has-text('Continue')")  # "the code shown on your device" confirmation
            await page.fill("input[name=login]", login)
            await page.fill("input[name=password]", "any")
            await page.click("button:has-text('Sign-in')")
            await page.click("button:has-text('Continue')")  # consent
            await page.wait_for_selector("text=Sign-in Success")
        finally:
            await browser.close()


ADMIN = "teto_identity-admin-secret"


async def test_teto_login_through_the_device_grant_then_teto_jobs_as_that_person(env, tmp_path):
    old = [{"id": "a0", "actor": "local-admin", "role": "admin", "sha256": hash_secret(ADMIN),
            "created_at": "2026-10-01T10:00:00+00:00", "revoked": False}]
    async with identity_stack(env, tmp_path / "s", old_tokens=old) as s:
        one, two = s.urls
        async with httpx.AsyncClient(base_url=one, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as adm:
            assert (await adm.put("/v1/orgs/radiology", json={})).status_code in (200, 201, 202)
        creds = tmp_path / "home" / "credentials.json"
        common = ("--credentials-file", str(creds))
        login = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "teto.cli", "login", "--url", one, *common, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env={**os.environ, "TETO_URL": "", "TETO_TOKEN": ""})
        first = (await asyncio.wait_for(login.stdout.readline(), 60)).decode()
        address = re.search(r"open (\S+)", first).group(1)
        await confirm_in_browser(address, "olga")
        rest, _ = await asyncio.wait_for(login.communicate(), 120)
        said = first + rest.decode()
        assert login.returncode == 0, said
        assert "signed in as olga (operator)" in said and "claim groups contains 'teto-operators'" in said
        assert stat.S_IMODE(creds.stat().st_mode) == 0o600
        saved = json.loads(creds.read_text())
        assert saved["secret"].startswith("tetos_") and saved["refresh_token"]

        # The credential is sent only to the gateway it was made for; the session works on every replica.
        assert "olga (operator)" in await teto("whoami", "--url", two, "--token", saved["secret"])
        who = await teto("whoami", "--url", one, *common)
        assert "olga (operator) in radiology, by a sign-in session" in who
        assert "role operator: claim groups contains 'teto-operators'" in who
        assert "org radiology: claim org is 'radiology'" in who

        made = json.loads(await teto("submit", "--url", one, *common, "--json", "--name", "mine"))
        jobs = json.loads(await teto("jobs", "--url", one, *common, "--json"))
        rows = jobs["jobs"] if isinstance(jobs, dict) else jobs
        mine = [j for j in rows if j["id"] == (made.get("id") or made.get("job_id"))]
        assert mine and mine[0]["owner"] == "olga"

        # The session is about to end: the next command refreshes it at the provider and exchanges it again.
        saved["expires_at"] = time.time()
        creds.write_text(json.dumps(saved))
        assert "olga (operator)" in await teto("whoami", "--url", one, *common)
        renewed = json.loads(creds.read_text())
        assert renewed["secret"] != saved["secret"] and renewed["expires_at"] > time.time() + 3600
        assert stat.S_IMODE(creds.stat().st_mode) == 0o600
        sessions = await s.db.fetch("SELECT kind, ended_reason FROM gateway.sessions WHERE actor = 'olga'"
                                    " ORDER BY created_at")
        assert [(r["kind"], r["ended_reason"]) for r in sessions] == [("cli", "signed out"), ("cli", None)]  # replaced
        async with httpx.AsyncClient(base_url=two, timeout=30) as client:
            r = await client.get("/v1/whoami", headers={"Authorization": f"Bearer {saved['secret']}"})
            assert r.status_code == 401

        assert "signed out" in await teto("logout", "--url", one, *common)
        assert not creds.exists()
        async with httpx.AsyncClient(base_url=two, timeout=30) as client:
            r = await client.get("/v1/whoami", headers={"Authorization": f"Bearer {renewed['secret']}"})
            assert r.status_code == 401
