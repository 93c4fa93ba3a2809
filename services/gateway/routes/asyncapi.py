"""``GET /asyncapi.json`` and ``GET /asyncapi`` (public, like ``/openapi.json``): the bus's AsyncAPI 3 document, as
FastStream generated it from the services' declarations (``teto contracts asyncapi`` writes it beside the contracts,
libs/contracts/asyncapi.json), and the same as a plain HTML page for a person (domain/catalogue_page.py)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from ..domain.catalogue_page import render


@cache
def document() -> dict[str, Any]:
    return json.loads(resources.files("libs.contracts").joinpath("asyncapi.json").read_text())


@cache
def page() -> str:
    return render(document())


def register(app: FastAPI) -> None:

    @app.get("/asyncapi.json", tags=["meta"], include_in_schema=False)
    async def asyncapi_json() -> JSONResponse:
        return JSONResponse(document())

    @app.get("/asyncapi", tags=["meta"], include_in_schema=False)
    async def asyncapi_page() -> HTMLResponse:
        return HTMLResponse(page())
