"""The submit's answer is encoded in one pass (services/gateway/routes.json_response) and is byte for byte what
``JSONResponse(jsonable_encoder(body))`` made before: datetimes, enums, tuples, nested views, non-ASCII text."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from enum import Enum

import pytest
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from libs.contracts.jobs import JobState
from services.gateway.routes import json_response

pytestmark = pytest.mark.unit


class Colour(Enum):
    RED = "red"


JOB = {"id": "j1", "name": "fine-tune é ✓", "state": JobState.QUEUED, "created_at": datetime(2026, 12, 1, 16, 0, tzinfo=UTC),
       "updated_at": datetime(2026, 12, 1, 16, 0, 0, 123456), "spec": {"workload": {"kind": "command",
       "command": ("true", "--flag")}, "gpu_ceiling_seconds": 600.5}, "events": [{"seq": 1, "time": date(2026, 1, 2),
       "detail": {"owner": "ann", "colour": Colour.RED}}], "usage": [], "budget": None, "consumed": Decimal("1.5"),
       "ttl": timedelta(seconds=90), "workers": ["ex-1"], "flags": {"a": True, "b": False}, "big": 2**40}


@pytest.mark.parametrize("body", [JOB, [], {}, {"nested": [JOB, JOB]}, "text", None],
                         ids=["job view", "empty list", "empty object", "nested", "string", "null"])
def test_the_answer_is_what_the_two_pass_encoding_made(body):
    assert json_response(body, 201).body == JSONResponse(jsonable_encoder(body), status_code=201).body


def test_status_and_media_type_are_kept():
    response = json_response({"id": "j1"}, 201)
    assert response.status_code == 201 and response.headers["content-type"] == "application/json"


def test_a_float_json_cannot_carry_is_refused_as_before():
    with pytest.raises(ValueError):
        json_response({"x": float("nan")})
