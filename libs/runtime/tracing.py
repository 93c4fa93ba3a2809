"""OpenTelemetry tracing for every Teto part: one trace follows a command from the HTTP request through the bus,
the queue's transaction, the grant, the executor and the training process to the job events.

Context crosses the bus in the W3C ``traceparent`` header of each NATS message (``bus.publish`` and the outbox
inject it; ``libs/runtime/edge.py`` reads it back onto each decoded message, ``continued`` opens the consumer's
span under it), crosses PostgreSQL where a job waits for placement (the queue stores the submit's context with
the job), and reaches the training process as ``TRACEPARENT`` in its environment (the SDK continues it).

Export is configured only by the standard variables: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) sends spans over OTLP/HTTP; ``OTEL_TRACES_EXPORTER=console`` prints them;
with neither, nothing is installed and every call here costs next to nothing. A tracer provider installed before
``setup`` (a test's in-memory exporter) is kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

log = logging.getLogger(__name__)

TRACER = "teto"
# The W3C headers of a trace context (all a message or a process needs to continue it).
TRACE_HEADERS = ("traceparent", "tracestate")
# What a training process inherits of the agent's OpenTelemetry configuration (never the exporter's headers,
# which may carry a collector's credentials: a job is someone else's code).
CHILD_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                   "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")


def exporters(env: Mapping[str, str]) -> tuple[str, ...]:
    """The exporters the standard variables ask for: ``otlp`` when an endpoint is set (and the exporter list
    allows it), ``console`` when listed; none when the SDK is disabled or nothing is configured."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    listed = [e.strip().lower() for e in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if e.strip()]
    chosen = []
    if "otlp" in listed and (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        chosen.append("otlp")
    if "console" in listed:
        chosen.append("console")
    return tuple(chosen)


def service_name(part: str, env: Mapping[str, str]) -> str:
    return env.get("OTEL_SERVICE_NAME") or f"teto-{part}"


def setup(part: str, env: Mapping[str, str] | None = None) -> bool:
    """Install a tracer provider exporting as the environment says; False when none was installed (nothing
    configured, or a provider is already there). Idempotent: a process sets it up once."""
    env = os.environ if env is None else env
    chosen = exporters(env)
    if not chosen or installed():
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name(part, env)}))
    if "otlp" in chosen:
        if env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") != "http/protobuf":
            log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: Teto exports over OTLP/HTTP (http/protobuf) only",
                        env["OTEL_EXPORTER_OTLP_PROTOCOL"])
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if "console" in chosen:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing: %s exporting spans as %s", ", ".join(chosen), service_name(part, env))
    return True


def installed() -> bool:
    """A real (SDK) provider is in place already, not the API's default proxy."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


def carrier() -> dict[str, str]:
    """The current context as W3C headers (empty outside any span)."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


def traceparent() -> str | None:
    return carrier().get("traceparent")


def trace_of(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """Only the trace-context headers of a message's headers (what ``continued`` needs)."""
    return {k: str(v) for k, v in (headers or {}).items() if k.lower() in TRACE_HEADERS}


def recording() -> bool:
    """A span is being recorded now (so a child span is worth making)."""
    return trace.get_current_span().is_recording()


@contextlib.contextmanager
def attached(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Make ``headers``' context the current one for the block (no span of its own)."""
    if not headers:
        yield
        return
    token = otel_context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def continued(headers: Mapping[str, str] | None, name: str, *, kind: SpanKind = SpanKind.CONSUMER,
              new_trace: bool = True, **attributes: Any) -> Iterator[Span | None]:
    """A span continuing the trace ``headers`` carry; errors mark it failed. Without a context in ``headers`` it
    is a child of the current span (a new trace outside any), or with ``new_trace=False`` no span at all (a report
    from an untraced run)."""
    if not headers and not new_trace:
        yield None
        return
    parent = propagate.extract(dict(headers)) if headers else otel_context.get_current()
    with tracer().start_as_current_span(name, context=parent, kind=kind, attributes=_clean(attributes),
                                        record_exception=True, set_status_on_exception=True) as span:
        yield span


@contextlib.contextmanager
def child(name: str, *, kind: SpanKind = SpanKind.INTERNAL, **attributes: Any) -> Iterator[Span | None]:
    """A child span of the current one, only when one is being recorded (never a trace of its own: a heartbeat
    or a periodic pass outside any trace adds nothing)."""
    if not recording():
        yield None
        return
    with tracer().start_as_current_span(name, kind=kind, attributes=_clean(attributes)) as span:
        yield span


def fail(span: Span | None, reason: str) -> None:
    if span is not None:
        span.set_status(Status(StatusCode.ERROR, reason))


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes named ``teto.<name>`` (dotted keys pass as given), without empty values."""
    return {(k if "." in k else f"teto.{k}"): v for k, v in attributes.items() if v is not None}


# -- envelopes carry the context they arrived with ------------------------------------------------------------

def arrived(item: Any, headers: Mapping[str, Any] | None) -> None:
    """Note on a decoded message the trace context its NATS headers carried (the edge does this for every
    consumer), so a handler that applies a batch one message at a time continues each message's own trace."""
    if not headers or "traceparent" not in headers:  # the propagator writes it lower-case; most messages lack it
        return
    setter = getattr(item, "note_trace", None)
    if setter is not None:
        setter(trace_of(headers))


def of(item: Any) -> dict[str, str]:
    """The trace context a decoded message arrived with (empty when it carried none)."""
    return dict(getattr(item, "received_trace", None) or {})
