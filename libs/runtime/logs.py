"""Log lines as text (the default) or as one JSON object a line (TETO_LOG_FORMAT=json), carrying the job,
executor, command and trace a line is about.

Those four come from context variables, set where a message is handled (the edge binds the ids a batch's
messages share, and the trace in their ``traceparent`` header; the executor binds its own id, and the job while it
runs one), so code that logs never passes them by hand. A field unknown in the context is left out.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

FIELDS = ("job_id", "executor_id", "command_id", "trace_id")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("teto_log_context", default={})


def current() -> dict[str, str]:
    """The fields bound here, plus the trace id of the current OpenTelemetry span when there is one."""
    out = dict(_context.get())
    if "trace_id" not in out:
        trace = _span_trace_id()
        if trace:
            out["trace_id"] = trace
    return out


def _span_trace_id() -> str | None:
    ctx = _current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def _current_span() -> Any:
    global _current_span  # noqa: PLW0603 - imported once, on the first line logged, then called directly
    from opentelemetry.trace import get_current_span

    _current_span = get_current_span
    return get_current_span()


def bind_here(**fields: str | None) -> None:
    """Bind fields for the rest of this task (and the tasks it starts); None values are ignored."""
    _context.set({**_context.get(), **{k: str(v) for k, v in fields.items() if v is not None and k in FIELDS}})


@contextlib.contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Bind fields for the duration of a block."""
    token = _context.set({**_context.get(), **{k: str(v) for k, v in fields.items() if v is not None
                                               and k in FIELDS}})
    try:
        yield
    finally:
        _context.reset(token)


def trace_id_of(headers: Mapping[str, str] | None) -> str | None:
    """The trace id of a W3C ``traceparent`` header (``00-<trace>-<span>-<flags>``), if well formed."""
    value = (headers or {}).get("traceparent") or ""
    parts = value.split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1]
    return None


def shared_fields(items: Sequence[Any], headers: Sequence[Mapping[str, str] | None] = ()) -> dict[str, str]:
    """The ids every message of a batch has in common (a batch of one: its own), and their common trace id."""
    out: dict[str, str] = {}
    if not items:
        return out
    # all() stops at the first message that differs: a batch from many senders costs a message or two.
    for name in ("job_id", "executor_id", "command_id"):
        first = getattr(items[0], name, None)
        if first is not None and all(getattr(item, name, None) == first for item in items):
            out[name] = str(first)
    trace = trace_id_of(headers[0]) if headers else None
    if trace is not None and all(trace_id_of(h) == trace for h in headers):
        out["trace_id"] = trace
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the context fields, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        line.update(current())
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        text = orjson.dumps(line, default=str).decode()
        # One line to every reader: orjson escapes the controls below U+0020, not these three, which
        # str.splitlines (and so many a log reader) takes for line ends.
        if "\x85" in text or "\u2028" in text or "\u2029" in text:
            text = text.replace("\x85", "\\u0085").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
        return text


def configure(level: str = "INFO", fmt: str | None = None) -> None:
    """Configure the root logger of a part: ``fmt`` (default TETO_LOG_FORMAT, else text)."""
    fmt = (fmt or os.environ.get("TETO_LOG_FORMAT") or "text").lower()
    if fmt not in FORMATS:
        raise ValueError(f"TETO_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # Where each line was logged from (a walk up the caller's stack), its thread and its process: no line Teto
    # writes shows them, and they were about 40 % of what a line cost (13-15 -> 7-11 us a line on the build
    # machine, text or JSON; a placement pass logs one a grant). The logging HOWTO's "Optimization" switches.
    logging._srcfile = None  # noqa: SLF001 - the documented way to skip the caller's lookup
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.logAsyncioTasks = False  # Python 3.12 and later; nothing on 3.11
