"""No API path as a caption (issue 26): what a person reads on the panel names things in words; the API's paths
belong to docs/api.md, not to the page's text (links may point to the API, their text does not spell it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.panel import i18n
from services.gateway.settings import GatewaySettings
from tests.unit.test_panel_web import FakeCommands, FakeReads, sign_in

pytestmark = pytest.mark.unit

API_PATH = re.compile(r"(\b(GET|POST|PUT|PATCH|DELETE)\s+/|/v1\b)")
TEMPLATES = Path(i18n.__file__).parent / "templates"


@pytest.mark.parametrize("locale", i18n.LOCALES)
def test_no_message_spells_an_api_path(locale):
    shown = {key: text for key, text in i18n.catalogue(locale).items() if API_PATH.search(text)}
    assert shown == {}


def test_no_template_shows_an_api_path_as_text():
    for template in sorted(TEMPLATES.glob("*.html")):
        # Attribute values (href, data-*) and template code may hold a path; text between tags may not.
        source = re.sub(r"\{%.*?%\}|\{\{.*?\}\}", " ", template.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"<[^>]*>", " ", source)
        assert not API_PATH.search(text), template.name


class LongHistory(FakeReads):
    """A job whose earliest events are beyond the page: its timeline links to every event."""

    async def get_job(self, job_id: str, *, events: int = 20) -> dict[str, Any] | None:
        job = await super().get_job(job_id, events=events)
        if job is not None:
            job["events"] = [{"job_id": job_id, "seq": 7, "event": "started", "state": "running",
                              "time": "2026-12-01T10:00:00+00:00", "detail": {"resumed_from_step": 20}}]
        return job


@pytest.mark.parametrize("locale", i18n.LOCALES)
def test_the_job_page_says_in_words_where_the_earlier_events_are(tmp_path, locale):
    settings = GatewaySettings.from_env(env={}, data_dir=tmp_path)
    secret = auth.create_token(settings.effective_tokens_file, "olga", "operator")
    with TestClient(create_app(settings, reads=LongHistory(), commands=FakeCommands()),
                    base_url="https://panel.test") as client:
        sign_in(client, secret)
        page = client.get("/jobs/j1", headers={"Accept-Language": locale}).text
    earlier = page[page.index('id="timeline-earlier"'):]
    earlier = earlier[:earlier.index("</p>")]
    assert 'href="/v1/jobs/j1/events"' in earlier  # a link to the API, its text in words
    text = re.sub(r"<[^>]*>", " ", earlier)
    assert not API_PATH.search(text) and i18n.translate(locale, "job.timeline_all") in text
