"""The relying party's rules (services/gateway/domain/oidc.py), pure: PKCE, the authorization request, every
check of an ID token (each refusal with its own reason, over every way a token can fail), when to fetch the
provider's keys again, RP-initiated logout and the device grant's polling."""

from __future__ import annotations

import base64
import hashlib
import json
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from services.gateway.domain import oidc as rules
from services.gateway.domain.oidc import IdTokenRefused, Poll, Refusal

pytestmark = pytest.mark.unit

ISSUER, CLIENT, NOW = "https://login.example.org/realms/hospital", "teto-panel", 1_800_000_000.0
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def public_jwk(key, kid: str, alg: str = "RS256") -> dict:
    algo = jwt.algorithms.RSAAlgorithm if alg.startswith(("RS", "PS")) else jwt.algorithms.ECAlgorithm
    jwk = json.loads(algo.to_jwk(key.public_key()))
    jwk.update(kid=kid, use="sig", alg=alg)
    return jwk


JWKS = {"keys": [public_jwk(RSA_KEY, "k1"), public_jwk(EC_KEY, "k2", "ES256"),
                 {**public_jwk(OTHER_KEY, "enc"), "use": "enc"}]}


def claims(**over) -> dict:
    base = {"iss": ISSUER, "sub": "u-1", "aud": CLIENT, "iat": int(NOW) - 10, "exp": int(NOW) + 300, "nonce": "n-1"}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def sign(body: dict, key=RSA_KEY, kid: str | None = "k1", alg: str = "RS256") -> str:
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid} if kid else None)


def check(token: str, *, nonce: str | None = "n-1", jwks: dict = JWKS, now: float = NOW) -> dict:
    return rules.check_id_token(token, jwks=jwks, issuer=ISSUER, client_id=CLIENT, now=now, nonce=nonce)


def test_a_token_passing_every_check_gives_its_claims():
    assert check(sign(claims()))["sub"] == "u-1"
    assert check(sign(claims(), key=EC_KEY, kid="k2", alg="ES256"))["sub"] == "u-1"
    assert check(sign(claims(aud=[CLIENT, "other"], azp=CLIENT)))["azp"] == CLIENT


def _forged_alg_none() -> str:
    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")
    return f"{b64({'alg': 'none', 'kid': 'k1'})}.{b64(claims())}."


def _hmac_with_public_key() -> str:
    """The classic confusion: HS256 keyed with the provider's public key, which anyone can fetch."""
    return jwt.encode(claims(), "a-public-value-anyone-has-0123456789", algorithm="HS256", headers={"kid": "k1"})


CASES = {
    "not a JWT": ("not-a-token", Refusal.MALFORMED),
    "alg none": (_forged_alg_none(), Refusal.ALGORITHM),
    "HMAC with a public value": (_hmac_with_public_key(), Refusal.ALGORITHM),
    "another key, the provider's kid": (sign(claims(), key=OTHER_KEY), Refusal.SIGNATURE),
    "a kid the provider does not publish": (sign(claims(), key=OTHER_KEY, kid="attacker"), Refusal.UNKNOWN_KEY),
    "an encryption key's kid": (sign(claims(), key=OTHER_KEY, kid="enc"), Refusal.UNKNOWN_KEY),
    "an RSA kid for an EC algorithm": (sign(claims(), key=EC_KEY, kid="k1", alg="ES256"), Refusal.UNKNOWN_KEY),
    "another issuer": (sign(claims(iss="https://evil.example.org")), Refusal.ISSUER),
    "another audience": (sign(claims(aud="another-client")), Refusal.AUDIENCE),
    "several audiences, azp another": (sign(claims(aud=[CLIENT, "x"], azp="x")), Refusal.AUDIENCE),
    "several audiences, no azp": (sign(claims(aud=[CLIENT, "x"])), Refusal.AUDIENCE),
    "expired": (sign(claims(exp=int(NOW) - 61)), Refusal.EXPIRED),
    "issued in the future": (sign(claims(iat=int(NOW) + 61)), Refusal.NOT_YET_VALID),
    "not before in the future": (sign(claims(nbf=int(NOW) + 61)), Refusal.NOT_YET_VALID),
    "another sign-in's nonce": (sign(claims(nonce="n-old")), Refusal.NONCE),
    "no nonce where one was sent": (sign(claims(nonce=None)), Refusal.NONCE),
    "no sub": (sign(claims(sub=None)), Refusal.MALFORMED),
    "no exp": (sign(claims(exp=None)), Refusal.MALFORMED),
    "exp not a number": (sign(claims(exp="soon")), Refusal.MALFORMED),
}


@pytest.mark.parametrize("case", sorted(CASES), ids=str)
def test_each_way_a_token_fails_is_refused_with_its_own_reason(case):
    token, refusal = CASES[case]
    with pytest.raises(IdTokenRefused) as caught:
        check(token)
    assert caught.value.refusal is refusal, caught.value


def test_the_clock_skew_allowed_is_the_leeway_and_no_more():
    assert check(sign(claims(exp=int(NOW) - 59)))
    assert check(sign(claims(iat=int(NOW) + 59)))
    with pytest.raises(IdTokenRefused):
        rules.check_id_token(sign(claims(exp=int(NOW) - 5)), jwks=JWKS, issuer=ISSUER, client_id=CLIENT, now=NOW,
                             nonce="n-1", leeway=0)


def test_where_no_nonce_was_sent_a_token_carrying_one_is_a_replayed_browser_token():
    assert check(sign(claims(nonce=None)), nonce=None)["sub"] == "u-1"
    with pytest.raises(IdTokenRefused) as caught:
        check(sign(claims()), nonce=None)
    assert caught.value.refusal is Refusal.UNEXPECTED_NONCE


def test_an_algorithm_the_installation_does_not_allow_is_refused_even_with_a_good_signature():
    with pytest.raises(IdTokenRefused) as caught:
        rules.check_id_token(sign(claims(), key=EC_KEY, kid="k2", alg="ES256"), jwks=JWKS, issuer=ISSUER,
                             client_id=CLIENT, now=NOW, nonce="n-1", algorithms=("RS256",))
    assert caught.value.refusal is Refusal.ALGORITHM


def test_a_key_set_of_one_key_serves_a_token_without_kid():
    one = {"keys": [public_jwk(RSA_KEY, "k1")]}
    assert check(sign(claims(), kid=None), jwks=one)["sub"] == "u-1"
    with pytest.raises(IdTokenRefused):
        check(sign(claims(), kid=None))  # several keys: which one is not guessed


def test_pkce_is_s256_of_the_verifier():
    verifier = rules.new_verifier(bytes(range(32)))
    assert len(verifier) == 43 and set(verifier) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    with pytest.raises(ValueError):
        rules.new_verifier(bytes(16))
    assert rules.code_challenge(verifier) == base64.urlsafe_b64encode(
        hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


def test_the_authorization_request_carries_state_nonce_and_the_challenge_never_the_verifier():
    url = rules.authorization_url("https://idp/auth?kc_idp_hint=x", client_id=CLIENT, redirect_uri="https://t/cb",
                                  scopes=("openid", "groups"), state="s", nonce="n", verifier="v" * 43)
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert query == {"kc_idp_hint": "x", "response_type": "code", "client_id": CLIENT, "redirect_uri": "https://t/cb",
                     "scope": "openid groups", "state": "s", "nonce": "n", "code_challenge": rules.code_challenge("v" * 43),
                     "code_challenge_method": "S256"}
    assert "v" * 43 not in url


def test_rp_initiated_logout_only_where_the_provider_offers_it():
    assert rules.end_session_url(None, id_token="t", client_id=CLIENT, after="https://t/signin") is None
    url = rules.end_session_url("https://idp/logout", id_token="t", client_id=CLIENT, after="https://t/signin")
    assert parse_qs(urlsplit(url).query) == {"client_id": [CLIENT], "post_logout_redirect_uri": ["https://t/signin"],
                                             "id_token_hint": ["t"]}


@pytest.mark.parametrize(("expected", "given", "same"), [("a", "a", True), ("a", "b", False), (None, "a", False),
                                                         ("a", None, False), ("", "", False)])
def test_state_comparison(expected, given, same):
    assert rules.same_state(expected, given) is same


KEYS = rules.KeySet(JWKS, fetched_at=100.0)


@pytest.mark.parametrize(("keys", "kid", "now", "fetch"), [
    (None, "k1", 100.0, True),  # none yet
    (KEYS, "k1", 150.0, False),  # known key, fresh set
    (KEYS, "k1", 100.0 + 3600, True),  # the set is too old
    (KEYS, "rotated", 105.0, False),  # unknown kid, but fetched less than min_interval ago
    (KEYS, "rotated", 111.0, True),  # unknown kid: the provider rotated its keys
], ids=["no set", "known kid", "old set", "unknown kid, too soon", "unknown kid"])
def test_when_the_key_set_is_fetched_again(keys, kid, now, fetch):
    assert rules.refetch_keys(keys, {"kid": kid}, now, max_age=3600, min_interval=10) is fetch


@pytest.mark.parametrize(("status", "body", "poll", "interval"), [
    (200, {"id_token": "t"}, Poll.DONE, 5), (400, {"error": "authorization_pending"}, Poll.WAIT, 5),
    (400, {"error": "slow_down"}, Poll.SLOWER, 10), (400, {"error": "access_denied"}, Poll.DENIED, 5),
    (400, {"error": "expired_token"}, Poll.EXPIRED, 5), (400, {"error": "invalid_grant"}, Poll.FAILED, 5),
    (200, {"access_token": "no id token"}, Poll.FAILED, 5)])
def test_device_grant_polling_rfc8628(status, body, poll, interval):
    assert rules.on_poll(status, body) is poll
    assert rules.next_interval(poll, 5) == interval


def test_unverified_claims_are_for_display_only():
    assert rules.unverified_claims(sign(claims()))["sub"] == "u-1"
    assert rules.unverified_claims("garbage") == {}
