"""The FastAPI application: wiring of routes, the error shapes, and the order of refusals.

Every error body is JSON ``{"error": <code>, "reason": <what a person reads>, ...}``. A request is refused in
this order: body too large (413), too many failed attempts from its source or for its actor (429, throttle.py), not
authenticated (401), not permitted (403, naming the permission), invalid
(422, naming the field), unknown id (404). FastAPI parses a JSON body before it runs dependencies, so the
validation handler re-checks the token and permission first: a caller without access never learns what a valid
body looks like. Refusals of command endpoints are recorded as gateway outcomes, so the audit log holds them;
so are failed credentials (kind ``authenticate``; the sign-in form's ``sign_in``), counted per source and
actor.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import asyncpg
import nats.errors
from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from libs.runtime import tracing
from libs.runtime.sealing import SealingError, load_key
from libs.runtime.service import Runtime
from libs.runtime.settings import SettingsError

from .auth import AuthError, Permission, Principal, TokenStore, require, route_permission
from .commands import BusUnavailable, Commands
from .dead_letters import DeadLetters
from .errors import ApiError
from .identity import DbIdentity, FileIdentity
from .oidc import ProviderConfigError, Providers, load_providers
from .domain.payload import body_limit
from .limits import BodyLimit, JsonBodies
from .openapi import document_statuses
from .reads import Reads
from .scoping import AllowListError, load_allow_list
from .logs import JobLogs
from .routes import admin, jobs, logs, policies, nodes, sessions, tokens
from . import panel
from .routes import asyncapi as asyncapi_routes
from .routes import dead_letters as dead_letter_routes
from .routes import status as status_routes
from .status import StatusGatherer
from .throttle import attempts_for, record_failure
from .routes import tenancy as tenancy_routes
from .settings import GatewaySettings
from .timing import RouteTimer

log = logging.getLogger(__name__)

from .routes import COMMAND_KEY


def route_command(request: Request) -> str | None:
    route = request.scope.get("route")
    extra = getattr(route, "openapi_extra", None) or {}
    return extra.get(COMMAND_KEY)


def describe_errors(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """One readable line naming each field (``body.workers``), and the list in a JSON-safe form."""
    items = []
    for err in errors[:20]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", ""))
        ctx = err.get("ctx") or {}
        if err.get("type") == "json_invalid" and "error" in ctx:
            msg = f"{msg}: {ctx['error']}"
        items.append({"field": loc, "message": msg, "type": str(err.get("type", ""))})
    reason = "; ".join(f"{i['field']}: {i['message']}" for i in items) or "invalid request"
    return reason, items


async def _audit_refusal(request: Request, reason: str, principal: Principal | None, **detail: Any) -> None:
    kind = route_command(request)
    commands: Commands | None = request.app.state.commands
    if kind and commands is not None:
        job_id = request.path_params.get("job_id")
        await commands.refuse(kind, principal.actor if principal else None, reason, job_id=job_id,
                              detail={"path": request.url.path, **detail})


def whoami_body(principal: Principal) -> dict[str, Any]:
    return {"actor": principal.actor, "role": principal.role.value, "token_id": principal.token_id,
            "kind": principal.kind, "roles": [r.value for r in principal.all_roles], "org": principal.org,
            "project": principal.project,
            "permissions": principal.permissions(), "grants": [g.as_dict() for g in principal.grants]}


def native_telemetry() -> dict[str, bool]:
    """FastAPI's own OpenTelemetry (the request's server span, which the command's trace descends from) is on
    when a tracer provider is installed as the app is made (``tracing.setup`` runs in ``Runtime.open``, before);
    Teto installs no meter or logger provider, so FastAPI's HTTP metrics and logs are off. Left to itself,
    FastAPI asks the three global providers on every request whether one has appeared since (1-2 % of the
    gateway's busy time under a stream of submits, docs/performance.md)."""
    return {"tracing": tracing.installed(), "metrics": False, "logs": False}


def create_app(settings: GatewaySettings, runtime: Runtime | None = None, *, reads: Any = None,
               commands: Any = None, dead_letters: Any = None, job_logs: Any = None) -> FastAPI:
    """The API. ``runtime`` connects it to PostgreSQL and NATS; tests may pass ``reads``/``commands``/
    ``dead_letters``/``job_logs`` fakes."""
    # Every body is JSON whatever its Content-Type (JsonBodies, limits.py; curl -d sends form-urlencoded).
    # redirect_slashes=False: "/v1/jobs/" (an empty or "/"-decoded id) is 404, not a 307 to another resource.
    app = FastAPI(title="Teto gateway", version="1", strict_content_type=False, redirect_slashes=False,
                  telemetry=native_telemetry(),
                  description="Submit and watch GPU fine-tuning jobs. Authenticate with `Authorization: Bearer`.")
    # What the gateway accepts must fit on the bus once wrapped in the largest message a submit causes.
    max_body = settings.max_body_bytes if runtime is None else body_limit(runtime.nc.max_payload,
                                                                          settings.max_body_bytes)
    # Inside JsonBodies (which hands on a copy of the scope): it must see the route the router writes there.
    app.add_middleware(RouteTimer)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, max_body_bytes=max_body)  # added last: runs first
    app.state.settings = settings
    app.state.max_body_bytes = max_body
    app.state.tokens = TokenStore(settings.effective_tokens_file)
    # Tokens and sessions in the gateway's schema, shared by every replica; without a database, the file alone.
    app.state.identity = (DbIdentity(runtime.pool, settings.effective_tokens_file) if runtime is not None
                          else FileIdentity(app.state.tokens))
    app.state.attempts = attempts_for(settings)  # failed sign-ins and bad tokens (throttle.py)
    app.state.monotonic = time.monotonic
    try:
        app.state.command_allow = load_allow_list(settings.command_allow, settings.command_allow_file)
        app.state.secrets_key = load_key(settings.secrets_key) if settings.secrets_key else None
    except AllowListError as exc:
        raise SettingsError(f"TETO_COMMAND_ALLOW / TETO_COMMAND_ALLOW_FILE: {exc}") from None
    except SealingError as exc:
        raise SettingsError(str(exc)) from None
    try:
        configs = load_providers(settings.oidc_providers, settings.oidc_providers_file)
    except (ProviderConfigError, OSError) as exc:
        raise SettingsError(f"TETO_OIDC_PROVIDERS / TETO_OIDC_PROVIDERS_FILE: {exc}") from None
    app.state.oidc = Providers(configs) if configs else None  # OpenID Connect sign-in (oidc.py)
    app.state.reads = reads if reads is not None else (Reads(runtime.pool, runtime) if runtime else None)
    app.state.commands = commands if commands is not None else (
        Commands(runtime, settings.command_timeout_seconds) if runtime else None)
    app.state.dead_letters = dead_letters if dead_letters is not None else (DeadLetters(runtime) if runtime else None)
    app.state.job_logs = job_logs if job_logs is not None else (JobLogs(runtime) if runtime else None)
    app.state.status = (StatusGatherer(runtime, app.state.reads, settings.status_wait_seconds,
                                       settings.status_part_timeout_seconds, settings.status_forget_seconds)
                        if runtime is not None else None)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(jsonable_encoder(exc.body), status_code=exc.status)

    @app.exception_handler(AuthError)
    async def on_auth_error(request: Request, exc: AuthError) -> JSONResponse:
        if exc.failure is not None:  # credentials that did not hold: counted, logged, audited once
            await record_failure(request, exc.failure, exc.reason, exc.actor)
        elif exc.status == 403:
            await _audit_refusal(request, exc.reason, getattr(request.state, "principal", None),
                                 permission=exc.permission)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        if exc.status == 429 and exc.retry_after is not None:
            headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def invalid(request: Request, errors: list[dict[str, Any]]) -> JSONResponse:
        route = request.scope.get("route")
        permission = route_permission(route) if isinstance(route, APIRoute) else None
        if permission is not None:
            try:
                await require(permission).check(request)
            except AuthError as denied:
                return await on_auth_error(request, denied)
        reason, items = describe_errors(errors)
        await _audit_refusal(request, reason, getattr(request.state, "principal", None))
        return JSONResponse({"error": "invalid", "reason": reason, "errors": items}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await invalid(request, list(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and request.scope.get("route") is not None:
            # FastAPI's answer to a body it could not parse at all (bad UTF-8, nesting deeper than the parser's
            # recursion limit): an invalid body like any other, named as such.
            cause = type(exc.__cause__).__name__ if exc.__cause__ else "unparseable"
            return await invalid(request, [{"loc": ("body",), "msg": f"not valid JSON ({cause})",
                                            "type": "json_invalid"}])
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        body: dict[str, Any] = {"error": codes.get(exc.status_code, "error"), "reason": str(exc.detail)}
        if exc.status_code == 413:
            body.update(reason=f"request body larger than {max_body} bytes", limit_bytes=max_body)
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(asyncpg.PostgresError)
    @app.exception_handler(asyncpg.InterfaceError)
    @app.exception_handler(OSError)
    async def on_db_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("read failed: %r", exc)
        return JSONResponse({"error": "unavailable", "reason": f"the database is unavailable: {type(exc).__name__}"},
                            status_code=503)

    @app.exception_handler(BusUnavailable)
    async def on_bus_down(request: Request, exc: BusUnavailable) -> JSONResponse:
        return JSONResponse({"error": "unavailable", "reason": str(exc)}, status_code=503)

    # nats-py's errors, its timeouts included (which are also OSErrors: without this they read as the database's).
    @app.exception_handler(nats.errors.Error)
    async def on_bus_error(request: Request, exc: Exception) -> JSONResponse:
        log.warning("bus request failed: %r", exc)
        return JSONResponse({"error": "unavailable", "reason": f"the bus did not answer: {type(exc).__name__}"},
                            status_code=503)

    @app.get("/healthz", tags=["meta"], summary="Liveness (no authentication)")
    async def healthz() -> dict[str, Any]:
        connected = app.state.reads is not None
        return {"status": "ok", "connected": connected}

    @app.get("/v1/whoami", tags=["meta"], summary="Who is asking: actor, roles, organisation, permissions, and "
             "the claim, binding or token each role and the organisation came from")
    async def whoami(principal: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        return whoami_body(principal)

    jobs.register(app)
    logs.register(app)
    admin.register(app)
    tokens.register(app)
    sessions.register(app)
    policies.register(app)
    nodes.register(app)
    dead_letter_routes.register(app)
    asyncapi_routes.register(app)  # the bus's catalogue, before the panel takes the rest of /
    panel.mount(app, runtime)  # the operator panel under / (services/gateway/panel)
    status_routes.register(app)
    tenancy_routes.register(app)
    document_statuses(app)
    return app
