"""A command's answer (services/gateway/routes.json_response: the job a submit, cancel or requeue changed) is
encoded in one pass and is byte for byte what FastAPI makes of the same body returned by a GET route
(``-> dict[str, Any]``: pydantic's JSON serializer), so a submit's 201 reads exactly like ``GET /v1/jobs/{id}``:
datetimes (``Z``), enums, tuples, nested views, non-ASCII text, floats JSON cannot carry."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from libs.contracts.jobs import JobState
from services.gateway.routes import json_response

pytestmark = pytest.mark.unit


class Colour(Enum):
    RED = "red"


JOB = {"id": "j1", "name": "fine-tune é ✓", "state": JobState.QUEUED, "created_at": datetime(2026, 12, 1, 16, 0, tzinfo=UTC),
       "updated_at": datetime(2026, 12, 1, 16, 0, 0, 123456, tzinfo=UTC), "naive": datetime(2026, 12, 1, 16, 0, 0, 120000),
       "zoned": datetime(2026, 12, 1, 16, 0, tzinfo=timezone(timedelta(hours=2))),
       "spec": {"workload": {"kind": "command", "command": ("true", "--flag")}, "gpu_ceiling_seconds": 600.5},
       "events": [{"seq": 1, "time": date(2026, 1, 2), "detail": {"owner": "ann", "colour": Colour.RED}}],
       "usage": [], "budget": None, "consumed": Decimal("1.5"), "ttl": timedelta(seconds=90), "workers": ["ex-1"],
       "flags": {"a": True, "b": False}, "big": 2**40, "tiny": 1e-7, "huge": 1e16, "nan": float("nan")}


def _as_a_get_route_answers(body: dict[str, Any]) -> bytes:
    app = FastAPI()

    @app.get("/x")
    async def get() -> dict[str, Any]:
        return body

    return TestClient(app).get("/x").content


@pytest.mark.parametrize("body", [JOB, {}, {"nested": [JOB, JOB]}, {"text": "a\"b\n\u2028"}],
                         ids=["job view", "empty object", "nested", "escapes"])
def test_the_answer_is_what_a_get_route_makes_of_the_same_body(body):
    assert json_response(body, 201).body == _as_a_get_route_answers(body)


def test_datetimes_read_as_the_get_shows_them():
    assert b'"created_at":"2026-12-01T16:00:00Z"' in json_response(JOB).body


def test_status_and_media_type_are_kept():
    response = json_response({"id": "j1"}, 201)
    assert response.status_code == 201 and response.headers["content-type"] == "application/json"
