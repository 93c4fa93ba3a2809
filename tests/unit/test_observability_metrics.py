"""The metrics catalogue and its endpoint (libs/runtime/metrics.py), the edge's counters, the gateway's route
timer and the ports ``teto up`` hands out: every sample carries the process's instance, the edge counts each
outcome once per message, routes are timed by template, never by raw path."""

from __future__ import annotations

import json
from pathlib import Path
import logging
import socket

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from libs.contracts.nodes import CheckStatus, CheckTest
from libs.contracts.subjects import Subjects
from libs.runtime import metrics
from libs.runtime.edge import Consumer
from libs.runtime.edge_loop import ConsumerLoop
from libs.runtime.observe import instance_name, singleton_label
from services.gateway.limits import JsonBodies
from services.gateway.timing import RouteTimer
from services.health.domain.observed import results_of
from teto.stack.observe import MetricsPorts
from tests.support import builders
from tests.unit.test_edge_rules import FakeMsg, FakeReporter, decode

pytestmark = pytest.mark.unit


def samples(registry) -> list:
    text = generate_latest(registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_every_exported_sample_carries_the_instance_label():
    metrics.GRANTS.inc()
    found = samples(metrics.exposed("host-a:42"))
    assert found and all(s.labels.get("instance") == "host-a:42" for s in found)
    assert any(s.name == "teto_lease_grants_total" for s in found)


def test_series_names_lists_what_a_query_may_name_even_before_any_sample():
    names = metrics.series_names()
    assert {"teto_jobs", "teto_gpu_seconds_charged_total", "teto_placement_latency_seconds_bucket",
            "teto_placement_latency_seconds_count", "teto_http_request_duration_seconds_sum",
            "teto_consumer_pending_messages", "teto_dead_letters_total", "teto_check_figure"} <= names
    assert "teto_jobs_total" not in names  # a gauge has no _total


def test_the_endpoint_is_off_on_port_zero():
    assert metrics.Endpoint.start(0) is None


def test_a_port_another_process_holds_does_not_stop_the_process_the_endpoint_binds_once_it_is_free(caplog):
    class Probe(metrics.Endpoint):  # a fresh endpoint: the class's state is the process's
        retry_seconds = 0.05

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with caplog.at_level(logging.ERROR, logger="libs.runtime.metrics"):
            assert Probe.start(port, instance="probe") is None  # no exception: the service runs on
        assert Probe.port is None and Probe.error.startswith(f"port {port} on 127.0.0.1: ")
        assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
        assert Probe.start(port) is None and Probe._retrying is not None  # asked again: still one retrying thread
    finally:
        holder.close()
    Probe._retrying.join(timeout=10)
    try:
        assert Probe.port == port and Probe.error is None
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'instance="probe"' in text
    finally:
        Probe.server.shutdown()


def test_an_endpoint_serves_the_exposed_registry_over_http():
    from prometheus_client import start_http_server

    server, _ = start_http_server(0, addr="127.0.0.1", registry=metrics.exposed("probe"))
    try:
        text = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).text
    finally:
        server.shutdown()
    assert 'teto_lease_grants_total{instance="probe"}' in text


async def test_the_edge_counts_each_outcome_once_per_message():
    reporter = FakeReporter(name="svc-metrics")
    handled = []

    async def handle(items):
        handled.extend(items)

    loop = ConsumerLoop(None, Subjects(), Consumer("teto.hb.*", "HB", "svc-metrics-hb", decode, handle), reporter)
    before = {o: value("teto_edge_messages_total", service="svc-metrics", durable="svc-metrics-hb", stream="HB",
                       outcome=o) for o in ("handled", "malformed")}
    await loop.settle([FakeMsg(b"a"), FakeMsg(b"b"), FakeMsg(b"malformed x")])
    assert value("teto_edge_messages_total", service="svc-metrics", durable="svc-metrics-hb", stream="HB",
                 outcome="handled") == before["handled"] + 2
    assert value("teto_edge_messages_total", service="svc-metrics", durable="svc-metrics-hb", stream="HB",
                 outcome="malformed") == before["malformed"] + 1
    assert loop.counters.handled == 2 and loop.counters.malformed == 1  # the in-process counters agree


def test_routes_are_timed_by_template_and_unmatched_paths_share_one_series():
    app = FastAPI()

    @app.post("/v1/things/{thing_id}")
    async def post_thing(thing_id: str) -> dict:
        return {"id": thing_id}

    app.add_middleware(RouteTimer)
    app.add_middleware(JsonBodies)  # hands on a copy of the scope: the timer must sit inside it
    client = TestClient(app)
    before = value("teto_http_request_duration_seconds_count", route="/v1/things/{thing_id}", method="POST",
                   status="200")
    unmatched = value("teto_http_request_duration_seconds_count", route="unmatched", method="GET", status="404")
    assert client.post("/v1/things/abc", json={}).status_code == 200
    assert client.post("/v1/things/def", json={}).status_code == 200
    assert client.get("/nothing/here").status_code == 404
    assert value("teto_http_request_duration_seconds_count", route="/v1/things/{thing_id}", method="POST",
                 status="200") == before + 2
    assert value("teto_http_request_duration_seconds_count", route="unmatched", method="GET",
                 status="404") == unmatched + 1
    assert value("teto_http_request_duration_seconds_count", route="/v1/things/abc", method="POST",
                 status="200") == 0


def test_check_results_are_reports_of_a_test_that_ended_with_their_figures():
    def report(status, test=CheckTest.MATMUL, **figures):
        return builders.check_report(status, test, figures=figures)

    out = results_of([report(CheckStatus.RUNNING), report(CheckStatus.PASSED, gflops=12.5, err=0.0),
                      report(CheckStatus.FAILED, test=None), report("busy", test=None),
                      report(CheckStatus.NOT_APPLICABLE, test=CheckTest.NVML)])
    assert [(r.node_id, r.test, r.status) for r in out] == [("n1", "matmul", "passed"),
                                                           ("n1", "nvml", "not_applicable")]
    assert out[0].figures == (("err", 0.0), ("gflops", 12.5))


def test_replicas_of_one_service_in_one_process_get_distinct_instance_names():
    first, second = instance_name("svc-names", "host:1"), instance_name("svc-names", "host:1")
    assert first == "host:1" and second == "host:1/2"
    assert instance_name("svc-other", "host:1") == "host:1"
    assert singleton_label("teto:queue-placement") == "queue-placement"


def test_teto_up_gives_each_process_its_own_port_kept_across_restarts(tmp_path):
    ports = MetricsPorts(tmp_path, environ={})
    queue = ports.env("queue", {"A": "1"})
    assert queue["A"] == "1" and int(queue["TETO_METRICS_PORT"]) > 0
    assert ports.env("queue", {})["TETO_METRICS_PORT"] == queue["TETO_METRICS_PORT"]
    assert ports.env("executor-1", {})["TETO_METRICS_PORT"] != queue["TETO_METRICS_PORT"]
    listed = json.loads((tmp_path / "metrics.json").read_text())
    # Below the ephemeral range: no outgoing connection can be handed the port before the part binds it.
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(int(url.rsplit(":", 1)[1].split("/")[0]) < low for url in listed.values()), listed
    assert listed["queue"] == f"http://127.0.0.1:{queue['TETO_METRICS_PORT']}/metrics" and "executor-1" in listed


def test_a_metrics_port_is_never_one_the_gateway_will_bind(tmp_path, monkeypatch):
    # The gateway binds its --http-port after the first parts are given their metrics ports: free then, it must
    # not be handed out (seen as a restarted stack's gateway URL answering with a /metrics page).
    offered = iter([8080, 8081, 8080, 9000, 9001])
    monkeypatch.setattr("teto.stack.observe.free_port", lambda: next(offered))
    ports = MetricsPorts(tmp_path, environ={}, reserved=[8080, 8081])
    assert ports.env("queue", {})["TETO_METRICS_PORT"] == "9000"
    assert ports.env("budget", {})["TETO_METRICS_PORT"] == "9001"


def test_metrics_port_zero_turns_every_endpoint_off(tmp_path):
    ports = MetricsPorts(tmp_path, environ={"TETO_METRICS_PORT": "0"})
    assert ports.env("queue", {})["TETO_METRICS_PORT"] == "0"
    assert "off" in ports.summary() and not (tmp_path / "metrics.json").exists()
