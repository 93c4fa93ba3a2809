"""The training process's part of its job's trace (used by ``sdk.py``).

The agent starts the process with ``TRACEPARENT`` (the W3C context of its own run span) and, when the agent
exports spans, the same ``OTEL_*`` endpoint or exporter choice. On the SDK's first use the process opens one span,
``training process``, under that context (so the trace runs on from the executor into the script), notes each
reported checkpoint on it as an event, and ends it at exit, when it is exported. Without ``TRACEPARENT``, or with
nothing configured to export to, or without OpenTelemetry importable, nothing happens and nothing is imported.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

_state: dict[str, Any] = {"started": False, "span": None}


def trace_parent() -> str | None:
    """The W3C ``traceparent`` this process runs under (None outside a traced run)."""
    return os.environ.get("TRACEPARENT") or None


def start() -> None:
    """Open the process's span once (cheap on every later call)."""
    if _state["started"]:
        return
    _state["started"] = True
    parent = trace_parent()
    if parent is None:
        return
    try:
        from opentelemetry import propagate

        from libs.runtime import tracing
    except ImportError:  # the script's python has no OpenTelemetry: it still runs, untraced
        return
    if not tracing.setup("training"):
        return
    headers = {"traceparent": parent, **({"tracestate": os.environ["TRACESTATE"]} if os.environ.get("TRACESTATE")
                                         else {})}
    attributes = {f"teto.{k.removeprefix('TETO_').lower()}": os.environ[k]
                  for k in ("TETO_JOB_ID", "TETO_EPOCH", "TETO_RANK", "TETO_EXECUTOR_ID") if os.environ.get(k)}
    _state["span"] = tracing.tracer().start_span("training process", context=propagate.extract(headers),
                                                 attributes=attributes)
    atexit.register(end)  # registered after the provider's own exit hook: runs first, so the span is exported


def event(name: str, **attributes: Any) -> None:
    span = _state["span"]
    if span is not None:
        span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


def end() -> None:
    span, _state["span"] = _state["span"], None
    if span is not None:
        span.end()
