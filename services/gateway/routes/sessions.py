"""Sessions from an identity provider, for the CLI (``teto login``), and role bindings.

- ``GET /v1/identity/providers`` (no authentication: what a sign-in needs before there are credentials): each
  provider's name, display name, issuer and public CLI client.
- ``POST /v1/sessions/oidc {"provider", "id_token"}`` (no authentication: the ID token is the credential): the
  token of the device grant (audience: the provider's ``cli_client_id``; it must carry no nonce, so a browser
  sign-in's token replayed here is refused) becomes a session whose secret the CLI sends as its bearer token.
  A refused token is a failed sign-in: counted, logged, audited with the check that failed.
- ``DELETE /v1/sessions/current``: sign out (the session ends on every replica at once); ``DELETE
  /v1/sessions?actor=`` (tokens:admin): end every session of a person now.
- ``/v1/role-bindings`` (tokens:admin): roles given to one person whatever their claims; audited.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from pydantic import Field

from libs.contracts.bounds import ID_PATTERN, Actor, Id, bounded_name
from libs.contracts.commands import CommandOutcome
from libs.contracts.envelope import Model, new_id

from ..auth import AuthError, Failure, Permission, Principal, Role, refuse_if_blocked, require, source_of
from ..domain import oidc as rules
from ..domain.attempts import Scope
from ..domain.grants import Identity, NoRole
from ..errors import ApiError, not_found
from ..oidc import ProviderUnavailable
from .admin import record

PUBLIC_ROUTES = frozenset({("GET", "/v1/identity/providers"), ("POST", "/v1/sessions/oidc")})


def public_base(request: Request) -> str:
    configured = request.app.state.settings.public_url
    return (configured or str(request.base_url)).rstrip("/")


async def audit_sign_in(request: Request, who: Identity, *, provider: str, session_id: str, kind: str) -> None:
    commands = request.app.state.commands
    if commands is not None:
        await commands.record(CommandOutcome(
            command_id=new_id(), kind="sign_in", accepted=True, by="gateway",
            detail={"actor": who.actor, "provider": provider, "subject": who.subject, "session": session_id,
                    "session_kind": kind, "roles": list(who.roles), "org": who.org, "source": source_of(request),
                    "grants": [g.as_dict() for g in who.grants]}))


class OidcExchange(Model):
    provider: Id = Field(description="The provider's name")
    id_token: str = Field(min_length=1, max_length=20_000, pattern=r"^[A-Za-z0-9_=.-]+$", description="A compact JWS")


class BindingRequest(Model):
    provider: str = Field("*", pattern=r"^(\*|[a-z0-9][a-z0-9-]{0,39})$", description="A provider's name, or * for all")
    subject: bounded_name(500, min_length=1) = Field(description="The provider's sub, or the actor name")  # type: ignore[valid-type]
    role: Role
    org: Id | None = None


def register(app: FastAPI) -> None:

    @app.get("/v1/identity/providers", tags=["access"], summary="Identity providers people sign in with "
             "(no authentication)")
    async def providers(request: Request) -> list[dict[str, Any]]:
        found = getattr(request.app.state, "oidc", None)
        configs = found.configs.values() if found is not None else []
        return [{"name": c.name, "display_name": c.display_name or c.name, "issuer": c.issuer,
                 "cli_client_id": c.cli_client_id, "scopes": c.scopes} for c in configs]

    @app.post("/v1/sessions/oidc", status_code=201, tags=["access"],
              responses={401: {"description": "The ID token was refused (the reason names the check)"},
                         403: {"description": "The claims and role bindings give this person no role"},
                         404: {"description": "No such provider with a CLI client"},
                         429: {"description": "Too many failed sign-ins from this source"},
                         502: {"description": "The provider's discovery document or keys could not be fetched"}},
              summary="Exchange a device-grant ID token for a session (no authentication: the token is the "
              "credential)")
    async def exchange(request: Request, body: OidcExchange) -> dict[str, Any]:
        refuse_if_blocked(request, Scope.SOURCE, source_of(request))
        found = getattr(request.app.state, "oidc", None)
        config = found.get(body.provider) if found is not None else None
        if config is None or not config.cli_client_id:
            raise ApiError(404, "not_found", f"no provider {body.provider!r} with a CLI client")
        try:
            claims = await found.check_id_token(body.provider, body.id_token, client_id=config.cli_client_id,
                                                nonce=None)
            who = found.identity(body.provider, claims, await request.app.state.identity.bindings(body.provider))
        except ProviderUnavailable as exc:
            raise ApiError(502, "provider_unavailable", str(exc)) from None
        except rules.IdTokenRefused as exc:
            raise AuthError(401, str(exc), failure=Failure.OIDC) from None
        except NoRole as exc:
            raise AuthError(403, str(exc), actor=exc.actor, failure=Failure.OIDC) from None
        lifetime = request.app.state.settings.session_lifetime_seconds
        made = await request.app.state.identity.open_session(who, provider=body.provider, kind="cli",
                                                             lifetime=timedelta(seconds=lifetime))
        await audit_sign_in(request, who, provider=body.provider, session_id=made.id, kind="cli")
        return {"secret": made.secret, "session": made.id, "actor": who.actor, "roles": list(who.roles),
                "org": who.org, "expires_in_seconds": lifetime, "grants": [g.as_dict() for g in who.grants]}

    @app.delete("/v1/sessions/current", status_code=204, tags=["access"], summary="Sign out: end this session",
                responses={409: {"description": "An API token, not a session: revoke it instead"}})
    async def sign_out(request: Request, principal: Principal = Depends(require(Permission.READ))) -> Response:
        if principal.kind != "session":
            raise ApiError(409, "not_a_session", "this is an API token, not a session: revoke it instead")
        await request.app.state.identity.end_session(principal.token_id, "signed out")
        await record(request, "sign_out", principal, session=principal.token_id)
        return Response(status_code=204)

    @app.get("/v1/sessions", tags=["access"], summary="Live sign-in sessions (never their secrets), with each "
             "person's roles and why")
    async def live_sessions(request: Request, actor: Actor | None = Query(None, description="Only this person's"),
                            _: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> list[dict[str, Any]]:
        return jsonable_encoder(await request.app.state.identity.sessions(actor=actor))

    @app.delete("/v1/sessions", tags=["access"], summary="End every session of a person now, on every replica "
                "(someone who left; their API tokens are revoked apart)")
    async def end_sessions(request: Request, actor: Annotated[Actor, Query(description="Whose sessions")],
                           principal: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> dict[str, Any]:
        ended = await request.app.state.identity.end_sessions_of(actor, f"ended by {principal.actor}")
        await record(request, "sessions_end", principal, sessions_of=actor, ended=ended)
        return {"actor": actor, "ended": ended}

    @app.get("/v1/role-bindings", tags=["access"], summary="Role bindings")
    async def bindings(request: Request, provider: str = Query("*", pattern=r"^(\*|[a-z0-9][a-z0-9-]{0,39})$"),
                       _: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> list[dict[str, Any]]:
        return jsonable_encoder([b.__dict__ for b in await request.app.state.identity.bindings(provider)])

    @app.post("/v1/role-bindings", status_code=201, tags=["access"], summary="Give a person a role")
    async def bind(request: Request, body: BindingRequest,
                   principal: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> dict[str, Any]:
        binding_id = await request.app.state.identity.bind(provider=body.provider, subject=body.subject,
                                                           role=body.role, org=body.org, by=principal.actor)
        await record(request, "role_bind", principal, binding=binding_id, provider=body.provider,
                     subject=body.subject, role=body.role.value, org=body.org)
        return {"id": binding_id, **body.model_dump(mode="json")}

    @app.delete("/v1/role-bindings/{binding_id}", status_code=204, tags=["access"], summary="Remove a binding")
    async def unbind(request: Request, binding_id: str = Path(pattern=ID_PATTERN),
                     principal: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> Response:
        if not await request.app.state.identity.unbind(binding_id):
            raise not_found("role binding", binding_id)
        await record(request, "role_unbind", principal, binding=binding_id)
        return Response(status_code=204)
