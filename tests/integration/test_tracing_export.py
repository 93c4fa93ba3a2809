"""With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, a Teto process sends its spans over OTLP/HTTP to that endpoint (a
stand-in collector here, a local HTTP server that records what is posted to ``/v1/traces``); with nothing set it
installs no exporter at all. Each runs in its own process: a process's tracer provider can be set only once."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
import sys
from libs.runtime import tracing
installed = tracing.setup("queue")
print("installed" if installed else "not installed", flush=True)
with tracing.continued(None, "queue submit", command_id="c-export-1"):
    pass
from opentelemetry import trace
provider = trace.get_tracer_provider()
getattr(provider, "shutdown", lambda: None)()  # flush the batch before exiting
"""


class _Collector(http.server.BaseHTTPRequestHandler):
    posts: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - the handler's protocol
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.posts.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:  # noqa: ANN002 - quiet
        pass


@pytest.fixture
def collector():
    _Collector.posts = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Collector.posts
    server.shutdown()


def _run(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_spans_go_to_the_otlp_endpoint_the_standard_variable_names(collector):
    url, posts = collector
    assert _run({"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SERVICE_NAME": "teto-queue-east"}).strip() == "installed"
    (path, content_type, body) = posts[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    assert b"queue submit" in body and b"c-export-1" in body and b"teto-queue-east" in body


def test_nothing_is_installed_or_sent_when_no_endpoint_is_set(collector):
    _, posts = collector
    assert _run({}).strip() == "not installed"
    assert posts == []
