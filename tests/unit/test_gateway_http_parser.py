"""The gateway's HTTP server parses requests with httptools (uvicorn's "auto" choice once it is installed, a
dependency of the project), not the pure-Python h11 parser (docs/performance.md, submit latency)."""

from __future__ import annotations

import pytest
import uvicorn

pytestmark = pytest.mark.unit


async def _app(scope, receive, send) -> None:  # pragma: no cover - never called
    raise AssertionError


def test_the_gateway_s_server_config_picks_the_httptools_parser():
    config = uvicorn.Config(_app, host="127.0.0.1", port=0, log_level="warning", access_log=False, lifespan="off")
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
