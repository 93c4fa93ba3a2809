"""One OpenTelemetry trace follows a submitted command on real NATS and PostgreSQL: the gateway's HTTP request, the
command on the bus, the queue's handler and transaction, the grant (a later placement pass that continues the
job's trace from PostgreSQL), the executor's run, the training process (``TRACEPARENT`` in its environment, its
own span exported by the SDK) and the job events (their NATS headers carry the trace).

The queue, the gateway and the executor agent run in this process, so one in-memory exporter sees their spans;
the training process is another process, which exports its span to its log through the standard
``OTEL_TRACES_EXPORTER=console``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from opentelemetry.trace import SpanKind

from agents.executor.main import serve as agent_serve
from agents.executor.settings import ExecutorSettings
from libs.runtime.service import Runtime
from services.gateway import auth
from services.gateway.api import create_app
from services.gateway.settings import GatewaySettings
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import client, queue_service
from tests.support.services import eventually, running
from tests.support.spans import kept_spans

pytestmark = pytest.mark.integration

SCRIPT = """
from teto import sdk
sdk.report_step(1, total_steps=1)
print("TRACEPARENT=" + (sdk.trace_parent() or ""), flush=True)
"""


@pytest.fixture(scope="module")
def spans():
    with kept_spans() as exporter:
        yield exporter


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


async def test_one_trace_spans_gateway_queue_grant_executor_training_and_job_events(env, spans, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # what the training process inherits (tracing.CHILD_VARIABLES)
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.1, scan_interval_seconds=0.2,
                      require_checked_nodes=False)
    es = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", torch_threads=1)
    gs = env.settings(GatewaySettings, command_timeout_seconds=20.0)
    script = tmp_path / "traced.py"
    script.write_text(SCRIPT)
    script.chmod(0o644)
    async with queue_service(qs), client(qs) as c, running(agent_serve, es):
        events: list = []

        async def on_event(msg) -> None:
            events.append((msg.subject, dict(msg.headers or {})))

        sub = await c.nc.subscribe(qs.subjects.job_all, cb=on_event)
        rt = await Runtime.open("gateway", gs, schema="gateway", package="services.gateway")
        try:
            token = auth.create_token(gs.effective_tokens_file, "ops", auth.Role.OPERATOR)
            app = create_app(gs, rt)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
                resp = await http.post("/v1/jobs", headers={"Authorization": f"Bearer {token}"}, json={
                    "name": "traced", "workload": {"kind": "command", "command": [sys.executable, str(script)]}})
                assert resp.status_code == 201, resp.text
                job_id = resp.json()["id"]
                await c.wait_state(job_id, "succeeded", timeout=120)
                await eventually(lambda: any(e[0].endswith(".succeeded") for e in events), 20, "the succeeded event")
        finally:
            await sub.unsubscribe()
            await rt.close()

    finished = spans.get_finished_spans()
    (request,) = [s for s in finished if s.kind is SpanKind.SERVER and s.name == "POST /v1/jobs"]
    trace_id = request.context.trace_id
    ours = {s.context.span_id: s for s in finished if s.context.trace_id == trace_id}
    names = {s.name for s in ours.values()}
    assert {"POST /v1/jobs", "queue submit", "queue transaction", "queue grant", "executor run",
            "queue progress finished"} <= names, sorted(names)

    def by_name(name: str):
        return [s for s in ours.values() if s.name == name]

    def ancestors(span) -> list[str]:
        chain = []
        while span.parent is not None and span.parent.span_id in ours:
            span = ours[span.parent.span_id]
            chain.append(span.name)
        return chain

    def descends(name: str, *from_: str) -> bool:  # some span of that name (a redelivery may make a second)
        return any(set(from_) <= set(ancestors(s)) for s in by_name(name))

    # The command's handling descends from the HTTP request (through the publish of the command) ...
    assert descends("queue submit", "POST /v1/jobs", "publish cmd")
    (publish,) = [s for s in by_name("publish cmd") if "POST /v1/jobs" in ancestors(s)]
    assert publish.attributes["messaging.destination.name"] == qs.subjects.cmd("submit")
    assert any(ancestors(t)[:1] == ["queue submit"] for t in by_name("queue transaction"))
    # ... the grant, in a placement pass of its own, continues the submit's trace ...
    (grant,) = by_name("queue grant")
    assert grant.attributes["teto.job_id"] == job_id and "queue transaction" in ancestors(grant)
    # ... the executor's run continues the grant, and the run's reports lead to the job's last transition.
    (run,) = by_name("executor run")
    assert "queue grant" in ancestors(run)
    assert descends("queue progress finished", "executor run", "queue grant", "POST /v1/jobs")

    # The job events carry the trace in their NATS headers (downstream consumers can continue it).
    succeeded = [headers for subject, headers in events if subject.endswith(f"{job_id}.succeeded")]
    assert succeeded and succeeded[0]["traceparent"].split("-")[1] == _hex(trace_id, 32)

    # The training process ran under TRACEPARENT from the executor's run span and exported its own span under it.
    (log_file,) = Path(es.effective_work_dir).glob(f"jobs/{job_id}/epoch-*.log")
    text = log_file.read_text()
    assert f"TRACEPARENT=00-{_hex(trace_id, 32)}-{_hex(run.context.span_id, 16)}-" in text  # then the flags
    process = _exported_span(text, "training process")
    assert process["context"]["trace_id"] == f"0x{_hex(trace_id, 32)}"
    assert process["parent_id"] == f"0x{_hex(run.context.span_id, 16)}"
    assert process["attributes"]["teto.job_id"] == job_id


def _exported_span(text: str, name: str) -> dict:
    """A span the console exporter printed (pretty JSON objects, one after another) among the script's output."""
    decoder = json.JSONDecoder()
    at = 0
    while (at := text.find("{", at)) != -1:
        with contextlib.suppress(ValueError):
            value, end = decoder.raw_decode(text, at)
            if isinstance(value, dict) and value.get("name") == name:
                return value
            at = end
            continue
        at += 1
    raise AssertionError(f"no exported span {name!r} in the process's log:\n{text[-3000:]}")
