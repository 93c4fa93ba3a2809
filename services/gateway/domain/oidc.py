"""OpenID Connect, the relying party's rules, pure: PKCE, the authorization request, every check of an ID
token, when to fetch the provider's keys again, and the device grant's polling (RFC 8628).

An ID token is accepted only if all of these hold (OpenID Connect Core 3.1.3.7), and each refusal has its own
reason, audited by the gateway:
- it is a JWS whose algorithm is one the installation allows (never ``none``, never an HMAC keyed with a
  public value) and whose key (by ``kid``) is in the provider's published key set;
- the signature verifies with that key;
- ``iss`` is exactly the configured issuer, ``aud`` contains the client id (and ``azp``, when there are several
  audiences, is the client id);
- ``exp`` is in the future and ``iat`` not in the future (``leeway`` seconds of clock skew allowed);
- the nonce is the one this sign-in sent (browser sign-in), or absent where none was sent (the device grant):
  a browser's token replayed elsewhere carries a nonce no pending sign-in has.
The clock is an argument; nothing here does I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode

import jwt
from jwt import PyJWK

ALLOWED_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class Refusal(StrEnum):
    MALFORMED = "malformed"  # not a JWS at all, or without the claims every ID token has
    ALGORITHM = "algorithm"  # none, HMAC, or an algorithm the installation does not allow
    UNKNOWN_KEY = "unknown_key"  # its kid is not in the provider's key set (even after fetching it again)
    SIGNATURE = "signature"  # signed by another key
    ISSUER = "issuer"  # iss is another provider
    AUDIENCE = "audience"  # issued for another client (aud, or azp with several audiences)
    EXPIRED = "expired"  # exp passed
    NOT_YET_VALID = "not_yet_valid"  # iat (or nbf) in the future
    NONCE = "nonce"  # not the nonce this sign-in sent: replayed, or from another sign-in
    UNEXPECTED_NONCE = "unexpected_nonce"  # a browser sign-in's token (it has a nonce) offered where none was sent


class IdTokenRefused(Exception):
    def __init__(self, refusal: Refusal, detail: str) -> None:
        super().__init__(f"ID token refused ({refusal.value}): {detail}")
        self.refusal = refusal
        self.detail = detail


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def code_challenge(verifier: str) -> str:
    """PKCE S256: BASE64URL(SHA-256(verifier)) (RFC 7636 4.2)."""
    return _b64(hashlib.sha256(verifier.encode("ascii")).digest())


def new_verifier(random: bytes) -> str:
    """A PKCE code verifier from 32 random bytes: 43 characters of the unreserved set (RFC 7636 4.1)."""
    if len(random) < 32:
        raise ValueError("a PKCE verifier needs at least 32 random bytes")
    return _b64(random)


def authorization_url(endpoint: str, *, client_id: str, redirect_uri: str, scopes: tuple[str, ...], state: str,
                      nonce: str, verifier: str) -> str:
    query = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri,
             "scope": " ".join(scopes), "state": state, "nonce": nonce,
             "code_challenge": code_challenge(verifier), "code_challenge_method": "S256"}
    return endpoint + ("&" if "?" in endpoint else "?") + urlencode(query)


def end_session_url(endpoint: str | None, *, id_token: str | None, client_id: str, after: str) -> str | None:
    """RP-initiated logout (OpenID Connect RP-Initiated Logout 1.0), where the provider offers it."""
    if not endpoint:
        return None
    query = {"client_id": client_id, "post_logout_redirect_uri": after}
    if id_token:
        query["id_token_hint"] = id_token
    return endpoint + ("&" if "?" in endpoint else "?") + urlencode(query)


def same_state(expected: str | None, given: str | None) -> bool:
    return bool(expected) and bool(given) and hmac.compare_digest(str(expected), str(given))


def header_of(token: str) -> dict[str, Any]:
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise IdTokenRefused(Refusal.MALFORMED, str(exc)) from None


def key_for(jwks: Mapping[str, Any], header: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The key of the set the header names (by kid; without a kid, the only signing key of the set)."""
    keys = [k for k in jwks.get("keys", []) if isinstance(k, Mapping) and k.get("use", "sig") == "sig"]
    kid = header.get("kid")
    if kid is not None:
        return next((k for k in keys if k.get("kid") == kid), None)
    return keys[0] if len(keys) == 1 else None


def check_id_token(token: str, *, jwks: Mapping[str, Any], issuer: str, client_id: str, now: float,
                   nonce: str | None, leeway: float = 60.0,
                   algorithms: tuple[str, ...] = ALLOWED_ALGORITHMS) -> dict[str, Any]:
    """The claims of an ID token that passes every check in the module's docstring, else IdTokenRefused."""
    header = header_of(token)
    alg = header.get("alg")
    if alg not in algorithms:
        raise IdTokenRefused(Refusal.ALGORITHM, f"alg {alg!r} is not one of {', '.join(algorithms)}")
    jwk = key_for(jwks, header)
    if jwk is None:
        raise IdTokenRefused(Refusal.UNKNOWN_KEY, f"no key {header.get('kid')!r} in the provider's key set")
    try:
        key = PyJWK(dict(jwk), algorithm=alg)
    except jwt.PyJWTError as exc:
        raise IdTokenRefused(Refusal.UNKNOWN_KEY, f"key {header.get('kid')!r} does not fit {alg}: {exc}") from None
    try:
        # Signature only: each claim is checked below against the given clock, with its own reason.
        claims = jwt.decode(token, key=key, algorithms=[alg], options={
            "verify_exp": False, "verify_iat": False, "verify_nbf": False, "verify_aud": False,
            "verify_iss": False})
    except jwt.InvalidSignatureError:
        raise IdTokenRefused(Refusal.SIGNATURE, f"signature does not verify with key {header.get('kid')!r}") from None
    except jwt.PyJWTError as exc:
        raise IdTokenRefused(Refusal.MALFORMED, str(exc)) from None
    return check_claims(claims, issuer=issuer, client_id=client_id, now=now, nonce=nonce, leeway=leeway)


def check_claims(claims: Mapping[str, Any], *, issuer: str, client_id: str, now: float, nonce: str | None,
                 leeway: float = 60.0) -> dict[str, Any]:
    """The claim checks of an ID token whose signature verified."""
    for name in ("iss", "sub", "aud", "exp", "iat"):
        if name not in claims:
            raise IdTokenRefused(Refusal.MALFORMED, f"no {name} claim")
    if claims["iss"] != issuer:
        raise IdTokenRefused(Refusal.ISSUER, f"issuer {str(claims['iss'])[:200]!r}, expected {issuer!r}")
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if client_id not in audiences:
        raise IdTokenRefused(Refusal.AUDIENCE, f"audience {audiences!r} does not include {client_id!r}")
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise IdTokenRefused(Refusal.AUDIENCE, f"several audiences and azp {claims.get('azp')!r} is not {client_id!r}")
    try:
        exp, iat = float(claims["exp"]), float(claims["iat"])
        nbf = float(claims["nbf"]) if "nbf" in claims else None
    except (TypeError, ValueError):
        raise IdTokenRefused(Refusal.MALFORMED, "exp, iat or nbf is not a number") from None
    if exp <= now - leeway:
        raise IdTokenRefused(Refusal.EXPIRED, f"expired {now - exp:.0f} s ago")
    if iat > now + leeway or (nbf is not None and nbf > now + leeway):
        raise IdTokenRefused(Refusal.NOT_YET_VALID, f"issued {iat - now:.0f} s in the future")
    got = claims.get("nonce")
    if nonce is None:
        if got is not None:
            raise IdTokenRefused(Refusal.UNEXPECTED_NONCE, "a browser sign-in's token (it carries a nonce) "
                                                           "offered where no sign-in sent one")
    elif not same_state(nonce, got if isinstance(got, str) else None):
        raise IdTokenRefused(Refusal.NONCE, "the nonce is not the one this sign-in sent")
    return dict(claims)


# -- the provider's keys: when to fetch them again ------------------------------------------------------------


@dataclass(frozen=True)
class KeySet:
    jwks: Mapping[str, Any]
    fetched_at: float  # monotonic seconds


def refetch_keys(keys: KeySet | None, header: Mapping[str, Any], now: float, *, max_age: float,
                 min_interval: float) -> bool:
    """Whether to fetch the key set before checking a token with this header: none yet, older than ``max_age``,
    or the token names a key the set lacks (the provider rotated its keys), but never more often than
    ``min_interval`` (a flood of tokens with made-up kids must not become a flood of requests to the provider)."""
    if keys is None:
        return True
    age = now - keys.fetched_at
    if age >= max_age:
        return True
    return key_for(keys.jwks, header) is None and age >= min_interval


# -- the device authorization grant (RFC 8628 3.5), the CLI's side -------------------------------------------


class Poll(StrEnum):
    DONE = "done"  # tokens came back
    WAIT = "wait"  # authorization_pending: ask again after the interval
    SLOWER = "slower"  # slow_down: add 5 s to the interval, then ask again
    DENIED = "denied"  # access_denied: the person refused
    EXPIRED = "expired"  # expired_token: the code ran out; start again
    FAILED = "failed"  # any other error


def on_poll(status: int, body: Mapping[str, Any]) -> Poll:
    if status == 200 and "id_token" in body:
        return Poll.DONE
    error = str(body.get("error", ""))
    return {"authorization_pending": Poll.WAIT, "slow_down": Poll.SLOWER, "access_denied": Poll.DENIED,
            "expired_token": Poll.EXPIRED}.get(error, Poll.FAILED)


def next_interval(poll: Poll, interval: float) -> float:
    return interval + 5 if poll is Poll.SLOWER else interval


def unverified_claims(token: str) -> dict[str, Any]:
    """The payload of a JWT without checking it: for display on the CLI only (the gateway checks it)."""
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
