"""A real OpenID Provider for the identity tests: ``oidc-provider`` (npm, a certified OpenID Provider) run with
the system's Node.js (tests/support/oidc_provider.mjs).

The package is installed once, at a pinned version, into a cache directory (``TETO_TEST_CACHE``, default
``~/.cache/teto-tests``) with ``npm install`` when it is missing, as tests/panel/browser.py installs Chromium;
without ``node``/``npm`` the tests stop with the line to run. The provider's signing key is made here, so a test
can also sign tokens with it (expired, for another audience, with an old nonce) and show which check refuses them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from libs.runtime.ports import free_port_block
from tests.support.services import eventually_blocking

VERSION = "9.13.3"
SCRIPT = Path(__file__).with_name("oidc_provider.mjs")
PANEL_SECRET = "panel-client-secret-for-tests-only"


class ProviderMissing(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TETO_TEST_CACHE", Path.home() / ".cache" / "teto-tests")) / f"oidc-provider-{VERSION}"


def ensure_package() -> Path:
    """The path of the installed package's entry point, installing it (once) when missing."""
    root = cache_dir()
    entry = root / "node_modules" / "oidc-provider" / "lib" / "index.js"
    if entry.exists():
        return entry
    if not shutil.which("node") or not shutil.which("npm"):
        raise ProviderMissing("the identity tests need Node.js 20+ and npm (Debian: apt-get install -y nodejs npm)")
    root.mkdir(parents=True, exist_ok=True)
    (root / "package.json").write_text('{"private": true}\n')
    result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(root),
                             f"oidc-provider@{VERSION}"], capture_output=True, text=True)
    if result.returncode != 0 or not entry.exists():
        raise ProviderMissing(f"npm install oidc-provider@{VERSION} failed ({result.returncode}): "
                              f"{result.stderr[-2000:]}")
    return entry


def private_jwk(kid: str) -> tuple[dict[str, Any], Any]:
    """A new RSA signing key as a private JWK (for the provider) and as a key object (for the test)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    jwk.pop("key_ops", None)  # the provider also verifies with it (an id_token_hint): "sign" alone would forbid that
    jwk.update(kid=kid, use="sig", alg="RS256")
    return jwk, key


@dataclass
class Provider:
    issuer: str
    key: Any  # the provider's signing key (private): tests sign their own tokens with it
    kid: str
    process: subprocess.Popen
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    config_body: dict[str, Any] = field(default_factory=dict)

    def rotate(self, kid: str) -> None:
        """The provider rotates its keys: restarted on its port signing with a new key, the old one still
        published (as providers do while old tokens live). Its in-memory sessions are lost."""
        stop(self.process)
        jwk, key = private_jwk(kid)
        self.config_body["jwks"]["keys"].insert(0, jwk)
        self.env["OIDC_CONFIG"] = json.dumps(self.config_body)
        self.process = start(self.env, self.log, self.issuer)
        self.key, self.kid = key, kid

    def sign(self, claims: dict[str, Any], *, key: Any = None, kid: str | None = None) -> str:
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})

    def config(self, *, roles: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """The gateway's provider entry for this provider (TETO_OIDC_PROVIDERS)."""
        return {"name": "hospital", "display_name": "Hospital", "issuer": self.issuer, "client_id": "teto-panel",
                "client_secret": PANEL_SECRET, "cli_client_id": "teto-cli",
                "scopes": ["openid", "profile", "groups", "org", "offline_access"],
                "roles": roles if roles is not None else [
                    {"claim": "groups", "value": "teto-operators", "role": "operator"},
                    {"claim": "groups", "value": "teto-viewers", "role": "viewer"}],
                "org_claim": "org", "keys_refetch_seconds": 0}


@contextlib.contextmanager
def oidc_provider(root: Path, *, gateway_urls: list[str]) -> Iterator[Provider]:
    """The provider on a free loopback port, with the panel's callback registered for each gateway URL."""
    entry = ensure_package()
    port = free_port_block(1)
    jwk, key = private_jwk("test-key-1")
    config = {"jwks": {"keys": [jwk]}, "panel_secret": PANEL_SECRET,
              "redirect_uris": [f"{u}/signin/oidc/hospital/callback" for u in gateway_urls],
              "post_logout_redirect_uris": [f"{u}/signin" for u in gateway_urls]}
    root.mkdir(parents=True, exist_ok=True)
    log = root / "oidc-provider.log"
    env = {**os.environ, "OIDC_MODULE": str(entry), "OIDC_PORT": str(port), "OIDC_CONFIG": json.dumps(config)}
    issuer = f"http://127.0.0.1:{port}"
    provider = Provider(issuer=issuer, key=key, kid="test-key-1", process=start(env, log, issuer), log=log, env=env,
                        config_body=config)
    try:
        yield provider
    finally:
        stop(provider.process)


def start(env: dict[str, str], log: Path, issuer: str) -> subprocess.Popen:
    with open(log, "ab") as out:
        process = subprocess.Popen(["node", str(SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"oidc-provider exited: {log.read_text()[-3000:]}")
        return httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200

    try:
        eventually_blocking(answers, timeout=30, what=lambda: f"oidc-provider to start: {log.read_text()[-3000:]}",
                            every=0.1, ignoring=(httpx.HTTPError,))
    except BaseException:
        stop(process)
        raise
    return process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
