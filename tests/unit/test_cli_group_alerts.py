"""`teto nodes` shows a group's systemic-failure alert first, `teto nodes --groups` has an alert column, and
`teto clear-alert GROUP` posts the clear to the gateway."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.unit
ALERT = {"reason": "systemic failure: replacement budget spent (1 of 1 in 3600s); node-b failed matmul",
         "since": "2026-01-01T00:00:00+00:00", "tests": ["matmul"], "nodes": ["node-a", "node-b"]}


def test_nodes_show_the_alert_and_clear_alert_posts_the_command(monkeypatch, capsys):
    from teto import cli_http
    from teto.cli import main

    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/nodes":
            return httpx.Response(200, json=[
                {"node_id": "node-b", "group_name": "g", "state": "failed", "schedulable": False, "alert": ALERT},
                {"node_id": "node-c", "group_name": "g", "state": "ready", "schedulable": False, "alert": ALERT},
                {"node_id": "node-x", "group_name": "h", "state": "ready", "schedulable": True, "alert": None}])
        if request.url.path == "/v1/node-groups":
            return httpx.Response(200, json=[{"group_name": "g", "nodes": 2, "schedulable": 0, "alert": ALERT}])
        return httpx.Response(200, json={"command_id": "c1", "group": "g", "released": ["node-b", "node-c"]})

    monkeypatch.setattr(cli_http, "TRANSPORT", httpx.MockTransport(handler))
    base = ["--url", "http://gw", "--token", "t"]
    assert main(["nodes", *base]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ALERT group g since 2026-01-01") and "replacement budget spent" in lines[0]
    assert "teto clear-alert g" in lines[0] and sum("ALERT" in line for line in lines) == 1
    assert main(["nodes", "--groups", *base]) == 0
    assert "systemic failure" in capsys.readouterr().out
    assert main(["clear-alert", "g", "--reason", "driver rolled back", *base]) == 0
    assert "released node-b, node-c" in capsys.readouterr().out
    post = seen[-1]
    assert (post.method, post.url.path) == ("POST", "/v1/node-groups/g/clear-alert")
    assert json.loads(post.content) == {"reason": "driver rolled back"}
