"""FastAPI's own OpenTelemetry in the gateway (services/gateway/api.native_telemetry): each request's server span
when a tracer provider is installed as the app is made; with none, no request asks the global providers whether
one has appeared since (FastAPI's default: three look-ups a request, docs/performance.md item 2)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings
from tests.support.spans import kept_spans

pytestmark = pytest.mark.unit


def test_without_a_tracer_provider_no_request_looks_for_one(tmp_path, monkeypatch):
    asked = []

    def provider():
        asked.append(1)
        return trace.NoOpTracerProvider()

    monkeypatch.setattr(trace, "get_tracer_provider", provider)
    app = create_app(GatewaySettings.from_env(env={}, data_dir=tmp_path))
    at_start = len(asked)
    with TestClient(app) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
    assert len(asked) == at_start


def test_with_a_tracer_provider_each_request_has_its_server_span(tmp_path):
    with kept_spans() as exporter:
        app = create_app(GatewaySettings.from_env(env={}, data_dir=tmp_path))
        with TestClient(app) as client:
            assert client.get("/healthz").status_code == 200
        served = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert [s.name for s in served] == ["GET /healthz"]
