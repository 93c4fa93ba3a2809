"""The gateway serves the bus's AsyncAPI document (services/gateway/routes/asyncapi.py) without a token: the
generated document itself at /asyncapi.json, and at /asyncapi a page that names every channel and every message
type and fetches nothing from elsewhere (tests/unit/test_asyncapi.py proves the document complete and current)."""

from __future__ import annotations

import json
import re
from html import escape as html_escape

from fastapi.testclient import TestClient

from libs.contracts.registry import CATALOGUE
from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings
from teto.asyncapi import PACKAGED


def test_the_document_and_its_page_are_served_to_anyone(tmp_path):
    app = create_app(GatewaySettings.from_env(env={}, data_dir=tmp_path))
    with TestClient(app) as client:
        doc = client.get("/asyncapi.json")
        page = client.get("/asyncapi")
    assert doc.status_code == 200 and doc.json() == json.loads(PACKAGED.read_text())
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    for channel in doc.json()["channels"].values():
        assert f"<code>{html_escape(channel['address'])}</code>" in html
    for entry in CATALOGUE:
        assert f'id="schema-{entry.model.__name__}"' in html, entry.model.__name__
    assert "<script" not in html and not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing from elsewhere
