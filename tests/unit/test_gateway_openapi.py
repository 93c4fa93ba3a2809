"""The OpenAPI document lists every status each route can answer (services/gateway/openapi.py), with the error
body's schema, so a client generated from it knows the 404/409/202/413/401/403/422/429/503 answers."""

from __future__ import annotations

import pytest

from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings

pytestmark = pytest.mark.unit

DOC = create_app(GatewaySettings()).openapi()
OPERATIONS = [(f"{method.upper()} {path}", op) for path, item in DOC["paths"].items() for method, op in item.items()]
COMMANDS = {"POST /v1/jobs", "POST /v1/jobs/{job_id}/cancel", "POST /v1/jobs/{job_id}/requeue",
            "PUT /v1/policies/gang", "POST /v1/health-checks", "POST /v1/nodes/{node_id}/drain",
            "POST /v1/nodes/{node_id}/undrain"}


@pytest.mark.parametrize(("name", "op"), OPERATIONS, ids=[n for n, _ in OPERATIONS])
def test_every_status_a_route_can_answer_is_documented(name, op):
    codes = set(op["responses"])
    assert "413" in codes  # the body limit runs before any route
    if name not in {"GET /healthz", "GET /v1/identity/providers"}:  # asked before anyone has credentials
        assert {"401", "403", "429", "503"} <= codes  # 429: a source or actor blocked for failed attempts
        assert op["responses"]["429"]["headers"]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}
    else:
        assert not {"401", "403", "429"} & codes  # no token is asked for, so none can fail
    if "{" in name:
        assert {"404", "422"} <= codes
    if name in COMMANDS:
        assert {"202", "404", "409", "422"} <= codes
    for code, response in op["responses"].items():
        if code.startswith(("4", "5")):
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}


def test_the_command_routes_are_the_ones_marked_as_commands():
    assert COMMANDS <= {name for name, _ in OPERATIONS}


def test_routes_sharing_one_responses_constant_each_document_the_error_body():
    # Two routes declared with the same module-level dict (as the tenancy routes are): the first app built in a
    # process documented the error body for the first route only, and the second's 409 had no schema.
    from fastapi import FastAPI

    from services.gateway.openapi import document_statuses

    shared = {409: {"description": "Refused"}}
    app = FastAPI()

    @app.put("/a/{name}", responses=shared)
    async def put_a(name: str) -> dict:
        return {}

    @app.put("/b/{name}", responses=shared)
    async def put_b(name: str) -> dict:
        return {}

    document_statuses(app)
    paths = app.openapi()["paths"]
    for path in ("/a/{name}", "/b/{name}"):
        assert paths[path]["put"]["responses"]["409"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"}
    assert shared == {409: {"description": "Refused"}}  # the module's constant is left as it was
