"""Typed settings of the gateway (HTTP listener and TLS, tokens file, command wait, body limit, command
allow-list, the key that seals secret env values, the limits on failed sign-ins and bad tokens, the OpenID Connect
providers and sessions)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from libs.runtime.settings import CommonSettings, SettingsError


class GatewaySettings(CommonSettings):
    http_host: str = Field("127.0.0.1", min_length=1, max_length=255, description="Address the HTTP API binds")
    http_port: int = Field(8080, ge=0, le=65535, description="Port of the HTTP API (0 picks a free one)")
    tokens_file: Path | None = Field(None, description="API tokens (hashes only); default data_dir/tokens.json")
    command_timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="How long a request waits for a command's outcome before answering 202"
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, le=64 << 20, description="Larger request bodies get 413")
    default_page_size: int = Field(100, ge=1, le=10_000, description="Rows per list response when not asked")

    command_allow: str | None = Field(
        None, max_length=100_000, description="Allow-list of command workloads: a JSON list of argv prefixes "
        '(each a string or a list of strings, e.g. [["python3", "-m", "trainer"]]); unset: any command')
    command_allow_file: Path | None = Field(
        None, description="Allow-list file: one argv prefix per line in shell syntax (adds to command_allow)")
    secrets_key: str | None = Field(
        None, max_length=4096, description="Key sealing secret env values: a key file path or 32 bytes in base64 "
        "(teto up makes one); unset: a job with a secret value is refused")
    tls_cert_file: Path | None = Field(None, description="Serve HTTPS with this certificate chain (PEM)")
    tls_key_file: Path | None = Field(None, description="The private key of tls_cert_file (PEM)")
    status_wait_seconds: float = Field(1.0, gt=0, le=30, description="How long GET /v1/status collects the "
                                       "replicas' answers (a replica slower than this shows as missing)")
    status_part_timeout_seconds: float = Field(
        1.5, gt=0, le=30, description="How long GET /v1/status waits for each other part it asks (each NATS member, "
        "each stream's info, the database, the executors); one slower is named a problem, the rest still shown")
    status_forget_seconds: float = Field(
        120.0, gt=0, le=86_400, description="How long GET /v1/status names a replica that answered before and "
        "no longer does (unless one started since replaces it); then it is forgotten")

    auth_failures_per_source: int = Field(
        20, ge=1, le=100_000, description="Failed sign-ins and bad tokens a source address may make within "
        "auth_failure_window_seconds; the last of them blocks it for auth_block_seconds (429)")
    auth_failures_per_actor: int = Field(
        10, ge=1, le=100_000, description="The same, for failures that name an actor (a revoked token's, a panel "
        "session's without its CSRF token)")
    auth_failure_window_seconds: float = Field(60.0, gt=0, le=86_400, description="The window failures count in")
    auth_block_seconds: float = Field(60.0, gt=0, le=86_400, description="How long a source or actor stays "
                                      "blocked once it reached its limit")

    oidc_providers: str | None = Field(
        None, max_length=200_000, description="OpenID Connect providers people sign in with: a JSON list of "
        "{name, issuer, client_id, client_secret, cli_client_id, roles: [{claim, value, role, org}], org_claim, "
        "actor_claim, ...} (docs/security/identity.md); unset: API tokens only")
    oidc_providers_file: Path | None = Field(
        None, description="The same JSON in a file (read at start; adds to oidc_providers)")
    public_url: str | None = Field(
        None, max_length=2000, description="The gateway's address as browsers reach it (https://teto.example.org): "
        "the sign-in callback and post-logout addresses registered with the provider; unset: the request's own")
    oidc_starts_per_source: int = Field(
        30, ge=1, le=100_000, description="Sign-ins through a provider one source address may start within "
        "auth_failure_window_seconds (each stores a pending sign-in for 10 minutes); the next is refused (429) and "
        "blocks the source's starts for auth_block_seconds, counted by each replica")
    oidc_pending_max: int = Field(
        10_000, ge=1, le=10_000_000, description="Pending sign-ins (started, not finished, not expired) the "
        "installation holds at most, all replicas together; a start beyond it is refused (429) until the oldest "
        "expires")
    session_lifetime_seconds: float = Field(
        8 * 3600.0, gt=0, le=30 * 86_400, description="How long a sign-in session lasts (panel and teto login) "
        "before the person signs in again")

    def check(self) -> None:
        super().check()
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise SettingsError("TETO_TLS_CERT_FILE and TETO_TLS_KEY_FILE go together: set both or neither")

    @property
    def effective_tokens_file(self) -> Path:
        return self.tokens_file or (self.data_dir / "tokens.json")
