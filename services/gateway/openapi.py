"""Every status a route can answer is in the OpenAPI document, derived from what the route is.

The answers do not come from the route's own code alone: the body limit (413) runs before any route, the
limit on failed sign-ins and bad tokens (429, with Retry-After), the token check (401) and the permission check
(403) before its body is read, validation (422) before it runs,
an unknown id in the path is 404, a database or bus that is down is 503, and a command route answers with
its outcome (refused 409/404/422, pending 202). So the statuses are attached after the routes are registered,
from each route's declarations, and a client generated from ``/openapi.json`` knows every answer it can get.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.utils import create_model_field
from pydantic import BaseModel, Field

from .auth import route_permission
from .routes import COMMAND_KEY


class FieldError(BaseModel):
    field: str = Field(description="Where: body.workers, query.limit, header.idempotency-key, ...")
    message: str
    type: str


class ErrorBody(BaseModel):
    """Every error answer: a short code, a reason a person reads, and for 422 the fields at fault."""

    error: str = Field(description="invalid, unauthorized, forbidden, too_many_attempts, not_found, refused, "
                                   "too_large, unavailable")
    reason: str
    errors: list[FieldError] | None = Field(None, description="422: one entry per field at fault")
    limit_bytes: int | None = Field(None, description="413: the largest body accepted")
    permission: str | None = Field(None, description="403: the permission missing")
    retry_after_seconds: float | None = Field(None, description="429: seconds until the block ends")


_WHY = {
    202: "Accepted for processing: no outcome in time; the command is durable and will still be processed",
    401: "No token, or a token that is unknown or revoked",
    403: "The token's role lacks the permission named in the answer",
    404: "No such object",
    409: "Refused by the owner of the fact (wrong state, duplicate); the reason says why",
    413: "Request body larger than the limit (named in the answer), which keeps every message within the bus's",
    422: "Invalid request: the answer names each field at fault",
    429: "Too many failed sign-ins or bad tokens from this source address or for this actor: blocked until "
         "Retry-After (also retry_after_seconds) has passed; the credentials are not looked at meanwhile",
    503: "The database, the bus or a service the decision needs is unavailable; nothing was changed",
}


def _statuses(route: APIRoute, permission: Any) -> set[int]:
    codes = {413}
    if route.path == "/healthz":
        return codes
    codes.add(503)
    if permission is not None:
        codes |= {401, 403, 429}  # a blocked source or actor is refused before its token is looked at
    dep = route.dependant
    if dep.path_params or dep.query_params or dep.header_params or dep.body_params:
        codes.add(422)
    if dep.path_params:
        codes.add(404)
    if (route.openapi_extra or {}).get(COMMAND_KEY):
        codes |= {202, 404, 409, 422}
    return codes


def document_statuses(app: FastAPI) -> None:
    """Attach every status each route can answer to its OpenAPI responses (before the schema is first built)."""
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        # Routes may share one responses mapping (a module's constant): each gets its own copy, so the model
        # attached below (and its response field) is made for every route, not only the first to meet it.
        route.responses = {code: dict(entry) for code, entry in route.responses.items()}
        # What the route's nature implies, plus the errors it declares itself (a replay's 409, say).
        declared = {int(c) for c in route.responses if str(c).isdigit() and int(c) >= 400}
        for code in sorted(_statuses(route, route_permission(route)) | declared):
            if code == route.status_code:
                continue
            entry = route.responses.setdefault(code, {})
            entry.setdefault("description", _WHY.get(code, "Refused; the reason says why"))
            if code == 429:
                entry.setdefault("headers", {"Retry-After": {"description": "Seconds until the block ends",
                                                             "schema": {"type": "integer", "minimum": 1}}})
            if code != 202 and "model" not in entry:
                # FastAPI builds the schema of an extra response from route.response_fields, made at
                # registration: a model attached later needs its field made the same way.
                entry["model"] = ErrorBody
                route.response_fields[code] = create_model_field(
                    name=f"Response_{code}_{route.unique_id}", type_=ErrorBody, mode="serialization")
