"""Panel sessions: the sealed cookie round-trips, refuses forgery, other keys and expiry; CSRF comparison."""

from __future__ import annotations

import pytest

from services.gateway.panel import session

pytestmark = pytest.mark.unit
KEY = b"k" * 32


def test_a_sealed_session_opens_with_its_key_until_it_expires():
    value, made = session.seal(KEY, "teto_secret", now=1000.0, lifetime=60)
    assert "teto_secret" not in value
    assert session.unseal(KEY, value, now=1059.0) == made
    assert session.unseal(KEY, value, now=1061.0) is None
    assert session.unseal(b"x" * 32, value, now=1000.0) is None


@pytest.mark.parametrize("value", [None, "", "abc", "A" * 5000, "!!!!", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"], ids=str)
def test_anything_else_is_no_session(value):
    assert session.unseal(KEY, value, now=0.0) is None


def test_a_tampered_cookie_is_no_session():
    value, _ = session.seal(KEY, "teto_secret", now=0.0)
    flipped = value[:-3] + ("A" if value[-3] != "A" else "B") + value[-2:]
    assert session.unseal(KEY, flipped, now=0.0) is None


def test_each_session_has_its_own_csrf_token():
    _, one = session.seal(KEY, "s", now=0.0)
    _, two = session.seal(KEY, "s", now=0.0)
    assert one.csrf != two.csrf and len(one.csrf) >= 24


def test_csrf_matches_only_equal_present_tokens():
    assert session.csrf_ok("abc", "abc")
    assert not session.csrf_ok("abc", "abd")
    assert not session.csrf_ok("", "")
    assert not session.csrf_ok(None, "abc") and not session.csrf_ok("abc", None)


def test_only_safe_methods_go_without_csrf():
    assert not session.needs_csrf("GET") and not session.needs_csrf("head")
    assert all(session.needs_csrf(m) for m in ("POST", "PUT", "PATCH", "DELETE"))


def test_the_session_key_is_derived_from_the_installation_key_or_random():
    assert session.session_key(b"s" * 32) == session.session_key(b"s" * 32)
    assert session.session_key(None) != session.session_key(None)


def test_the_cookie_is_http_only_and_same_site_strict():
    options = session.cookie_options(secure=True)
    assert options["httponly"] and options["samesite"] == "strict" and options["secure"]
