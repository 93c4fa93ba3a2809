"""OpenID Connect providers at the edge: their configuration, discovery documents and key sets (fetched with
httpx, cached, fetched again when a token names a key the set lacks: the provider rotated its keys), and the
authorization code exchange. Every check of an ID token and every rule of the claim mapping is pure
(domain/oidc.py, domain/grants.py); this module only fetches what they need.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field, ValidationError

from .domain import oidc as rules
from .domain.grants import Binding, ClaimMapping, Identity, RoleRule, map_claims

DISCOVERY_MAX_AGE = 3600.0  # a discovery document and key set are fetched again after this long
KEYS_MIN_INTERVAL = 10.0  # an unknown kid fetches the key set at most this often


class RuleConfig(BaseModel):
    claim: str = Field(min_length=1, max_length=200)
    value: str = Field(min_length=1, max_length=500)
    role: str = Field(pattern=r"^(viewer|submitter|operator|auditor|admin)$")
    org: str | None = Field(None, max_length=200, description="The organisation it grants; * for fleet-wide")


class ProviderConfig(BaseModel):
    """One identity provider (docs/security/identity.md has a worked Keycloak configuration)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$", description="In URLs: /signin/oidc/<name>")
    display_name: str = Field("", max_length=100)
    issuer: str = Field(min_length=1, max_length=2000)
    client_id: str = Field(min_length=1, max_length=500, description="The panel's client (authorization code)")
    client_secret: str | None = Field(None, max_length=4096)
    client_secret_file: Path | None = None
    cli_client_id: str | None = Field(None, max_length=500, description="The public client of `teto login`")
    scopes: list[str] = Field(default_factory=lambda: ["openid", "profile", "email", "groups"])
    roles: list[RuleConfig] = Field(default_factory=list)
    org_claim: str | None = None
    actor_claim: str = "preferred_username"
    actor_prefix: str = Field("", max_length=40, pattern=r"^[A-Za-z0-9._:-]*$", description="Put before every "
                              "actor this provider names, to keep providers' people apart")
    default_org: str | None = "default"
    algorithms: list[str] = Field(default_factory=lambda: list(rules.ALLOWED_ALGORITHMS))
    leeway_seconds: float = Field(60.0, ge=0, le=600)
    keys_refetch_seconds: float = Field(KEYS_MIN_INTERVAL, ge=0, le=3600, description="A token naming an unknown "
                                        "key fetches the key set again at most this often")

    def secret(self) -> str | None:
        if self.client_secret_file is not None:
            return self.client_secret_file.read_text().strip()
        return self.client_secret

    def mapping(self) -> ClaimMapping:
        return ClaimMapping(rules=tuple(RoleRule(r.claim, r.value, r.role, r.org) for r in self.roles),
                            org_claim=self.org_claim, actor_claim=self.actor_claim, default_org=self.default_org,
                            actor_prefix=self.actor_prefix)


class ProviderConfigError(ValueError):
    pass


def load_providers(text: str | None, path: Path | None) -> dict[str, ProviderConfig]:
    raw: list[Any] = []
    for source, body in (("TETO_OIDC_PROVIDERS", text), (str(path), path.read_text() if path else None)):
        if not body:
            continue
        try:
            found = json.loads(body)
        except ValueError as exc:
            raise ProviderConfigError(f"{source}: not JSON: {exc}") from None
        raw += found if isinstance(found, list) else [found]
    out: dict[str, ProviderConfig] = {}
    for item in raw:
        try:
            provider = ProviderConfig.model_validate(item)
        except ValidationError as exc:
            raise ProviderConfigError(f"OpenID Connect provider: {exc.errors()[0].get('loc')}: "
                                      f"{exc.errors()[0].get('msg')}") from None
        if provider.name in out:
            raise ProviderConfigError(f"two OpenID Connect providers named {provider.name!r}")
        out[provider.name] = provider
    return out


class ProviderUnavailable(Exception):
    """The provider's discovery document, keys or token endpoint did not answer as it should."""


@dataclass
class _Cached:
    discovery: dict[str, Any] | None = None
    discovered_at: float = 0.0
    keys: rules.KeySet | None = None


@dataclass
class Providers:
    configs: dict[str, ProviderConfig]
    clock: Any = time.monotonic
    client: httpx.AsyncClient | None = None
    _cache: dict[str, _Cached] = field(default_factory=dict)

    def _http(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=10.0, follow_redirects=False)
        return self.client

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def get(self, name: str) -> ProviderConfig | None:
        return self.configs.get(name)

    async def discovery(self, name: str) -> dict[str, Any]:
        config = self.configs[name]
        cached = self._cache.setdefault(name, _Cached())
        now = self.clock()
        if cached.discovery is None or now - cached.discovered_at >= DISCOVERY_MAX_AGE:
            url = config.issuer.rstrip("/") + "/.well-known/openid-configuration"
            doc = await self._json("GET", url)
            if doc.get("issuer") != config.issuer:  # OpenID Connect Discovery 4.3: it must be the same issuer
                raise ProviderUnavailable(f"{url} names issuer {doc.get('issuer')!r}, not {config.issuer!r}")
            cached.discovery, cached.discovered_at = doc, now
        return cached.discovery

    async def key_set(self, name: str, header: Mapping[str, Any]) -> Mapping[str, Any]:
        cached = self._cache.setdefault(name, _Cached())
        now = self.clock()
        min_interval = self.configs[name].keys_refetch_seconds
        if rules.refetch_keys(cached.keys, header, now, max_age=DISCOVERY_MAX_AGE, min_interval=min_interval):
            doc = await self.discovery(name)
            cached.keys = rules.KeySet(await self._json("GET", doc["jwks_uri"]), now)
        assert cached.keys is not None
        return cached.keys.jwks

    async def check_id_token(self, name: str, token: str, *, client_id: str, nonce: str | None) -> dict[str, Any]:
        config = self.configs[name]
        header = rules.header_of(token)
        jwks = await self.key_set(name, header)
        return rules.check_id_token(token, jwks=jwks, issuer=config.issuer, client_id=client_id, now=time.time(),
                                    nonce=nonce, leeway=config.leeway_seconds, algorithms=tuple(config.algorithms))

    async def exchange(self, name: str, *, code: str, verifier: str, redirect_uri: str) -> dict[str, Any]:
        config = self.configs[name]
        doc = await self.discovery(name)
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "code_verifier": verifier, "client_id": config.client_id}
        secret = config.secret()
        auth = (config.client_id, secret) if secret else None
        return await self._json("POST", doc["token_endpoint"], data=form, auth=auth)

    def identity(self, name: str, claims: Mapping[str, Any], bindings: list[Binding]) -> Identity:
        return map_claims(claims, self.configs[name].mapping(), bindings)

    async def _json(self, method: str, url: str, **kw: Any) -> dict[str, Any]:
        try:
            resp = await self._http().request(method, url, **kw)
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(f"{method} {url}: {type(exc).__name__}: {exc}") from None
        try:
            body = resp.json()
        except ValueError:
            raise ProviderUnavailable(f"{method} {url}: {resp.status_code}, not JSON") from None
        if resp.status_code != 200 or not isinstance(body, dict):
            error = body.get("error_description") or body.get("error") if isinstance(body, dict) else None
            raise ProviderUnavailable(f"{method} {url}: {resp.status_code} {error or ''}".strip())
        return body
