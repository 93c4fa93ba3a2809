"""The panel's provider sign-in pages without a database (services/gateway/panel/pages/oidc.py): a button per
provider, an unknown provider 404, a provider that does not answer 502 with the reason, a callback without this
browser's state refused before anything is looked up, the provider's own error shown."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings

pytestmark = pytest.mark.unit

PROVIDERS = json.dumps([{"name": "hospital", "display_name": "Hospital", "issuer": "http://127.0.0.1:9",
                         "client_id": "teto-panel"},
                        {"name": "gov", "issuer": "http://127.0.0.1:9/gov", "client_id": "teto"}])


@pytest.fixture
def client():
    with TestClient(create_app(GatewaySettings.from_env(env={}, oidc_providers=PROVIDERS))) as c:
        yield c


def test_the_sign_in_page_has_a_button_per_provider_and_keeps_the_token_form(client):
    page = client.get("/signin?next=/jobs/j1").text
    assert 'href="/signin/oidc/hospital?next=/jobs/j1"' in page and "Sign in with Hospital" in page
    assert 'href="/signin/oidc/gov?next=/jobs/j1"' in page and 'name="token"' in page


def test_without_providers_there_is_no_button():
    with TestClient(create_app(GatewaySettings.from_env(env={}))) as plain:
        assert "/signin/oidc/" not in plain.get("/signin").text
        assert plain.get("/signin/oidc/hospital").status_code == 404


def test_an_unknown_provider_is_404_and_one_that_does_not_answer_is_502_with_the_reason(client):
    assert client.get("/signin/oidc/nope").status_code == 404
    down = client.get("/signin/oidc/hospital", follow_redirects=False)
    assert down.status_code == 502 and "openid-configuration" in down.text


def test_a_callback_without_this_browsers_state_is_refused(client):
    r = client.get("/signin/oidc/hospital/callback?code=c&state=s", follow_redirects=False)
    assert r.status_code == 403 and "state does not match" in r.text


def test_the_providers_error_is_shown(client):
    r = client.get("/signin/oidc/hospital/callback?error=access_denied&error_description=the+user+said+no")
    assert r.status_code == 401 and "access_denied" in r.text and "the user said no" in r.text
