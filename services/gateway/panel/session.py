"""Panel sessions: the API token sealed in an HttpOnly, SameSite=Strict cookie, and the CSRF token bound to it.

A browser never holds the token where a script can read it (no localStorage): sign-in seals
``{secret, csrf, exp}`` with AES-GCM under the gateway's session key into the ``teto_session`` cookie. Every
request re-authenticates the sealed secret against the tokens file, so a revoked token ends its sessions at once.
State-changing requests (anything but GET/HEAD/OPTIONS) made with the cookie must carry the session's CSRF token
(``X-CSRF-Token`` header, or the ``csrf`` form field for plain forms); without it the cookie counts for nothing.
Pure functions over bytes and dicts; the clock is an argument.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

COOKIE = "teto_session"
PRE_COOKIE = "teto_signin"  # CSRF token of the sign-in form itself (login CSRF), before a session exists
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_LIFETIME_SECONDS = 12 * 3600
_AAD = b"teto-panel-session/1"


@dataclass(frozen=True)
class Session:
    secret: str  # the API token
    csrf: str
    expires_at: float  # epoch seconds


def session_key(secrets_key: bytes | None) -> bytes:
    """The key sessions are sealed with: derived from the installation's secrets key when there is one (every
    gateway replica then accepts every session), else random for this process (sessions end on restart)."""
    if secrets_key:
        return hashlib.sha256(b"teto-panel-session-key\0" + secrets_key).digest()
    return os.urandom(32)


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def seal(key: bytes, secret: str, *, now: float, lifetime: float = DEFAULT_LIFETIME_SECONDS) -> tuple[str, Session]:
    """The cookie value for a new session and the session it holds."""
    session = Session(secret=secret, csrf=new_csrf(), expires_at=now + lifetime)
    nonce = os.urandom(12)
    body = json.dumps({"s": session.secret, "c": session.csrf, "e": session.expires_at}).encode()
    sealed = nonce + AESGCM(key).encrypt(nonce, body, _AAD)
    return base64.urlsafe_b64encode(sealed).decode().rstrip("="), session


def unseal(key: bytes, value: str | None, *, now: float) -> Session | None:
    """The session in a cookie value, or None (absent, forged, from another key, expired)."""
    if not value or len(value) > 4096:
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        body = json.loads(AESGCM(key).decrypt(raw[:12], raw[12:], _AAD))
        session = Session(secret=str(body["s"]), csrf=str(body["c"]), expires_at=float(body["e"]))
    except (ValueError, InvalidTag, KeyError, TypeError):
        return None
    return session if session.expires_at > now else None


def csrf_ok(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison; an absent token on either side never matches."""
    return bool(expected) and bool(given) and hmac.compare_digest(str(expected), str(given))


def needs_csrf(method: str) -> bool:
    return method.upper() not in SAFE_METHODS


def cookie_options(*, secure: bool, max_age: int | None = DEFAULT_LIFETIME_SECONDS) -> dict:
    """Attributes of the session cookie: HttpOnly (no script reads it), SameSite=Strict (no other site sends it),
    Secure when served over HTTPS."""
    return {"httponly": True, "samesite": "strict", "secure": secure, "path": "/", "max_age": max_age}
