"""Fixtures of the panel's browser tests: one real stack (``teto up``) per module, the system's Chromium driven by
Playwright, people with their own tokens, and screenshots written to docs/panel/."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import Stack, start_stack
from tests.support.services import eventually_blocking

from .browser import ensure_chromium

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "panel"


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """One browser per module, stopped with it: Playwright's sync API runs an event loop in this thread while it
    lives, and every asyncio test after it would find that loop running (asyncio.run refuses to start)."""
    from playwright.sync_api import sync_playwright

    path = ensure_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


def stack_for_module(**kw) -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="teto-panel-"))
    os.chmod(root, 0o755)
    stack = start_stack(root / "teto", **kw)
    try:
        yield stack
    finally:
        stack.stop()
        if os.environ.get("TETO_PANEL_KEEP_STACK"):  # to read the parts' logs after a failure
            print(f"\nthe stack's data and logs are kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def submit(stack: Stack, spec: dict, secret: str | None = None) -> str:
    """Submits a job and returns its id; 202 (the outcome not back within the gateway's wait, on a loaded
    machine) names the job as well."""
    headers = {"Authorization": f"Bearer {secret}"} if secret else stack.headers
    r = httpx.post(f"{stack.url}/v1/jobs", json=spec, headers=headers, timeout=60)
    assert r.status_code in (201, 202), r.text
    body = r.json()
    return body["id"] if r.status_code == 201 else body["job_id"]


def token_for(stack: Stack, actor: str, role: str) -> str:
    r = httpx.post(f"{stack.url}/v1/tokens", json={"actor": actor, "role": role}, headers=stack.headers, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["secret"]


def open_as(chromium, stack: Stack, secret: str, locale: str):
    """A new browser context (its own cookies) with ``Accept-Language: locale``, signed in through the form."""
    context = chromium.new_context(locale=locale, extra_http_headers={"Accept-Language": locale},
                                   viewport={"width": 1360, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(20_000)
    visit(page, f"{stack.url}/jobs")
    assert "/signin" in page.url and not untranslated(page)
    shoot(page, "signin", locale)
    page.get_by_label("Token de API" if locale == "pt-BR" else "API token").fill(secret)
    page.get_by_role("button", name="Entrar" if locale == "pt-BR" else "Sign in").click()
    page.wait_for_url(f"{stack.url}/jobs")
    return page


def visit(page, url: str, *, within: float = 60.0):
    """``page.goto`` that waits out a gateway being restarted by ``teto up``'s supervisor (on a loaded machine a
    part can fail its start-up and come back): connection refused is retried, anything else is not."""
    refused: list[Exception] = []

    def load():  # noqa: ANN202 - playwright's Response
        try:
            return page.goto(url)
        except Exception as exc:  # noqa: BLE001 - playwright's Error; only a refused connection is retried
            if "ERR_CONNECTION_REFUSED" not in str(exc):
                raise
            refused.append(exc)
            return None

    return eventually_blocking(load, timeout=within, every=1,
                               what=lambda: f"{url} to answer (last: {refused[-1] if refused else 'none'})")


def shoot(page, name: str, locale: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}-{locale}.png"), full_page=True)


UNTRANSLATED = r"\b(common|jobs|job|signin|executors|nodes|audit|policy|usage|status|dead|numbers|terms)\.[a-z][a-z0-9_-]+\b"


def untranslated(page) -> list[str]:
    """Catalogue keys shown as such (a string without a translation) in the page's visible text; a job's output
    (``.log-lines``: what the job printed, ``job.py`` in a traceback say) is the job's text, not the panel's."""
    import re

    text = page.locator("body").inner_text()
    for shown in page.locator(".log-lines").all_inner_texts():
        text = text.replace(shown, "")
    return [text[max(0, m.start() - 40):m.end() + 20] for m in re.finditer(UNTRANSLATED, text)]  # with context


class Dialogs:
    """Records any JavaScript dialog a page opens (an escaping failure would open alert(1))."""

    def __init__(self, page) -> None:
        self.seen: list[str] = []
        page.on("dialog", lambda d: (self.seen.append(d.message), d.dismiss()))
