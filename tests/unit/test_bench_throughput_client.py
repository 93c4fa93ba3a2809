"""The throughput bench submits and polls through one client whose connections are kept alive
(bench/bench_throughput.py): a client made per request cost the bench's own process about 36 ms of CPU a submit
and bounded the run's submits, on the cores the stack under test needs."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from bench import bench_throughput

pytestmark = pytest.mark.unit


class _Gateway(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn speaks it
    connections = 0
    lock = threading.Lock()
    seen: list[tuple[str, str, str]] = []

    def setup(self) -> None:  # once per TCP connection
        super().setup()
        with self.lock:
            type(self).connections += 1

    def _answer(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        self._answer({"id": body["name"]}, 201)

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(("GET", self.path, self.headers.get("Authorization")))
        self._answer([])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    _Gateway.connections, _Gateway.seen = 0, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}", headers={"Authorization": "Bearer t"})
    server.shutdown()
    server.server_close()


def test_submits_and_polls_share_kept_alive_connections_with_the_stack_token(gateway):
    spec = {"workload": {"kind": "command", "command": ["true"]}}
    with bench_throughput.client_of(gateway) as http, ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda i: bench_throughput._submit(http, spec, i), range(60)))
        assert bench_throughput._listed(http, "queued", 1) == []
    assert ids == [f"true-{i}" for i in range(60)]
    assert len(_Gateway.seen) == 61 and {auth for _, _, auth in _Gateway.seen} == {"Bearer t"}
    assert _Gateway.seen[-1][:2] == ("GET", "/v1/jobs?state=queued&limit=1")
    # 61 requests from 4 threads over at most one connection per thread (a client per request: 61)
    assert _Gateway.connections <= 4
