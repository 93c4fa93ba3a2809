"""The pure parts of tracing (libs/runtime/tracing.py): which exporter the standard variables choose, what a run's
environment gets to continue the trace, how a message keeps the context it arrived with, and the span helpers'
rules (no stray root traces for untraced reports; errors mark a span failed)."""

from __future__ import annotations

import pytest
from opentelemetry.trace import StatusCode

from agents.executor.launch import trace_env
from libs.contracts.envelope import RejectedMessage
from libs.runtime import tracing
from tests.support.spans import kept_spans

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("env,chosen", [
    ({}, ()),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ("otlp",)),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ()),  # OTLP only when an endpoint is set
    ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
    ({"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ("otlp", "console")),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ()),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ()),
], ids=["nothing", "endpoint", "traces-endpoint", "otlp-without-endpoint", "console", "both", "none", "disabled"])
def test_exporters_follow_the_standard_variables(env, chosen):
    assert tracing.exporters(env) == chosen


def test_service_name_is_the_standard_variable_or_the_part():
    assert tracing.service_name("queue", {}) == "teto-queue"
    assert tracing.service_name("queue", {"OTEL_SERVICE_NAME": "q-east"}) == "q-east"


def test_setup_installs_nothing_when_nothing_is_configured():
    assert tracing.setup("queue", {}) is False


def test_a_run_gets_traceparent_and_the_exporter_choice_but_never_the_exporter_headers():
    agent = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_HEADERS": "authorization=s3cret",
             "OTEL_SERVICE_NAME": "teto-executor", "TETO_NATS_URL": "nats://x"}
    env = trace_env(agent, {"traceparent": PARENT, "tracestate": "k=v"})
    assert env == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "TRACEPARENT": PARENT,
                   "TRACESTATE": "k=v", "OTEL_SERVICE_NAME": "teto-training"}
    assert trace_env(agent, {}) == {}  # an untraced run is told nothing


def test_trace_of_keeps_only_the_w3c_headers():
    headers = {"traceparent": PARENT, "Nats-Msg-Id": "m1", "tracestate": "k=v", "baggage": "user=x"}
    assert tracing.trace_of(headers) == {"traceparent": PARENT, "tracestate": "k=v"}
    assert tracing.trace_of(None) == {}


def test_a_message_keeps_the_context_it_arrived_with_outside_its_contract():
    msg = RejectedMessage(service="queue", subject="s", reason="r", payload_excerpt="", payload_bytes=0)
    tracing.arrived(msg, {"traceparent": PARENT, "Nats-Msg-Id": msg.id})
    assert tracing.of(msg) == {"traceparent": PARENT}
    again = RejectedMessage.decode(msg.encode())
    assert b"traceparent" not in msg.encode() and tracing.of(again) == {}
    assert again == msg  # equal by the contract's fields, however each travelled
    assert tracing.of(object()) == {}  # a reader's own value without the envelope: nothing


@pytest.fixture(scope="module")
def exporter():
    with kept_spans() as memory:
        yield memory


def test_continued_joins_the_senders_trace(exporter):
    exporter.clear()
    with tracing.continued({"traceparent": PARENT}, "queue submit", command_id="c1") as span:
        assert tracing.traceparent().split("-")[1] == PARENT.split("-")[1]
    (done,) = exporter.get_finished_spans()
    assert done.parent.span_id == int("b7ad6b7169203331", 16) and done.attributes["teto.command_id"] == "c1"
    assert span is not None


def test_an_untraced_report_makes_no_trace_of_its_own(exporter):
    exporter.clear()
    with tracing.continued({}, "queue progress step", new_trace=False) as span:
        assert span is None and tracing.carrier() == {}
    with tracing.child("publish x") as child:  # nothing being recorded: no span either
        assert child is None
    assert exporter.get_finished_spans() == ()


def test_a_failure_marks_the_span_failed(exporter):
    exporter.clear()
    with pytest.raises(RuntimeError), tracing.continued({"traceparent": PARENT}, "queue cancel"):
        raise RuntimeError("database away")
    (done,) = exporter.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR


def test_attached_makes_a_context_current_for_a_block_only():
    with tracing.attached({"traceparent": PARENT}):
        assert tracing.traceparent().split("-")[1:3] == PARENT.split("-")[1:3]
    assert tracing.carrier() == {}


class _RecordingJetStream:
    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    async def publish(self, subject, data, headers=None, timeout=None):  # noqa: ANN001 - nats-py's signature
        self.headers.append(dict(headers or {}))


async def test_the_agents_queued_reports_carry_the_senders_trace_though_another_task_publishes_them():
    import asyncio

    from agents.executor.publisher import Publisher
    from libs.contracts.telemetry import RunFinished, RunOutcome

    js = _RecordingJetStream()
    pub = Publisher(js, timeout=1.0, retry_seconds=0.01)
    task = asyncio.create_task(pub.run())  # started outside any trace
    try:
        finished = RunFinished(job_id="j1", epoch=1, executor_id="ex-1", outcome=RunOutcome.SUCCEEDED, exit_code=0)
        with tracing.attached({"traceparent": PARENT}):
            traced = pub.send("p.j1", finished)
        untraced = pub.send("p.j1", finished)
        assert await asyncio.wait_for(asyncio.gather(traced, untraced), 5) == [True, True]
    finally:
        task.cancel()
    assert js.headers[0]["traceparent"].split("-")[1] == PARENT.split("-")[1]
    assert "traceparent" not in js.headers[1]
